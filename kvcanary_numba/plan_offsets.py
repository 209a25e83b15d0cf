"""The plan offsets operation, and the batch checks both plan operations share.

``launch_plan_offsets_kernel`` is the first step of planning on raw arrays: per request
the verify offsets (how many prefix slots it checks), the write ranges and chain seeds
of its new slots, and the overflow flag. :func:`kvcanary_numba.plan.launch_canary_plan_kernels`
runs it and then fills the plans' entries. Semantics: ``docs/concepts/plans.md``;
executable form in :mod:`kvcanary_numba.reference.plan`, kernels in
:mod:`kvcanary_numba.kernels.plan`, launch glue in :mod:`kvcanary_numba.launch.plan`.

As in every operation module: :func:`validate_offsets` (every check, the backend),
:func:`run_offsets` (one explicit ``if``) and the public function, the two in a row.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _overlap
from ._runtime import CUDA_IMPORTS
from ._validate import as_native, check_array, check_int, resolve_backend, stream_handle
from .errors import error
from .reference import plan as reference

__all__ = [
    "INT32_MAX",
    "INT64_MAX",
    "INT64_MIN",
    "OFFSETS",
    "PLAN",
    "check_batch",
    "check_flag",
    "check_values",
    "check_write_outputs",
    "describe",
    "launch_plan_offsets_kernel",
    "public_call",
    "run_offsets",
    "validate_offsets",
]

OFFSETS, PLAN = "launch_plan_offsets_kernel", "launch_canary_plan_kernels"

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: verify_num_valid is int32, so a capacity must fit in it.
INT32_MAX = 2**31 - 1


def describe(value: Any) -> str:
    return "None" if value is None else f"{type(value).__name__} of shape {tuple(value.shape)}"


def check_batch(
    function,
    *,
    req_pool_indices,
    prefix_lens,
    extend_seq_lens,
    req_to_token,
    full_to_swa_index_mapping,
    swa_window_size,
):
    """The batch checks of both plan operations; returns (bs, window, [(name, ArrayInfo)])."""
    infos = [("req_pool_indices", check_array(function, "req_pool_indices", req_pool_indices, dtype=np.int64, ndim=1))]
    bs = infos[0][1].shape[0]
    for name, array in (("prefix_lens", prefix_lens), ("extend_seq_lens", extend_seq_lens)):
        infos.append((name, check_array(function, name, array, dtype=np.int64, ndim=1, shape=(bs,))))
    infos.append(("req_to_token", check_array(function, "req_to_token", req_to_token, dtype=np.int32, ndim=2)))
    window = check_int(function, "swa_window_size", swa_window_size, low=0, high=INT64_MAX)
    lut = full_to_swa_index_mapping
    if (window > 0) != (lut is not None):
        expected = "an int64 array [full_pool_size + 1]" if window > 0 else "None"
        raise error("KVC-P005", function=function, expected=expected, window=window, got=describe(lut))
    if lut is not None:
        name = "full_to_swa_index_mapping"
        infos.append((name, check_array(function, name, lut, dtype=np.int64, ndim=1, min_len=1)))
        check_lut_head(function, lut)
    return bs, window, infos


def check_write_outputs(function, bs, *, offsets, seeds, count, names):
    """Write-plan arrays: seeds [cap], offsets [cap + 1], count [1]; needs bs <= cap."""
    offsets_name, seeds_name, count_name = names
    seeds_info = check_array(function, seeds_name, seeds, dtype=np.int64, ndim=1, writeable=True)
    capacity = seeds_info.shape[0]
    offsets_info = check_array(function, offsets_name, offsets, dtype=np.int64, ndim=1, writeable=True)
    if offsets_info.shape[0] == 0:
        raise error("KVC-P001", function=function, argument=offsets_name, got=0)
    if offsets_info.shape[0] != capacity + 1:
        raise error(
            "KVC-P002",
            function=function,
            argument=offsets_name,
            expected=capacity + 1,
            capacity_argument=seeds_name,
            got=offsets_info.shape[0],
        )
    if bs > capacity:
        raise error("KVC-P003", function=function, argument=seeds_name, got=bs, expected=capacity)
    return [(offsets_name, offsets_info), (seeds_name, seeds_info), check_flag(function, count_name, count)]


def check_flag(function, name, array):
    return name, check_array(function, name, array, dtype=np.int32, ndim=1, shape=(1,), writeable=True)


def check_lut_head(function: str, lut) -> None:
    """KVC-P008: a host LUT must map padding slot 0 to 0.

    A value check: validation runs it, and so does every call the validation memo serves (the memo
    knows layouts, not contents). Read only from host memory: reading a GPU LUT would sync the
    stream every step (and fail inside CUDA-graph capture); the catalogue entry says so.
    """
    if isinstance(lut, np.ndarray) and lut.dtype == np.int64 and lut.ndim == 1 and lut.size and lut[0] != 0:
        raise error("KVC-P008", function=function, got=int(lut[0]))


#: The scalars that reach the implementation as Python ints (validated ints, NumPy integers included).
_INTS = ("swa_window_size", "verify_capacity")


def check_values(function: str, kwargs: dict) -> None:
    """The checks of a call that read array contents (the LUT's head, KVC-P008): part of validation,
    and what the fast wing's memo runs again on every call it serves (it knows layouts, not contents)."""
    check_lut_head(function, kwargs["full_to_swa_index_mapping"])


def run_offsets(backend: str, *, stream=None, **kwargs) -> None:
    """Run a validated offsets call (``kwargs``: :func:`launch_plan_offsets_kernel`'s) on ``backend``."""
    for name in _INTS:
        kwargs[name] = int(kwargs[name])
    if backend == "numpy":
        reference.launch_plan_offsets_kernel(**kwargs)
    else:
        with CUDA_IMPORTS:  # needs numba-cuda: imported on the kernel path only, one thread at a time
            from .launch import plan as glue

        glue.launch_plan_offsets_kernel(**kwargs, stream=stream)


def public_call(function: str, validate, run, backend: str, stream, kwargs: dict) -> None:
    """A public plan call: the stream handle, native views of DLPack-only arrays, validation, the run."""
    handle = stream_handle(function, stream)
    kwargs = as_native(function, kwargs)
    chosen, _ = validate(**kwargs, backend=backend)
    run(chosen, **kwargs, stream=handle)


def launch_plan_offsets_kernel(
    *,
    req_pool_indices,
    prefix_lens,
    extend_seq_lens,
    req_to_token,
    full_to_swa_index_mapping=None,
    out_verify_offsets_scratch,
    out_write_offsets,
    out_write_seed_slot_indices,
    out_verify_num_valid,
    out_verify_enable,
    out_write_num_valid_reqs,
    swa_window_size=0,
    verify_capacity,
    backend: str = "auto",
    stream=None,
) -> None:
    """Offsets step of the plan: verify offsets, num_valid / enable, write ranges and seeds.

    Parameters
    ----------
    req_pool_indices : int64 [bs]
        Row of ``req_to_token`` of each request (0 = padding row).
    prefix_lens : int64 [bs]
        Tokens of each request already in the KV cache (negative counts as 0).
    extend_seq_lens : int64 [bs]
        New tokens of each request in this step (negative counts as 0).
    req_to_token : int32 [max_reqs, max_seq_len]
        KV slot of each (request row, position).
    full_to_swa_index_mapping : int64 [lut_len >= 1] or None, default None
        Full-to-SWA slot LUT; required iff ``swa_window_size > 0``. ``lut[0]`` must be 0
        (checked when the LUT is in host memory: KVC-P008; a GPU LUT is not read).
    out_verify_offsets_scratch : int64 [>= bs + 1]
        Receives the exclusive verify offsets at ``[0, bs)`` and the total at ``[bs]``.
    out_write_offsets : int64 [write_req_capacity + 1]
        Exclusive sums of the write lengths at ``[0, bs]``, zeros after.
    out_write_seed_slot_indices : int64 [write_req_capacity]
        Chain seed per request at ``[0, bs)``, -1 after.
    out_verify_num_valid : int32 [1]
        Receives ``min(total, verify_capacity)``.
    out_verify_enable : int32 [1]
        Receives 0 when the verify entries overflow ``verify_capacity``, else 1.
    out_write_num_valid_reqs : int32 [1]
        Receives ``bs``.
    swa_window_size : int, default 0
        SWA window ``W >= 0``; 0 verifies the whole prefix.
    verify_capacity : int
        Overflow threshold, in ``[0, 2**31 - 1]``.
    backend : {"auto", "numpy", "cuda"}
        ``"auto"`` follows the arrays.
    stream : CUDA stream, int handle or None
        Where the kernel is queued (None: CuPy's current stream).

    Raises
    ------
    KvCanaryError
        KVC-P001, KVC-P002, KVC-P003, KVC-P005, KVC-P008; KVC-C001 … KVC-C009, KVC-C011, KVC-C013, KVC-C016;
        KVC-C017 (an output sharing memory with another array argument).
    """
    public_call(
        OFFSETS,
        validate_offsets,
        run_offsets,
        backend,
        stream,
        dict(
            req_pool_indices=req_pool_indices,
            prefix_lens=prefix_lens,
            extend_seq_lens=extend_seq_lens,
            req_to_token=req_to_token,
            full_to_swa_index_mapping=full_to_swa_index_mapping,
            out_verify_offsets_scratch=out_verify_offsets_scratch,
            out_write_offsets=out_write_offsets,
            out_write_seed_slot_indices=out_write_seed_slot_indices,
            out_verify_num_valid=out_verify_num_valid,
            out_verify_enable=out_verify_enable,
            out_write_num_valid_reqs=out_write_num_valid_reqs,
            swa_window_size=swa_window_size,
            verify_capacity=verify_capacity,
        ),
    )


def validate_offsets(
    *,
    req_pool_indices,
    prefix_lens,
    extend_seq_lens,
    req_to_token,
    full_to_swa_index_mapping,
    out_verify_offsets_scratch,
    out_write_offsets,
    out_write_seed_slot_indices,
    out_verify_num_valid,
    out_verify_enable,
    out_write_num_valid_reqs,
    swa_window_size,
    verify_capacity,
    backend: str = "auto",
) -> tuple[str, list]:
    """Every check of an offsets call; returns (backend, every array as (name, ArrayInfo))."""
    function = OFFSETS
    bs, window, infos = check_batch(
        function,
        req_pool_indices=req_pool_indices,
        prefix_lens=prefix_lens,
        extend_seq_lens=extend_seq_lens,
        req_to_token=req_to_token,
        full_to_swa_index_mapping=full_to_swa_index_mapping,
        swa_window_size=swa_window_size,
    )
    name = "out_verify_offsets_scratch"
    infos.append(
        (
            name,
            check_array(
                function, name, out_verify_offsets_scratch, dtype=np.int64, ndim=1, min_len=bs + 1, writeable=True
            ),
        )
    )
    infos += check_write_outputs(
        function,
        bs,
        offsets=out_write_offsets,
        seeds=out_write_seed_slot_indices,
        count=out_write_num_valid_reqs,
        names=("out_write_offsets", "out_write_seed_slot_indices", "out_write_num_valid_reqs"),
    )
    infos.append(check_flag(function, "out_verify_num_valid", out_verify_num_valid))
    infos.append(check_flag(function, "out_verify_enable", out_verify_enable))
    check_int(function, "verify_capacity", verify_capacity, low=0, high=INT32_MAX)
    chosen = resolve_backend(function, backend, infos)
    _overlap.check(function, infos)
    return chosen, infos
