"""Codes KVC-S…: see kvcanary_numba.scatter."""

from __future__ import annotations

from .registry import define  # noqa: F401
