"""Codes KVC-S…: expected-token scatter (scatter_req_token_ids).

The other checks of the scatter are the shared array checks (KVC-C002 dtype,
KVC-C003 ndim, KVC-C006, KVC-C007, KVC-C013). Bad values inside the arrays
(rows outside the pool, inverted or out-of-range offsets) are data, not errors:
the scatter skips them.
"""

from __future__ import annotations

from .registry import define

define(
    "KVC-S001",
    title="Token offsets are not bs + 1 long",
    message=(
        "{function}: {argument} must have len(req_pool_indices) + 1 = {expected} entries "
        "(an exclusive prefix sum with a leading 0), got {got}"
    ),
    meaning=(
        "The verify-token check compares stored tokens with a pool of every request's tokens; "
        "scatter_req_token_ids fills that pool from one flat array of all requests' tokens "
        "(prompt + output so far). offsets says where each request's tokens are: request r owns "
        "flat_in[offsets[r]:offsets[r + 1]] and goes to pool row req_pool_indices[r]. The last "
        "request needs its end too, so offsets has one entry more than there are requests, "
        "starting with 0."
    ),
    triggers=(
        "Passing the per-request lengths instead of their prefix sum.",
        "Building offsets with numpy.cumsum(lengths) and forgetting the leading 0.",
        "Slicing req_pool_indices to the live batch but passing offsets for the padded batch.",
    ),
    solutions=(
        "Build offsets as numpy.concatenate([[0], numpy.cumsum(lengths)]).astype(numpy.int64).",
        "Slice offsets to [:bs + 1] together with req_pool_indices[:bs].",
    ),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "pool = np.zeros((2, 8), np.int32)  # expected tokens per request row\n"
        "flat, lengths = np.array([5, 6, 7, 8]), np.array([4])  # request row 1: 4 tokens\n"
        "kc.scatter_req_token_ids(flat_in=flat, offsets=np.cumsum(lengths),  # [4]: no leading 0\n"
        "                         req_pool_indices=np.array([1]), pool_out=pool)"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "pool = np.zeros((2, 8), np.int32)  # expected tokens per request row\n"
        "flat, lengths = np.array([5, 6, 7, 8]), np.array([4])  # request row 1: 4 tokens\n"
        "offsets = np.concatenate([[0], np.cumsum(lengths)])  # [0, 4]: bs + 1 entries\n"
        "kc.scatter_req_token_ids(flat_in=flat, offsets=offsets,\n"
        "                         req_pool_indices=np.array([1]), pool_out=pool)"
    ),
    defensive=(
        "offsets = np.zeros(len(rows) + 1, dtype=np.int64)\n"
        "np.cumsum(lengths, out=offsets[1:])  # leading 0 by construction"
    ),
    prevention=(
        "Keep token snapshots as (flat, offsets) pairs built by one helper, and derive the batch "
        "size from req_pool_indices only."
    ),
    related=("KVC-C004", "KVC-P006"),
    sglang=("kv-canary: scatter_req_token_ids offsets length {len} != bs+1 ({bs+1})",),
)
