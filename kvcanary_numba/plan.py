"""The plan operation: validate the batch metadata and plan arrays, then dispatch.

``launch_canary_plan_kernels`` turns one step's batch metadata into a
:class:`~kvcanary_numba.VerifyPlan` (the prefix slots to check) and a
:class:`~kvcanary_numba.WritePlan` (token ranges and chain seeds of the new
slots). Its first step, ``launch_plan_offsets_kernel``, is an operation of its own on
raw arrays (:mod:`kvcanary_numba.plan_offsets`, with the batch checks both share).
Semantics: ``docs/concepts/plans.md`` and ``docs/concepts/semantics.md``; executable
form in :mod:`kvcanary_numba.reference.plan`, kernels in :mod:`kvcanary_numba.kernels.plan`.

As in every operation module: :func:`validate_plan` (every check, the backend),
:func:`run_plan` (one explicit ``if``: the NumPy specification or the launch glue
:mod:`kvcanary_numba.launch.plan`) and the public function, the two in a row. The package's top level exports the same
functions wrapped by the fast wing (``kvcanary_numba/fast/calls.py``).
"""

from __future__ import annotations

import numpy as np

from . import _overlap
from ._runtime import CUDA_IMPORTS
from ._validate import check_array, check_int, entry_length, resolve_backend
from .errors import error
from .plan_offsets import (
    INT32_MAX,
    INT64_MAX,
    INT64_MIN,
    PLAN,
    check_batch,
    check_flag,
    check_write_outputs,
    describe,
    launch_plan_offsets_kernel,
    public_call,
)
from .plans import ENTRY_FIELDS, VerifyPlan, WritePlan
from .reference import plan as reference

#: ``launch_plan_offsets_kernel`` is importable from here too: planning in one import (tutorials do).
__all__ = [
    "PLAN",
    "derive_verify_capacity",
    "launch_canary_plan_kernels",
    "launch_plan_offsets_kernel",
    "run_plan",
    "validate_plan",
]

#: The scalars that reach the implementation as Python ints (validated ints, NumPy integers included).
_INTS = ("swa_window_size", "verify_capacity", "kv_token_id_vs_position_offset")


def derive_verify_capacity(kwargs: dict) -> None:
    """Fill a validated call's ``verify_capacity=None`` in from its verify plan (in place)."""
    if kwargs["verify_capacity"] is None:
        kwargs["verify_capacity"] = kwargs["verify_plan_out"].verify_capacity


def run_plan(backend: str, *, stream=None, **kwargs) -> None:
    """Run a validated plan call (``kwargs``: :func:`launch_canary_plan_kernels`'s) on ``backend``."""
    derive_verify_capacity(kwargs)
    for name in _INTS:
        kwargs[name] = int(kwargs[name])
    if backend == "numpy":
        reference.launch_canary_plan_kernels(**kwargs)
    else:
        with CUDA_IMPORTS:  # needs numba-cuda: imported on the kernel path only, one thread at a time
            from .launch import plan as glue

        glue.launch_canary_plan_kernels(**kwargs, stream=stream)


def launch_canary_plan_kernels(
    *,
    verify_plan_out,
    write_plan_out,
    req_pool_indices,
    prefix_lens,
    extend_seq_lens,
    req_to_token,
    swa_window_size=0,
    full_to_swa_index_mapping=None,
    verify_capacity=None,
    req_to_verify_expected_tokens=None,
    req_to_verify_expected_tokens_valid_lens=None,
    kv_token_id_vs_position_offset=0,
    backend: str = "auto",
    stream=None,
) -> None:
    """Plan one step: fill ``verify_plan_out`` and ``write_plan_out`` in place.

    The keywords are SGLang's; those that are off (no SWA, no expected-token pool) or follow
    from the plans (``verify_capacity``) have defaults, so a plain step names six arguments.

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
    swa_window_size : int, default 0
        SWA window ``W >= 0``: positions ``[max(prefix - W, 0), prefix)`` are verified; 0 (a
        FULL group) verifies the whole prefix.
    full_to_swa_index_mapping : int64 [lut_len >= 1] or None, default None
        Full-to-SWA slot LUT; required iff ``swa_window_size > 0``; ``lut[0] == 0`` (KVC-P008).
    verify_capacity : int or None, default None
        None: ``verify_plan_out.verify_capacity``; given (SGLang passes it), it must equal that
        (KVC-P004).
    req_to_verify_expected_tokens : int32 [rows, cols] or None, default None
        Expected-token pool (see :func:`~kvcanary_numba.scatter.scatter_req_token_ids`); None:
        stored tokens are not planned for checking.
    req_to_verify_expected_tokens_valid_lens : int64 [bs] or None, default None
        Valid columns per request; given iff the pool is.
    kv_token_id_vs_position_offset : int, default 0
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
    public_call(
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
    bs, window, infos = check_batch(
        function,
        req_pool_indices=req_pool_indices,
        prefix_lens=prefix_lens,
        extend_seq_lens=extend_seq_lens,
        req_to_token=req_to_token,
        full_to_swa_index_mapping=full_to_swa_index_mapping,
        swa_window_size=swa_window_size,
    )
    wplan, vplan = write_plan_out, verify_plan_out
    infos += check_write_outputs(
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
        infos.append(check_flag(function, f"verify_plan_out.{field}", entries[field]))
    capacity = None
    if verify_capacity is not None:  # None: the plan's own (derived when the call runs)
        capacity = check_int(function, "verify_capacity", verify_capacity, low=0, high=INT32_MAX)
    length = entry_length(function, "verify_plan_out", lengths, capacity)
    if capacity is not None and capacity != length:
        raise error(
            "KVC-P004", function=function, argument="verify_plan_out.verify_slot_indices", expected=length, got=capacity
        )
    pool, lens = req_to_verify_expected_tokens, req_to_verify_expected_tokens_valid_lens
    if (pool is None) != (lens is None):
        raise error(
            "KVC-P006",
            function=function,
            got=f"req_to_verify_expected_tokens={describe(pool)}, "
            f"req_to_verify_expected_tokens_valid_lens={describe(lens)}",
        )
    if pool is not None:
        for name, array, dtype, ndim, shape in (
            ("req_to_verify_expected_tokens", pool, np.int32, 2, None),
            ("req_to_verify_expected_tokens_valid_lens", lens, np.int64, 1, (bs,)),
        ):
            infos.append((name, check_array(function, name, array, dtype=dtype, ndim=ndim, shape=shape)))
    check_int(function, "kv_token_id_vs_position_offset", kv_token_id_vs_position_offset, low=INT64_MIN, high=INT64_MAX)
    chosen = resolve_backend(function, backend, infos)
    _overlap.check(function, infos)
    return chosen, infos
