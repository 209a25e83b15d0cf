"""The records check: ``verify_canary_records``, a moved set checked where it rests.

After a move, the records and the KV sit in new slots (a host copy, another pool, the
device again). This checks them there, without a step of the engine: each run of
consecutive positions is walked as verify walks a plan (chain, position, live fingerprint).
On the host tier it runs the vectorised NumPy specification
(:mod:`kvcanary_numba.reference.records`); on a GPU the kernel
(:mod:`kvcanary_numba.kernels.records`) through :mod:`kvcanary_numba.launch.records`.

The run table (:func:`check_runs`) is shared with the hand-off digest: ``run_offsets`` has
``num_runs + 1`` int64 entries; on host arrays its values are checked (KVC-K006), on a
device they are data the kernels read safely.
"""

from __future__ import annotations

import numpy as np

from . import _overlap
from ._validate import as_native, check_array, resolve_backend, stream_handle
from .context import check_context
from .errors import error
from .move import check_slots
from .reference import records as reference

__all__ = ["FUNCTION", "check_run_values", "check_runs", "run", "validate", "verify_canary_records"]

FUNCTION = "verify_canary_records"
_INT64_MAX = 2**63 - 1


def check_runs(function: str, n: int, run_offsets, per_run: dict) -> list:
    """The run table: ``run_offsets`` int64 [num_runs + 1] and each per-run int64 array [num_runs].

    Raises KVC-K004 (no entry), KVC-K005 (no run for a non-empty set), KVC-C004 for a per-run
    array of another length, and the array codes; values are :func:`check_run_values`'.
    """
    offsets = check_array(function, "run_offsets", run_offsets, dtype=np.int64, ndim=1)
    if offsets.shape[0] == 0:
        raise error("KVC-K004", function=function, got=offsets.shape)
    runs = offsets.shape[0] - 1
    if runs == 0 and n > 0:
        raise error("KVC-K005", function=function, got=n)
    arrays = [("run_offsets", offsets)]
    for name, array in per_run.items():
        info = check_array(function, name, array, dtype=np.int64, ndim=1, shape=(runs,), shape_of="run_offsets[1:]")
        arrays.append((name, info))
    return arrays


def check_run_values(function: str, n: int, run_offsets, run_start_positions=None) -> None:
    """Value checks of a host run table (nothing for device arrays): KVC-K006, KVC-K007."""
    if not isinstance(run_offsets, np.ndarray):
        return
    steps = np.diff(run_offsets)
    if run_offsets[0] != 0 or run_offsets[-1] != n or (steps < 0).any():
        first_bad = int(np.argmax(steps < 0)) + 1 if (steps < 0).any() else None
        detail = (
            f"goes down at entry {first_bad}" if first_bad is not None else f"runs {run_offsets[0]}..{run_offsets[-1]}"
        )
        raise error("KVC-K006", function=function, n=n, got=detail)
    if isinstance(run_start_positions, np.ndarray) and run_start_positions.shape[0]:
        last = _INT64_MAX - np.maximum(steps - 1, 0)
        bad = (run_start_positions < 0) | (run_start_positions > last)
        if bad.any():
            r = int(np.argmax(bad))
            raise error("KVC-K007", function=function, run=r, got=int(run_start_positions[r]), length=int(steps[r]))


def validate(
    *, context, slot_indices, run_offsets, run_start_positions, run_prev_slots, backend: str = "auto"
) -> tuple[str, list]:
    """Every check of a records check; returns (backend, every array as (name, ArrayInfo))."""
    arrays = check_context(FUNCTION, context, writes_buffer=False, needs_chain_flag=False)
    slots = check_slots(FUNCTION, "slot_indices", slot_indices)
    per_run = dict(run_start_positions=run_start_positions, run_prev_slots=run_prev_slots)
    arrays += [("slot_indices", slots), *check_runs(FUNCTION, slots.shape[0], run_offsets, per_run)]
    chosen = resolve_backend(FUNCTION, backend, arrays)
    check_run_values(FUNCTION, slots.shape[0], run_offsets, run_start_positions)
    _overlap.check(FUNCTION, arrays)
    return chosen, arrays


def run(backend: str, *, stream=None, **kwargs) -> None:
    """Run a validated records check on ``backend`` (``kwargs``: :func:`verify_canary_records`'s arguments)."""
    if backend == "numpy":
        reference.verify_canary_records(**kwargs)
    else:
        from .launch import records as glue  # needs numba-cuda: imported on the kernel path only

        glue.verify_canary_records(**kwargs, stream=stream)


def verify_canary_records(
    *,
    context,
    slot_indices,
    run_offsets,
    run_start_positions,
    run_prev_slots,
    backend: str = "auto",
    stream=None,
) -> None:
    """Check moved records where they rest: each run of slots against its positions, chain and KV.

    Run ``r`` is entries ``[run_offsets[r], run_offsets[r + 1])`` of ``slot_indices``: the
    slots of consecutive positions from ``run_start_positions[r]``, in order. Each entry is
    checked as verify checks a plan entry, with the entry before it as its predecessor (the
    first entry's is ``run_prev_slots[r]``: negative = the chain starts there, 0 = not
    checked, else a slot) and the expected token unchecked: the chain (bit 1; 128 for a
    predecessor past the buffer), the position (bit 2), the live fingerprint (bit 4). Slot 0
    is skipped; a slot outside the buffer records bit 64. One row per failing entry.
    ``kernel_run_counter`` += 1, ``slot_run_counter`` += n.

    Parameters
    ----------
    context : CanaryContext
        Where the records rest: ``canary_buf`` (only read; on the host tier, rows = host KV
        slots), ring, counters, tag, and the real-KV sources of that place (the host KV on the
        host tier) with their mode.
    slot_indices : int64 [n]
        Every run's slots, run after run.
    run_offsets : int64 [num_runs + 1]
        From 0 to n, never going down (checked for host arrays).
    run_start_positions : int64 [num_runs]
        Position of each run's first slot (>= 0; checked for host arrays).
    run_prev_slots : int64 [num_runs]
        Predecessor slot of each run's first slot.
    backend : {"auto", "numpy", "cuda"}
    stream : CUDA stream, int handle or None

    Raises
    ------
    KvCanaryError
        KVC-K004 … KVC-K007; KVC-V001, KVC-C001 … KVC-C016, KVC-R007 … KVC-R009; KVC-C017.
    """
    handle = stream_handle(FUNCTION, stream)
    kwargs = as_native(
        FUNCTION,
        dict(
            context=context,
            slot_indices=slot_indices,
            run_offsets=run_offsets,
            run_start_positions=run_start_positions,
            run_prev_slots=run_prev_slots,
        ),
    )
    chosen, _ = validate(**kwargs, backend=backend)
    run(chosen, **kwargs, stream=handle)
