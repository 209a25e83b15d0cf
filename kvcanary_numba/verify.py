"""Public verify launch, and the launch-context checks shared with write."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _memo, _overlap
from ._arrays import ArrayInfo, check_array, check_bool, check_int
from ._backend import resolve_backend
from .constants import CANARY_SLOT_BYTES, NUM_LAUNCH_TAGS, VIOLATION_FIELDS
from .context import CanaryContext
from .errors import error
from .fingerprint import check_real_kv_sources
from .plans import ENTRY_FIELDS, VerifyPlan, entry_length

__all__ = ["launch_canary_verify_kernel"]

_FUNCTION = "launch_canary_verify_kernel"
#: Canary fields are 8-byte words; the GPU loads them as such.
_FIELD_ALIGN = 8

Arrays = list[tuple[str, ArrayInfo]]


def check_plan_type(function: str, argument: str, plan: Any, cls: type) -> None:
    """Require ``plan`` (or any bundle argument) to be an instance of ``cls`` (KVC-V001)."""
    if not isinstance(plan, cls):
        raise error("KVC-V001", function=function, argument=argument, expected=cls.__name__, got=type(plan).__name__)


def check_context(function: str, context: Any, *, writes_buffer: bool, needs_chain_flag: bool) -> Arrays:
    """Validate a :class:`CanaryContext` for one verify or write launch.

    Parameters
    ----------
    function : str
        Public function named in error messages.
    context : CanaryContext
        ``canary_buf`` uint8 [num_slots >= 1, stride] with stride a multiple of
        8 and >= 32, 8-byte aligned; ``violation_ring`` int64 [N >= 1, 8];
        ``violation_write_index`` int32 [1]; ``slot_run_counter`` and
        ``kernel_run_counter`` int64 [1]; ``enable_chain_position_assert``
        int32 [1] (may be None when ``needs_chain_flag`` is False);
        ``kernel_kind`` a CanaryLaunchTag value; sources and mode as
        :func:`~kvcanary_numba.fingerprint.check_real_kv_sources` with
        coverage of every canary slot. All C-contiguous; everything the
        launch writes must be writeable.
    writes_buffer : bool
        The launch writes ``canary_buf`` (write does, verify does not).
    needs_chain_flag : bool
        The launch reads ``enable_chain_position_assert``.

    Returns
    -------
    list of (name, ArrayInfo)
        Every array of the context, for :func:`resolve_backend`.

    Raises
    ------
    KvCanaryError
        KVC-V001, KVC-C001 … KVC-C006, KVC-C011 … KVC-C014, KVC-R007 … KVC-R009.
    """
    check_plan_type(function, "context", context, CanaryContext)
    name = "context.canary_buf"
    buf = check_array(function, name, context.canary_buf, dtype=np.uint8, ndim=2, min_len=1, writeable=writes_buffer)
    stride = buf.shape[1]
    if stride < CANARY_SLOT_BYTES or stride % _FIELD_ALIGN:
        raise error("KVC-C012", function=function, argument=name, got=stride)
    if buf.ptr % _FIELD_ALIGN:
        raise error("KVC-C014", function=function, argument=name, expected=_FIELD_ALIGN, got=buf.ptr)
    check_int(function, "context.kernel_kind", context.kernel_kind, low=0, high=NUM_LAUNCH_TAGS - 1)
    arrays: Arrays = [(name, buf)]
    specs = [
        ("violation_ring", np.int64, (None, VIOLATION_FIELDS)),
        ("violation_write_index", np.int32, (1,)),
        ("slot_run_counter", np.int64, (1,)),
        ("kernel_run_counter", np.int64, (1,)),
    ]
    if needs_chain_flag or context.enable_chain_position_assert is not None:
        specs.append(("enable_chain_position_assert", np.int32, (1,)))
    for field, dtype, shape in specs:
        array = getattr(context, field)
        info = check_array(
            function, f"context.{field}", array, dtype=dtype, ndim=len(shape), shape=shape, min_len=1,
            writeable=field != "enable_chain_position_assert",
        )  # fmt: skip
        arrays.append((f"context.{field}", info))
    _, source_arrays = check_real_kv_sources(
        function, context.real_kv_sources, context.real_kv_hash_mode, num_slots=buf.shape[0],
        slots_of="context.canary_buf.shape[0]",
    )
    return arrays + source_arrays


def check_bundle(function: str, prefix: str, bundle: Any, specs: list[tuple[str, Any, tuple]]) -> Arrays:
    """Check the named arrays of a plan: ``specs`` = [(field, dtype, shape)], all contiguous."""
    arrays: Arrays = []
    for field, dtype, shape in specs:
        name = f"{prefix}.{field}"
        arrays.append((name, check_array(function, name, getattr(bundle, field), dtype=dtype, ndim=1, shape=shape)))
    return arrays


#: Snapshots of verify calls that passed validation (see :mod:`kvcanary_numba._memo`).
_MEMO = _memo.Memo()


def launch_canary_verify_kernel(*, context, plan, check_verify_expected_token, backend: str = "auto",
                                stream=None) -> None:
    """Verify the prefix slots a plan lists against their canary records.

    For each entry ``i < clamp(verify_num_valid, 0, capacity)`` (nothing when
    ``enable[0] == 0``): slot 0 is skipped; otherwise the stored record of
    ``verify_slot_indices[i]`` must hold the plan's position, a prev_hash equal
    to the chain hash of ``verify_prev_slot_indices[i]`` (negative = chain
    head, 0 = not checked), the live real-KV fingerprint and, when
    ``check_verify_expected_token``, the expected token (-1 = not checked).
    Each failing entry appends one row (all bits OR-ed) to the ring;
    out-of-range slots and predecessors are reported with the extension bits
    64 / 128 (docs/concepts/semantics.md). The canary buffer is never written.
    ``kernel_run_counter`` += 1 per call; ``slot_run_counter`` += entries.

    Parameters
    ----------
    context : CanaryContext
        canary_buf uint8 [num_slots, stride >= 32]; violation_ring int64
        [ring_capacity, 8]; violation_write_index int32 [1]; slot_run_counter,
        kernel_run_counter int64 [1]; up to 4 real_kv_sources covering every
        slot; real_kv_hash_mode; kernel_kind (stamped into rows).
    plan : VerifyPlan
        verify_slot_indices, verify_expected_tokens, verify_expected_positions,
        verify_prev_slot_indices int64 [verify_capacity]; verify_num_valid,
        enable int32 [1].
    check_verify_expected_token : bool
        Compare tokens; when False ``verify_expected_tokens`` is never read.
    backend : {"auto", "numpy", "cuda"}
        ``"auto"`` follows the arrays (NumPy -> reference, CUDA -> kernels).
    stream : CUDA stream, int handle or None
        Where the kernel is queued (None: CuPy's current stream); see
        :func:`kvcanary_numba._interop.stream_handle`.

    Notes
    -----
    A call whose arguments have the same snapshot as an earlier call that
    passed (same objects, layouts, pointers, scalars: :mod:`kvcanary_numba._memo`)
    skips the checks.

    Raises
    ------
    KvCanaryError
        KVC-V001; KVC-C001 … KVC-C016 for arrays, bools, the backend and the
        stream; KVC-R007 … KVC-R009 for real-KV sources; KVC-C017 (the ring, write
        index or a counter sharing memory with another array).
    """
    kwargs = dict(context=context, plan=plan, check_verify_expected_token=check_verify_expected_token)
    _memo.run_validated(_FUNCTION, "verify", _MEMO, _validate, kwargs, backend, stream,
                        {"check_verify_expected_token": bool})


def _validate(context, plan, check_verify_expected_token, backend) -> tuple[str, _overlap.Recheck | None]:
    """Every check of a verify call; returns the backend it runs on and the memo's overlap re-test."""
    arrays = check_context(_FUNCTION, context, writes_buffer=False, needs_chain_flag=False)
    check_plan_type(_FUNCTION, "plan", plan, VerifyPlan)
    entries = check_bundle(_FUNCTION, "plan", plan, [(field, np.int64, None) for field in ENTRY_FIELDS])
    entry_length(_FUNCTION, "plan", {field: info.shape[0] for field, (_, info) in zip(ENTRY_FIELDS, entries)})
    arrays += entries
    arrays += check_bundle(_FUNCTION, "plan", plan, [("verify_num_valid", np.int32, (1,)), ("enable", np.int32, (1,))])
    check_bool(_FUNCTION, "check_verify_expected_token", check_verify_expected_token)
    return _overlap.check(_FUNCTION, resolve_backend(_FUNCTION, backend, arrays), arrays)
