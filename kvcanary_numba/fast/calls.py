"""The public operations as the package's top level exports them: each core operation, wrapped.

Every function here takes the core operation's arguments and gives its results; what it
adds is host time saved (the core validates and launches through numba-cuda's dispatcher
on every call: about 850 us of host time for a plan + verify + write step on a GPU host):

- a validation memo (:mod:`.memo`): a call whose argument snapshot passed before skips
  the checks (the value checks and the shared-memory test of top-level NumPy arrays still
  run);
- on CUDA arrays, raw launches (:mod:`.replay`): the first call of a snapshot runs the
  core's launch glue with each launch packed and launched by one driver call, the second
  keeps the packed launches, later ones replay them (no glue, one compiled call);
- on NumPy arrays, the optimised CPU path (:mod:`.cpu`) instead of the plain NumPy
  specification (:mod:`kvcanary_numba.reference`), which tests compare it with;
- for a long write, the tiled path (``fast/write.py``); for the plan, launch scratch kept
  per stream (``fast/scratch.py``).

Docstrings, signatures and errors are the core's (``functools.wraps``): read those in
``kvcanary_numba/verify.py`` and its siblings.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from .. import (
    digest as _digest,
    fingerprint as _fingerprint,
    move as _move,
    plan as _plan,
    plan_offsets as _plan_offsets,
    records as _records,
    scatter as _scatter,
    verify as _verify,
    write as _write,
)
from .._runtime import CUDA_IMPORTS
from .._validate import stream_handle
from ..constants import RealKvHashMode
from ..errors import KvCanaryError, error
from ..reference import scatter as reference_scatter
from . import moves, replay
from .cpu import fingerprint as cpu_fingerprint, plan as cpu_plan, verify as cpu_verify, write as cpu_write
from .memo import Memo, checked
from .scratch import CAPTURE_FUNCTION, STREAM_SCRATCH

__all__ = [
    "OPERATIONS",
    "Operation",
    "compute_handoff_digest",
    "compute_real_kv_hash",
    "gather_canary_records",
    "launch_canary_plan_kernels",
    "launch_canary_verify_kernel",
    "launch_canary_write_kernel",
    "launch_plan_offsets_kernel",
    "move_canary_records",
    "scatter_canary_records",
    "scatter_req_token_ids",
    "verify_canary_records",
]


#: Held while one public call issues its launches. The plan's kernels hand data to each other
#: through launch scratch shared by every call on a stream (``fast/scratch.py``), and packed
#: launches are kept per argument snapshot: two threads' calls must not interleave there.
_LAUNCHING = threading.RLock()


class Operation:
    """One public operation: the core's ``validate``, where it runs (the optimised CPU function, or
    the launch glue: ``load_glue()`` imports it on the kernel path only, since it needs
    numba-cuda), scalar normalisation, the value checks a memo hit still owes and ``derive``: the
    defaults that follow from other arguments (the plan's ``verify_capacity=None``), filled in
    after validation."""

    def __init__(
        self,
        function: str,
        validate: Callable,
        cpu_run: Callable,
        load_glue: Callable[[], Callable],
        *,
        normalize: dict[str, Callable] | None = None,
        value_checks: Callable[[dict], None] | None = None,
        derive: Callable[[dict], None] | None = None,
    ):
        self.function, self.validate, self.cpu_run, self.load_glue = function, validate, cpu_run, load_glue
        self.normalize, self.value_checks, self.derive = normalize or {}, value_checks, derive
        self.memo = Memo()
        self._imported = False

    def glue(self) -> Callable:
        """The launch glue; the first call that needs it imports it (one thread at a time: later
        imports are look-ups of a module whose import has finished)."""
        if self._imported:
            return self.load_glue()
        with CUDA_IMPORTS:
            glue = self.load_glue()
        self._imported = True
        return glue

    def __call__(self, kwargs: dict, backend: str, stream: Any) -> None:
        handle = stream_handle(self.function, stream)
        entry, kwargs = checked(self.function, self.memo, self.validate, kwargs, backend, self.value_checks)
        if self.derive is not None:  # defaults that follow from other arguments (after validation)
            self.derive(kwargs)
        for name, cast in self.normalize.items():
            kwargs[name] = cast(kwargs[name])
        if entry.kind == "numpy":
            self.cpu_run(**kwargs)
            return
        glue = self.glue()
        try:
            with _LAUNCHING:
                replay.run_launches(entry, glue, kwargs, handle)
        except KvCanaryError as exc:  # launch scratch refused during graph capture: name the public call
            if exc.fields.get("function") != CAPTURE_FUNCTION:
                raise
            raise error("KVC-C015", **{**exc.fields, "function": self.function}) from None


def _offsets_glue() -> Callable:
    from ..launch import plan as glue

    return functools.partial(glue.launch_plan_offsets_kernel, scratch=STREAM_SCRATCH)


def _plan_glue() -> Callable:
    from ..launch import plan as glue

    return functools.partial(glue.launch_canary_plan_kernels, scratch=STREAM_SCRATCH)


def _verify_glue() -> Callable:
    from ..launch import verify as glue

    return glue.launch_canary_verify_kernel


def _write_glue() -> Callable:
    from . import write as glue  # the tiled path for long writes, the shared chain of a monitor step

    return glue.launch_canary_write_kernel


def _scatter_glue() -> Callable:
    from ..launch import scatter as glue

    return glue.scatter_req_token_ids


def _fingerprint_glue() -> Callable:
    from ..launch import fingerprint as glue

    return glue.compute_real_kv_hash


_OFFSETS = Operation(
    _plan_offsets.OFFSETS,
    _plan_offsets.validate_offsets,
    cpu_plan.launch_plan_offsets_kernel,
    _offsets_glue,
    normalize={"swa_window_size": int, "verify_capacity": int},
    value_checks=functools.partial(_plan_offsets.check_values, _plan_offsets.OFFSETS),
)
_PLAN = Operation(
    _plan.PLAN,
    _plan.validate_plan,
    cpu_plan.launch_canary_plan_kernels,
    _plan_glue,
    normalize={"swa_window_size": int, "verify_capacity": int, "kv_token_id_vs_position_offset": int},
    value_checks=functools.partial(_plan_offsets.check_values, _plan.PLAN),
    derive=_plan.derive_verify_capacity,
)
_VERIFY = Operation(
    _verify.FUNCTION,
    _verify.validate,
    cpu_verify.launch_canary_verify_kernel,
    _verify_glue,
    normalize={"check_verify_expected_token": bool},
)


def _cpu_write(**kwargs) -> None:
    """The optimised CPU write, on int64 copies of int32 inputs (as the core's specification)."""
    cpu_write.launch_canary_write_kernel(**_write.host_int64(kwargs))


_WRITE = Operation(
    _write.FUNCTION,
    _write.validate,
    _cpu_write,
    _write_glue,
    normalize={"enable_write_input_assert": bool},
    value_checks=_write.check_values,
)
_SCATTER = Operation(_scatter.FUNCTION, _scatter.validate, reference_scatter.scatter_req_token_ids, _scatter_glue)
_FINGERPRINT = Operation(
    _fingerprint.FUNCTION,
    _fingerprint.validate,
    cpu_fingerprint.compute_real_kv_hash,
    _fingerprint_glue,
    normalize={"real_kv_hash_mode": lambda mode: RealKvHashMode(int(mode))},
)


# The moved-records operations: glue, CPU runs (the host tier's path) and value checks in fast/moves.py.
_GATHER = Operation(_move.GATHER, _move.validate_gather, moves.cpu_gather, moves.gather_glue)
_SCATTER_RECORDS = Operation(_move.SCATTER, _move.validate_scatter, moves.cpu_scatter, moves.scatter_glue)
_MOVE = Operation(_move.MOVE, _move.validate_move, moves.cpu_move, moves.move_glue)
_RECORDS = Operation(
    _records.FUNCTION, _records.validate, moves.cpu_records, moves.records_glue, value_checks=moves.records_values
)
_DIGEST = Operation(
    _digest.FUNCTION, _digest.validate, moves.cpu_digest, moves.digest_glue, value_checks=moves.digest_values
)
_ALL = (_OFFSETS, _PLAN, _VERIFY, _WRITE, _SCATTER, _FINGERPRINT, _GATHER, _SCATTER_RECORDS, _MOVE, _RECORDS, _DIGEST)
#: Every operation by its public function's name (tests count validations, clear memos).
OPERATIONS = {op.function: op for op in _ALL}


@functools.wraps(_plan_offsets.launch_plan_offsets_kernel)
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
    _OFFSETS(
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
        backend,
        stream,
    )


@functools.wraps(_plan.launch_canary_plan_kernels)
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
    _PLAN(
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
        backend,
        stream,
    )


@functools.wraps(_verify.launch_canary_verify_kernel)
def launch_canary_verify_kernel(
    *, context, plan, check_verify_expected_token=False, backend: str = "auto", stream=None
) -> None:
    _VERIFY(dict(context=context, plan=plan, check_verify_expected_token=check_verify_expected_token), backend, stream)


@functools.wraps(_write.launch_canary_write_kernel)
def launch_canary_write_kernel(
    *,
    context,
    plan,
    input_ids,
    positions,
    out_cache_loc,
    enable_write_input_assert=False,
    expected_input_tokens=None,
    expected_input_positions=None,
    backend: str = "auto",
    stream=None,
) -> None:
    _WRITE(
        dict(
            context=context,
            plan=plan,
            input_ids=input_ids,
            positions=positions,
            out_cache_loc=out_cache_loc,
            enable_write_input_assert=enable_write_input_assert,
            expected_input_tokens=expected_input_tokens,
            expected_input_positions=expected_input_positions,
        ),
        backend,
        stream,
    )


@functools.wraps(_scatter.scatter_req_token_ids)
def scatter_req_token_ids(*, flat_in, offsets, req_pool_indices, pool_out, backend: str = "auto", stream=None) -> None:
    _SCATTER(
        dict(flat_in=flat_in, offsets=offsets, req_pool_indices=req_pool_indices, pool_out=pool_out), backend, stream
    )


@functools.wraps(_fingerprint.compute_real_kv_hash)
def compute_real_kv_hash(
    *, real_kv_sources, real_kv_hash_mode, slot_indices, out, backend: str = "auto", stream=None
) -> None:
    _FINGERPRINT(
        dict(real_kv_sources=real_kv_sources, real_kv_hash_mode=real_kv_hash_mode, slot_indices=slot_indices, out=out),
        backend,
        stream,
    )


@functools.wraps(_move.gather_canary_records)
def gather_canary_records(*, context, slot_indices, out_records, backend: str = "auto", stream=None) -> None:
    _GATHER(dict(context=context, slot_indices=slot_indices, out_records=out_records), backend, stream)


@functools.wraps(_move.scatter_canary_records)
def scatter_canary_records(*, context, records, slot_indices, backend: str = "auto", stream=None) -> None:
    _SCATTER_RECORDS(dict(context=context, records=records, slot_indices=slot_indices), backend, stream)


@functools.wraps(_move.move_canary_records)
def move_canary_records(
    *, context, src_slot_indices, dst_slot_indices, scratch_records, backend: str = "auto", stream=None
) -> None:
    kwargs = dict(src_slot_indices=src_slot_indices, dst_slot_indices=dst_slot_indices, scratch_records=scratch_records)
    _MOVE(dict(context=context, **kwargs), backend, stream)


@functools.wraps(_records.verify_canary_records)
def verify_canary_records(
    *, context, slot_indices, run_offsets, run_start_positions, run_prev_slots, backend: str = "auto", stream=None
) -> None:
    runs = dict(run_offsets=run_offsets, run_start_positions=run_start_positions, run_prev_slots=run_prev_slots)
    _RECORDS(dict(context=context, slot_indices=slot_indices, **runs), backend, stream)


@functools.wraps(_digest.compute_handoff_digest)
def compute_handoff_digest(
    *, context, slot_indices, run_offsets, out_digests, out_records=None, backend: str = "auto", stream=None
) -> None:
    kwargs = dict(slot_indices=slot_indices, run_offsets=run_offsets, out_digests=out_digests, out_records=out_records)
    _DIGEST(dict(context=context, **kwargs), backend, stream)
