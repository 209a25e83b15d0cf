"""Codes KVC-W…: see kvcanary_numba.write."""

from __future__ import annotations

from .registry import define  # noqa: F401
