"""Codes KVC-S…: none so far.

Every check of :func:`kvcanary_numba.scatter.scatter_req_token_ids` is an array
check shared with the other operations (KVC-C002 dtype, KVC-C003 ndim, KVC-C004
``offsets`` length != bs + 1, KVC-C006, KVC-C007, KVC-C013), whose entries list
SGLang's scatter messages. Bad values inside the arrays (rows outside the pool,
inverted or out-of-range offsets) are data, not errors: the scatter skips them.
"""

from __future__ import annotations

from .registry import define  # noqa: F401
