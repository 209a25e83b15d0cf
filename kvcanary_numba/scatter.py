"""Public scatter_req_token_ids: fill the expected-token pool from flat per-request tokens.

The verify-token check of the plan reads expected tokens from a pool
``[rows, max_context_len]`` int32, one row per request-pool row. Engines keep each
request's tokens (prompt + output so far) as one flat list; this launch copies
request ``r``'s tokens ``flat_in[offsets[r]:offsets[r + 1]]`` into row
``req_pool_indices[r]``, truncated at the pool width. Semantics and bounds rules:
:mod:`kvcanary_numba.reference.scatter`; kernel: :mod:`kvcanary_numba.kernels.scatter`.

:func:`validate` checks, :func:`run` dispatches with one explicit ``if``; the package's top
level exports the same function wrapped by the fast wing (``kvcanary_numba/fast/calls.py``).
"""

from __future__ import annotations

import numpy as np

from . import _overlap
from ._runtime import CUDA_IMPORTS
from ._validate import as_native, check_array, resolve_backend, stream_handle
from .errors import error
from .reference import scatter as reference

__all__ = ["run", "scatter_req_token_ids", "validate"]

FUNCTION = "scatter_req_token_ids"


def validate(*, flat_in, offsets, req_pool_indices, pool_out, backend: str = "auto") -> tuple[str, list]:
    """Every check of a scatter call; returns (backend, every array as (name, ArrayInfo))."""
    function = FUNCTION
    rows = check_array(function, "req_pool_indices", req_pool_indices, dtype=np.int64, ndim=1)
    ranges = check_array(function, "offsets", offsets, dtype=np.int64, ndim=1)
    if ranges.shape[0] != rows.shape[0] + 1:
        raise error("KVC-S001", function=function, argument="offsets", expected=rows.shape[0] + 1, got=ranges.shape[0])
    infos = [
        ("req_pool_indices", rows),
        ("offsets", ranges),
        ("flat_in", check_array(function, "flat_in", flat_in, dtype=np.int64, ndim=1)),
        ("pool_out", check_array(function, "pool_out", pool_out, dtype=np.int32, ndim=2, writeable=True)),
    ]
    chosen = resolve_backend(function, backend, infos)
    _overlap.check(function, infos)
    return chosen, infos


def run(backend: str, *, flat_in, offsets, req_pool_indices, pool_out, stream=None) -> None:
    """Run a validated scatter call on ``backend``; ``stream`` is a CUDA stream handle or None."""
    if backend == "numpy":
        reference.scatter_req_token_ids(
            flat_in=flat_in, offsets=offsets, req_pool_indices=req_pool_indices, pool_out=pool_out
        )
    else:
        with CUDA_IMPORTS:  # needs numba-cuda: imported on the kernel path only, one thread at a time
            from .launch import scatter as glue

        glue.scatter_req_token_ids(
            flat_in=flat_in, offsets=offsets, req_pool_indices=req_pool_indices, pool_out=pool_out, stream=stream
        )


def scatter_req_token_ids(*, flat_in, offsets, req_pool_indices, pool_out, backend: str = "auto", stream=None) -> None:
    """Copy each request's flat tokens into its pool row (int32), in place.

    Parameters
    ----------
    flat_in : int64 [num_tokens]
        All requests' tokens, concatenated.
    offsets : int64 [bs + 1]
        Request ``r`` owns ``flat_in[offsets[r]:offsets[r + 1]]`` (exclusive
        prefix sum with a leading 0). Inverted ranges are empty; flat indices
        outside ``[0, num_tokens)`` are not read and their columns stay untouched.
    req_pool_indices : int64 [bs]
        Destination row of each request; rows outside ``[0, rows)`` are skipped.
    pool_out : int32 [rows, max_context_len]
        Expected-token pool; columns ``[0, min(len_r, max_context_len))`` of each
        addressed row are overwritten (tokens cast to int32), everything else is
        left as it was.
    backend : {"auto", "numpy", "cuda"}
        ``"auto"`` follows the arrays.
    stream : CUDA stream, int handle or None
        Where the kernel is queued (None: CuPy's current stream; KVC-C016).

    Raises
    ------
    KvCanaryError
        KVC-S001 (``offsets`` length != bs + 1); KVC-C001 (not an array),
        KVC-C002 (dtype), KVC-C003 (ndim), KVC-C006 (not contiguous), KVC-C007
        (mixed devices), KVC-C008 / KVC-C009 (backend), KVC-C013 (read-only pool),
        KVC-C017 (``pool_out`` sharing memory with another argument).
    """
    handle = stream_handle(FUNCTION, stream)
    kwargs = as_native(
        FUNCTION, dict(flat_in=flat_in, offsets=offsets, req_pool_indices=req_pool_indices, pool_out=pool_out)
    )
    chosen, _ = validate(**kwargs, backend=backend)
    run(chosen, **kwargs, stream=handle)
