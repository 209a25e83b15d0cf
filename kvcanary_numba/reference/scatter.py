"""Specification of ``scatter_req_token_ids`` (``kernels/scatter.py``): flat tokens -> pool rows.

The engine keeps each request's expected tokens in a row of an int32 pool
(``req_to_verify_expected_tokens``, read by the plan). Scatter copies a step's
flat per-request token lists into those rows.

For request ``r`` with ``start, end = offsets[r], offsets[r + 1]`` and
``rp = req_pool_indices[r]``: ``n = min(max(end - start, 0), pool_out.shape[1])``
(int64 arithmetic, wrapping on hostile offsets as the kernel's does) and
``pool_out[rp, c] = int32(flat_in[start + c])`` for every ``c < n`` with
``0 <= start + c < len(flat_in)``. Columns whose flat index is outside
``flat_in``, columns from ``n`` on, rows ``rp`` outside ``[0, pool_out.shape[0])``
and rows of no request are left untouched. If two requests name the same row,
which one lands is unspecified (the GPU races; here the later request wins).
See ``docs/concepts/semantics.md`` for the shared rules on hostile values.
"""

from __future__ import annotations

import numpy as np

__all__ = ["scatter_req_token_ids"]


def scatter_req_token_ids(*, flat_in, offsets, req_pool_indices, pool_out) -> None:
    """Scatter in place.

    Parameters
    ----------
    flat_in : int64 [num_tokens]
        The step's tokens, request after request.
    offsets : int64 [bs + 1]
        Request ``r`` owns ``flat_in[offsets[r]:offsets[r + 1]]``.
    req_pool_indices : int64 [bs]
        Pool row of each request.
    pool_out : int32 [pool_rows, pool_width]
        Updated in place.
    """
    rows, width = pool_out.shape
    num_tokens = flat_in.shape[0]
    start = offsets[:-1]
    # Integer array subtraction wraps silently on hostile offsets, as the kernel's int64 does.
    lengths = np.clip(offsets[1:] - start, 0, width)
    lengths[(req_pool_indices < 0) | (req_pool_indices >= rows)] = 0
    total = int(lengths.sum())
    if total == 0:
        return
    # One element per copied column: its request, its column and the flat index it reads.
    owner = np.repeat(np.arange(req_pool_indices.shape[0]), lengths)
    column = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    flat = start[owner] + column
    readable = (flat >= 0) & (flat < num_tokens)
    pool_out[req_pool_indices[owner[readable]], column[readable]] = flat_in[flat[readable]].astype(np.int32)
