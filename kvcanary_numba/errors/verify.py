"""Codes KVC-V…: see kvcanary_numba.verify."""

from __future__ import annotations

from .registry import define  # noqa: F401
