"""The plan operations: validate the batch metadata and plan arrays, then dispatch.

``launch_canary_plan_kernels`` turns one step's batch metadata into a
:class:`~kvcanary_numba.VerifyPlan` (the prefix slots to check) and a
:class:`~kvcanary_numba.WritePlan` (token ranges and chain seeds of the new
slots); ``launch_plan_offsets_kernel`` is its first step alone, on raw arrays.
Semantics: ``docs/concepts/plans.md`` and ``docs/concepts/semantics.md``; executable
form in :mod:`kvcanary_numba.reference.plan`, kernels in :mod:`kvcanary_numba.kernels.plan`.

Each operation is ``validate_*`` (every check, the backend), ``run_*`` (one explicit
``if``: the NumPy specification or the launch glue :mod:`kvcanary_numba.launch.plan`)
and the public function, the two in a row. The package's top level exports the same
functions wrapped by the fast wing (``kvcanary_numba/fast/calls.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _overlap
from ._validate import as_native, check_array, check_int, entry_length, resolve_backend, stream_handle
from .errors import error
from .plans import ENTRY_FIELDS, VerifyPlan, WritePlan
from .reference import plan as reference

__all__ = [
    "OFFSETS",
    "PLAN",
    "check_values",
    "launch_canary_plan_kernels",
    "launch_plan_offsets_kernel",
    "run_offsets",
    "run_plan",
    "validate_offsets",
    "validate_plan",
]

OFFSETS, PLAN = "launch_plan_offsets_kernel", "launch_canary_plan_kernels"

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
#: verify_num_valid is int32, so a capacity must fit in it.
_INT32_MAX = 2**31 - 1


def _describe(value: Any) -> str:
    return "None" if value is None else f"{type(value).__name__} of shape {tuple(value.shape)}"


def _check_batch(
    function,
    *,
    req_pool_indices,
    prefix_lens,
    extend_seq_lens,
    req_to_token,
    full_to_swa_index_mapping,
    swa_window_size,
):
    """Checks shared by both launches; returns (bs, window, [(name, ArrayInfo)])."""
    infos = [("req_pool_indices", check_array(function, "req_pool_indices", req_pool_indices, dtype=np.int64, ndim=1))]
    bs = infos[0][1].shape[0]
    for name, array in (("prefix_lens", prefix_lens), ("extend_seq_lens", extend_seq_lens)):
        infos.append((name, check_array(function, name, array, dtype=np.int64, ndim=1, shape=(bs,))))
    infos.append(("req_to_token", check_array(function, "req_to_token", req_to_token, dtype=np.int32, ndim=2)))
    window = check_int(function, "swa_window_size", swa_window_size, low=0, high=_INT64_MAX)
    lut = full_to_swa_index_mapping
    if (window > 0) != (lut is not None):
        expected = "an int64 array [full_pool_size + 1]" if window > 0 else "None"
        raise error("KVC-P005", function=function, expected=expected, window=window, got=_describe(lut))
    if lut is not None:
        name = "full_to_swa_index_mapping"
        infos.append((name, check_array(function, name, lut, dtype=np.int64, ndim=1, min_len=1)))
        _check_lut_head(function, lut)
    return bs, window, infos


def _check_write_outputs(function, bs, *, offsets, seeds, count, names):
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
    return [(offsets_name, offsets_info), (seeds_name, seeds_info), _check_flag(function, count_name, count)]


def _check_flag(function, name, array):
    return name, check_array(function, name, array, dtype=np.int32, ndim=1, shape=(1,), writeable=True)


_SCALARS = ("swa_window_size", "verify_capacity", "kv_token_id_vs_position_offset")


def _check_lut_head(function: str, lut) -> None:
    """KVC-P008: a host LUT must map padding slot 0 to 0.

    A value check: validation runs it, and so does every call the validation memo serves (the memo
    knows layouts, not contents). Read only from host memory: reading a GPU LUT would sync the
    stream every step (and fail inside CUDA-graph capture); the catalogue entry says so.
    """
    if isinstance(lut, np.ndarray) and lut.dtype == np.int64 and lut.ndim == 1 and lut.size and lut[0] != 0:
        raise error("KVC-P008", function=function, got=int(lut[0]))


#: Per function: the scalars that reach the implementation as Python ints (validated ints, NumPy
#: integers included).
_INTS = {OFFSETS: ("swa_window_size", "verify_capacity"), PLAN: _SCALARS}


def check_values(function: str, kwargs: dict) -> None:
    """The checks of a call that read array contents (the LUT's head, KVC-P008): part of validation,
    and what the fast wing's memo runs again on every call it serves (it knows layouts, not contents)."""
    _check_lut_head(function, kwargs["full_to_swa_index_mapping"])


def run_offsets(backend: str, *, stream=None, **kwargs) -> None:
    """Run a validated offsets call (``kwargs``: :func:`launch_plan_offsets_kernel`'s) on ``backend``."""
    for name in _INTS[OFFSETS]:
        kwargs[name] = int(kwargs[name])
    if backend == "numpy":
        reference.launch_plan_offsets_kernel(**kwargs)
    else:
        from .launch import plan as glue  # needs numba-cuda: imported on the kernel path only

        glue.launch_plan_offsets_kernel(**kwargs, stream=stream)


def run_plan(backend: str, *, stream=None, **kwargs) -> None:
    """Run a validated plan call (``kwargs``: :func:`launch_canary_plan_kernels`'s) on ``backend``."""
    for name in _INTS[PLAN]:
        kwargs[name] = int(kwargs[name])
    if backend == "numpy":
        reference.launch_canary_plan_kernels(**kwargs)
    else:
        from .launch import plan as glue  # needs numba-cuda: imported on the kernel path only

        glue.launch_canary_plan_kernels(**kwargs, stream=stream)


def _public(function: str, validate, run, backend: str, stream, kwargs: dict) -> None:
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
    full_to_swa_index_mapping : int64 [lut_len >= 1] or None
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
    swa_window_size : int
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
    _public(
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
    bs, window, infos = _check_batch(
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
    infos += _check_write_outputs(
        function,
        bs,
        offsets=out_write_offsets,
        seeds=out_write_seed_slot_indices,
        count=out_write_num_valid_reqs,
        names=("out_write_offsets", "out_write_seed_slot_indices", "out_write_num_valid_reqs"),
    )
    infos.append(_check_flag(function, "out_verify_num_valid", out_verify_num_valid))
    infos.append(_check_flag(function, "out_verify_enable", out_verify_enable))
    check_int(function, "verify_capacity", verify_capacity, low=0, high=_INT32_MAX)
    chosen = resolve_backend(function, backend, infos)
    _overlap.check(function, infos)
    return chosen, infos


def launch_canary_plan_kernels(
    *,
    verify_plan_out,
    write_plan_out,
    req_pool_indices,
    prefix_lens,
    extend_seq_lens,
    req_to_token,
    swa_window_size,
    full_to_swa_index_mapping,
    verify_capacity,
    req_to_verify_expected_tokens,
    req_to_verify_expected_tokens_valid_lens,
    kv_token_id_vs_position_offset,
    backend: str = "auto",
    stream=None,
) -> None:
    """Plan one step: fill ``verify_plan_out`` and ``write_plan_out`` in place.

    Parameters
    ----------
    verify_plan_out : VerifyPlan
        Receives entries ``[0, total)`` request-major (left as they were when
        ``total > verify_capacity``: then num_valid = capacity and enable = 0).
    write_plan_out : WritePlan
        Receives write ranges, seeds and ``write_num_valid_reqs = bs``; needs
        ``write_req_capacity >= bs``.
    req_pool_indices : int64 [bs]
        Request rows, as in :func:`launch_plan_offsets_kernel`.
    prefix_lens : int64 [bs]
        Cached tokens per request: positions ``[0, prefix)`` are verified (within the SWA window).
    extend_seq_lens : int64 [bs]
        New tokens per request: positions ``[prefix, prefix + extend)`` are planned for writing.
    req_to_token : int32 [max_reqs, max_seq_len]
        KV slot of each (request row, position); unresolvable -> ``OUT_OF_RANGE_SLOT``.
    swa_window_size : int
        SWA window ``W >= 0``: positions ``[max(prefix - W, 0), prefix)`` are verified.
    full_to_swa_index_mapping : int64 [lut_len >= 1] or None
        Full-to-SWA slot LUT; required iff ``swa_window_size > 0``; ``lut[0] == 0`` (KVC-P008).
    verify_capacity : int
        Must equal ``verify_plan_out.verify_capacity``.
    req_to_verify_expected_tokens : int32 [rows, cols] or None
        Expected-token pool (see :func:`~kvcanary_numba.scatter.scatter_req_token_ids`).
    req_to_verify_expected_tokens_valid_lens : int64 [bs] or None
        Valid columns per request; given iff the pool is.
    kv_token_id_vs_position_offset : int
        Column offset of the expected token (0 target model, +1 EAGLE draft).
    backend : {"auto", "numpy", "cuda"}
        ``"auto"`` follows the arrays.
    stream : CUDA stream, int handle or None
        Where the two kernels are queued (None: CuPy's current stream).

    Raises
    ------
    KvCanaryError
        KVC-P001 … KVC-P008; KVC-C001 … KVC-C009, KVC-C011, KVC-C013, KVC-C016; KVC-C017 (a plan
        array sharing memory with another plan array or an input).
    """
    _public(
        PLAN,
        validate_plan,
        run_plan,
        backend,
        stream,
        dict(
            verify_plan_out=verify_plan_out,
            write_plan_out=write_plan_out,
            req_pool_indices=req_pool_indices,
            prefix_lens=prefix_lens,
            extend_seq_lens=extend_seq_lens,
            req_to_token=req_to_token,
            swa_window_size=swa_window_size,
            full_to_swa_index_mapping=full_to_swa_index_mapping,
            verify_capacity=verify_capacity,
            req_to_verify_expected_tokens=req_to_verify_expected_tokens,
            req_to_verify_expected_tokens_valid_lens=req_to_verify_expected_tokens_valid_lens,
            kv_token_id_vs_position_offset=kv_token_id_vs_position_offset,
        ),
    )


def validate_plan(
    *,
    verify_plan_out,
    write_plan_out,
    req_pool_indices,
    prefix_lens,
    extend_seq_lens,
    req_to_token,
    swa_window_size,
    full_to_swa_index_mapping,
    verify_capacity,
    req_to_verify_expected_tokens,
    req_to_verify_expected_tokens_valid_lens,
    kv_token_id_vs_position_offset,
    backend: str = "auto",
) -> tuple[str, list]:
    """Every check of a plan call; returns (backend, every array as (name, ArrayInfo))."""
    function = PLAN
    for argument, value, cls in (
        ("verify_plan_out", verify_plan_out, VerifyPlan),
        ("write_plan_out", write_plan_out, WritePlan),
    ):
        if not isinstance(value, cls):
            raise error(
                "KVC-P007", function=function, argument=argument, expected=cls.__name__, got=type(value).__name__
            )
    bs, window, infos = _check_batch(
        function,
        req_pool_indices=req_pool_indices,
        prefix_lens=prefix_lens,
        extend_seq_lens=extend_seq_lens,
        req_to_token=req_to_token,
        full_to_swa_index_mapping=full_to_swa_index_mapping,
        swa_window_size=swa_window_size,
    )
    wplan, vplan = write_plan_out, verify_plan_out
    infos += _check_write_outputs(
        function,
        bs,
        offsets=wplan.write_offsets,
        seeds=wplan.write_seed_slot_indices,
        count=wplan.write_num_valid_reqs,
        names=(
            "write_plan_out.write_offsets",
            "write_plan_out.write_seed_slot_indices",
            "write_plan_out.write_num_valid_reqs",
        ),
    )
    entries = vplan.arrays()
    lengths = {}
    for field in ENTRY_FIELDS:
        name = f"verify_plan_out.{field}"
        info = check_array(function, name, entries[field], dtype=np.int64, ndim=1, writeable=True)
        lengths[field] = info.shape[0]
        infos.append((name, info))
    for field in ("verify_num_valid", "enable"):
        infos.append(_check_flag(function, f"verify_plan_out.{field}", entries[field]))
    capacity = check_int(function, "verify_capacity", verify_capacity, low=0, high=_INT32_MAX)
    length = entry_length(function, "verify_plan_out", lengths, capacity)
    if capacity != length:
        raise error(
            "KVC-P004", function=function, argument="verify_plan_out.verify_slot_indices", expected=length, got=capacity
        )
    pool, lens = req_to_verify_expected_tokens, req_to_verify_expected_tokens_valid_lens
    if (pool is None) != (lens is None):
        raise error(
            "KVC-P006",
            function=function,
            got=f"req_to_verify_expected_tokens={_describe(pool)}, "
            f"req_to_verify_expected_tokens_valid_lens={_describe(lens)}",
        )
    if pool is not None:
        for name, array, dtype, ndim, shape in (
            ("req_to_verify_expected_tokens", pool, np.int32, 2, None),
            ("req_to_verify_expected_tokens_valid_lens", lens, np.int64, 1, (bs,)),
        ):
            infos.append((name, check_array(function, name, array, dtype=dtype, ndim=ndim, shape=shape)))
    check_int(
        function, "kv_token_id_vs_position_offset", kv_token_id_vs_position_offset, low=_INT64_MIN, high=_INT64_MAX
    )
    chosen = resolve_backend(function, backend, infos)
    _overlap.check(function, infos)
    return chosen, infos
