"""NumPy reference of scatter_req_token_ids: flat per-request tokens -> expected-token pool rows.

Semantics (SGLang, reference notes §7, plus bounds safety): for request ``r``
with ``start, end = offsets[r], offsets[r + 1]`` and ``rp = req_pool_indices[r]``,
``n = min(max(end - start, 0), pool_out.shape[1])`` (int64 arithmetic) and
``pool_out[rp, c] = int32(flat_in[start + c])`` for every ``c < n`` with
``0 <= start + c < len(flat_in)``. Columns whose flat index is out of range, columns
from ``n`` on, rows ``rp`` outside ``[0, pool_out.shape[0])`` and rows of no
request are left untouched. If two requests name the same row, which one lands
is unspecified (the GPU races; here the later request wins).
"""

from __future__ import annotations

import numpy as np

__all__ = ["scatter_req_token_ids"]


def scatter_req_token_ids(*, flat_in, offsets, req_pool_indices, pool_out) -> None:
    """Scatter in place (see :func:`kvcanary_numba.scatter.scatter_req_token_ids`)."""
    rows, width = pool_out.shape
    num_tokens = flat_in.shape[0]
    start = offsets[:-1]
    # Wrap-around subtraction of hostile offsets is deliberate: the kernels compute the same.
    lengths = np.clip(offsets[1:] - start, 0, width)
    lengths[(req_pool_indices < 0) | (req_pool_indices >= rows)] = 0
    total = int(lengths.sum())
    if total == 0:
        return
    owner = np.repeat(np.arange(req_pool_indices.shape[0]), lengths)
    column = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    flat = start[owner] + column
    readable = (flat >= 0) & (flat < num_tokens)
    pool_out[req_pool_indices[owner[readable]], column[readable]] = flat_in[flat[readable]].astype(np.int32)
