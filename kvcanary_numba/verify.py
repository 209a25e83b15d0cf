"""The verify operation: check the prefix slots a plan lists against their canary records.

Read this file top to bottom: :func:`validate` checks every argument and picks the backend,
:func:`run` dispatches with one explicit ``if`` to the NumPy specification
(:mod:`kvcanary_numba.reference.verify`) or to the launch glue
(:mod:`kvcanary_numba.launch.verify`, which launches :mod:`kvcanary_numba.kernels.verify`),
and :func:`launch_canary_verify_kernel` is the two in a row.

The package's top level exports the same function wrapped by the fast wing
(``kvcanary_numba/fast/calls.py``: validation memo, packed launches, the optimised CPU
path); this one validates and launches on every call.
"""

from __future__ import annotations

import numpy as np

from . import _overlap
from ._runtime import CUDA_IMPORTS
from ._validate import as_native, check_bool, check_bundle, check_type, entry_length, resolve_backend, stream_handle
from .context import check_context
from .plans import ENTRY_FIELDS, VerifyPlan
from .reference import verify as reference

__all__ = ["check_verify_plan", "launch_canary_verify_kernel", "run", "validate"]

FUNCTION = "launch_canary_verify_kernel"


def check_verify_plan(function: str, plan) -> list:
    """A :class:`~kvcanary_numba.VerifyPlan` a launch reads: int64 entry arrays of one length, int32 [1] lanes."""
    check_type(function, "plan", plan, VerifyPlan)
    entries = check_bundle(function, "plan", plan, [(field, np.int64, None) for field in ENTRY_FIELDS])
    entry_length(function, "plan", {field: info.shape[0] for field, (_, info) in zip(ENTRY_FIELDS, entries)})
    return entries + check_bundle(
        function, "plan", plan, [("verify_num_valid", np.int32, (1,)), ("enable", np.int32, (1,))]
    )


def validate(*, context, plan, check_verify_expected_token, backend: str = "auto") -> tuple[str, list]:
    """Every check of a verify call.

    Returns
    -------
    backend : {"numpy", "cuda"}
        Where the call runs.
    arrays : list of (name, ArrayInfo)
        Every array of the call (the fast wing's memo re-tests the shared-memory rule with them).
    """
    arrays = check_context(FUNCTION, context, writes_buffer=False, needs_chain_flag=False)
    arrays += check_verify_plan(FUNCTION, plan)
    check_bool(FUNCTION, "check_verify_expected_token", check_verify_expected_token)
    chosen = resolve_backend(FUNCTION, backend, arrays)
    _overlap.check(FUNCTION, arrays)
    return chosen, arrays


def run(backend: str, *, context, plan, check_verify_expected_token, stream=None) -> None:
    """Run a validated verify call on ``backend``; ``stream`` is a CUDA stream handle or None."""
    check = bool(check_verify_expected_token)
    if backend == "numpy":
        reference.launch_canary_verify_kernel(context=context, plan=plan, check_verify_expected_token=check)
    else:
        with CUDA_IMPORTS:  # needs numba-cuda: imported on the kernel path only, one thread at a time
            from .launch import verify as glue

        glue.launch_canary_verify_kernel(context=context, plan=plan, check_verify_expected_token=check, stream=stream)


def launch_canary_verify_kernel(
    *, context, plan, check_verify_expected_token=False, backend: str = "auto", stream=None
) -> None:
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
    check_verify_expected_token : bool, default False
        Compare tokens; when False ``verify_expected_tokens`` is never read.
    backend : {"auto", "numpy", "cuda"}
        ``"auto"`` follows the arrays (NumPy -> reference, CUDA -> kernels).
    stream : CUDA stream, int handle or None
        Where the kernel is queued (None: CuPy's current stream).

    Raises
    ------
    KvCanaryError
        KVC-V001; KVC-C001 … KVC-C016 for arrays, bools, the backend and the
        stream; KVC-R007 … KVC-R009 for real-KV sources; KVC-C017 (the ring, write
        index or a counter sharing memory with another array).
    """
    handle = stream_handle(FUNCTION, stream)
    kwargs = as_native(
        FUNCTION, dict(context=context, plan=plan, check_verify_expected_token=check_verify_expected_token)
    )
    chosen, _ = validate(**kwargs, backend=backend)
    run(chosen, **kwargs, stream=handle)
