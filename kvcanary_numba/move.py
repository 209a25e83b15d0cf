"""The record moves: take canary records out with their KV, put them back at other slots, compact a pool.

Read this file top to bottom, as ``verify.py``: each operation's ``validate_*`` checks every
argument and picks the backend, ``run_*`` dispatches with one explicit ``if`` to the NumPy
specification (:mod:`kvcanary_numba.reference.move`) or to the launch glue
(:mod:`kvcanary_numba.launch.move`, which launches :mod:`kvcanary_numba.kernels.move`), and
the public function is the two in a row. The package's top level exports the same functions
wrapped by the fast wing (``kvcanary_numba/fast/calls.py``).

A *pack* is uint8 ``[n, 32]``: row ``i`` holds the 32-byte record of the ``i``-th moved slot,
in the canary buffer's format (``docs/concepts/moves.md``). Slot values are device data, as
in a plan: a slot outside the buffer is reported as a violation row (bit 64), not rejected.
"""

from __future__ import annotations

import numpy as np

from . import _overlap
from ._validate import ArrayInfo, as_native, check_array, resolve_backend, stream_handle
from .constants import CANARY_SLOT_BYTES
from .context import check_context
from .errors import error
from .reference import move as reference

__all__ = [
    "GATHER",
    "MOVE",
    "SCATTER",
    "check_pack",
    "check_slots",
    "gather_canary_records",
    "move_canary_records",
    "run_gather",
    "run_move",
    "run_scatter",
    "scatter_canary_records",
    "validate_gather",
    "validate_move",
    "validate_scatter",
]

GATHER, SCATTER, MOVE = "gather_canary_records", "scatter_canary_records", "move_canary_records"
#: A pack's rows are read and written as int64 fields.
_FIELD_ALIGN = 8


def check_slots(function: str, argument: str, slots) -> ArrayInfo:
    """Slot indices: int64, 1-D, C-contiguous (their values are device data, not checked)."""
    return check_array(function, argument, slots, dtype=np.int64, ndim=1)


def check_pack(function: str, argument: str, records, n: int, slots_name: str, *, writeable: bool) -> ArrayInfo:
    """A pack: uint8 ``[n, 32]``, C-contiguous, 8-byte aligned (KVC-K001, KVC-K002, array codes)."""
    info = check_array(function, argument, records, dtype=np.uint8, ndim=2, writeable=writeable)
    if info.shape[1] != CANARY_SLOT_BYTES:
        raise error("KVC-K002", function=function, argument=argument, expected=CANARY_SLOT_BYTES, got=info.shape)
    if info.shape[0] != n:
        raise error("KVC-K001", function=function, argument=argument, slots=slots_name, expected=n, got=info.shape[0])
    if info.shape[0] and info.ptr % _FIELD_ALIGN:
        raise error("KVC-C014", function=function, argument=argument, expected=_FIELD_ALIGN, got=info.ptr)
    return info


def _finish(function: str, backend: str, arrays: list) -> tuple[str, list]:
    chosen = resolve_backend(function, backend, arrays)
    _overlap.check(function, arrays)
    return chosen, arrays


# --- gather: take records out -------------------------------------------------------


def validate_gather(*, context, slot_indices, out_records, backend: str = "auto") -> tuple[str, list]:
    """Every check of a gather; returns (backend, every array as (name, ArrayInfo))."""
    arrays = check_context(GATHER, context, writes_buffer=False, needs_chain_flag=False)
    slots = check_slots(GATHER, "slot_indices", slot_indices)
    out = check_pack(GATHER, "out_records", out_records, slots.shape[0], "slot_indices", writeable=True)
    return _finish(GATHER, backend, [*arrays, ("slot_indices", slots), ("out_records", out)])


def run_gather(backend: str, *, context, slot_indices, out_records, stream=None) -> None:
    """Run a validated gather on ``backend``; ``stream`` is a CUDA stream handle or None."""
    if backend == "numpy":
        reference.gather_canary_records(context=context, slot_indices=slot_indices, out_records=out_records)
    else:
        from .launch import move as glue  # needs numba-cuda: imported on the kernel path only

        glue.gather_canary_records(context=context, slot_indices=slot_indices, out_records=out_records, stream=stream)


def gather_canary_records(*, context, slot_indices, out_records, backend: str = "auto", stream=None) -> None:
    """Take the canary records of some slots out into a pack, checking the KV they leave with.

    Row ``i`` of ``out_records`` becomes the 32-byte record of ``slot_indices[i]``. With
    real-KV sources and a mode other than NONE, the live fingerprint of each slot is compared
    with its record: a mismatch records one row with bit 4 (the KV changed before it left).
    Slot 0 (padding) leaves a zero row; a slot outside ``[0, num_slots)`` leaves a zero row
    and records one row with bit 64. ``kernel_run_counter`` += 1, ``slot_run_counter`` += n.

    Parameters
    ----------
    context : CanaryContext
        The pool: ``canary_buf`` uint8 [num_slots, stride] (only read), ring, write index,
        counters, tag, and the real-KV sources and mode of the departure check (NONE: none).
    slot_indices : int64 [n]
        The slots whose records leave, in pack order (a request's slots in position order).
    out_records : uint8 [n, 32]
        The pack, written completely; C-contiguous, 8-byte aligned.
    backend : {"auto", "numpy", "cuda"}
        ``"auto"`` follows the arrays.
    stream : CUDA stream, int handle or None
        Where the kernel is queued (None: CuPy's current stream).

    Raises
    ------
    KvCanaryError
        KVC-K001, KVC-K002; KVC-V001 and the array codes KVC-C001 … KVC-C016; KVC-R007 …
        KVC-R009 for the sources; KVC-C017 (``out_records`` sharing memory with another array).
    """
    handle = stream_handle(GATHER, stream)
    kwargs = as_native(GATHER, dict(context=context, slot_indices=slot_indices, out_records=out_records))
    chosen, _ = validate_gather(**kwargs, backend=backend)
    run_gather(chosen, **kwargs, stream=handle)


# --- scatter: put records back --------------------------------------------------------


def validate_scatter(*, context, records, slot_indices, backend: str = "auto") -> tuple[str, list]:
    """Every check of a scatter; returns (backend, every array as (name, ArrayInfo))."""
    arrays = check_context(SCATTER, context, writes_buffer=True, needs_chain_flag=False)
    slots = check_slots(SCATTER, "slot_indices", slot_indices)
    pack = check_pack(SCATTER, "records", records, slots.shape[0], "slot_indices", writeable=False)
    return _finish(SCATTER, backend, [*arrays, ("records", pack), ("slot_indices", slots)])


def run_scatter(backend: str, *, context, records, slot_indices, stream=None) -> None:
    """Run a validated scatter on ``backend``; ``stream`` is a CUDA stream handle or None."""
    if backend == "numpy":
        reference.scatter_canary_records(context=context, records=records, slot_indices=slot_indices)
    else:
        from .launch import move as glue  # needs numba-cuda: imported on the kernel path only

        glue.scatter_canary_records(context=context, records=records, slot_indices=slot_indices, stream=stream)


def scatter_canary_records(*, context, records, slot_indices, backend: str = "auto", stream=None) -> None:
    """Put a pack of canary records back at (other) slots, checking the KV that landed there.

    The record of ``slot_indices[i]`` becomes row ``i`` of ``records``. Copy the KV first:
    with real-KV sources and a mode other than NONE, the live fingerprint of each landing
    slot is compared with the record put there (a mismatch records one row with bit 4).
    Slot 0 is skipped; a slot outside ``[0, num_slots)`` is not written and records one row
    with bit 64. Two entries naming one slot race on a GPU: keep the slots distinct.
    ``kernel_run_counter`` += 1, ``slot_run_counter`` += n.

    Parameters
    ----------
    context : CanaryContext
        The pool receiving the records: ``canary_buf`` (written), ring, counters, tag, and the
        sources and mode of the landing check.
    records : uint8 [n, 32]
        The pack (as :func:`gather_canary_records` wrote it), only read.
    slot_indices : int64 [n]
        Where each row goes.
    backend : {"auto", "numpy", "cuda"}
    stream : CUDA stream, int handle or None

    Raises
    ------
    KvCanaryError
        KVC-K001, KVC-K002; KVC-V001, KVC-C001 … KVC-C016, KVC-R007 … KVC-R009; KVC-C017
        (``records`` sharing memory with the canary buffer).
    """
    handle = stream_handle(SCATTER, stream)
    kwargs = as_native(SCATTER, dict(context=context, records=records, slot_indices=slot_indices))
    chosen, _ = validate_scatter(**kwargs, backend=backend)
    run_scatter(chosen, **kwargs, stream=handle)


# --- move: compaction within a pool --------------------------------------------------


def validate_move(
    *, context, src_slot_indices, dst_slot_indices, scratch_records, backend: str = "auto"
) -> tuple[str, list]:
    """Every check of a move; returns (backend, every array as (name, ArrayInfo))."""
    arrays = check_context(MOVE, context, writes_buffer=True, needs_chain_flag=False)
    src = check_slots(MOVE, "src_slot_indices", src_slot_indices)
    dst = check_slots(MOVE, "dst_slot_indices", dst_slot_indices)
    if dst.shape[0] != src.shape[0]:
        raise error("KVC-K003", function=MOVE, expected=src.shape[0], got=dst.shape[0])
    scratch = check_pack(MOVE, "scratch_records", scratch_records, src.shape[0], "src_slot_indices", writeable=True)
    arrays += [("src_slot_indices", src), ("dst_slot_indices", dst), ("scratch_records", scratch)]
    return _finish(MOVE, backend, arrays)


def run_move(backend: str, *, context, src_slot_indices, dst_slot_indices, scratch_records, stream=None) -> None:
    """Run a validated move on ``backend``; ``stream`` is a CUDA stream handle or None."""
    kwargs = dict(
        context=context,
        src_slot_indices=src_slot_indices,
        dst_slot_indices=dst_slot_indices,
        scratch_records=scratch_records,
    )
    if backend == "numpy":
        reference.move_canary_records(**kwargs)
    else:
        from .launch import move as glue  # needs numba-cuda: imported on the kernel path only

        glue.move_canary_records(**kwargs, stream=stream)


def move_canary_records(
    *, context, src_slot_indices, dst_slot_indices, scratch_records, backend: str = "auto", stream=None
) -> None:
    """Move canary records within one pool (compaction): slot ``dst[i]`` gets the record of ``src[i]``.

    Every record is read before any is written, so the two sets may overlap (a shift, a swap).
    Move the KV first: with real-KV sources and a mode other than NONE, each destination's
    live fingerprint is compared with the record it receives (bit 4). An entry whose source is
    0 or out of range moves nothing (an out-of-range slot on either side records one row with
    bit 64). Keep destinations distinct. ``kernel_run_counter`` += 1, ``slot_run_counter`` += n.

    Parameters
    ----------
    context : CanaryContext
        The pool: ``canary_buf`` (read and written), ring, counters, tag, sources and mode.
    src_slot_indices : int64 [n]
        Where each record is.
    dst_slot_indices : int64 [n]
        Where it goes (distinct slots).
    scratch_records : uint8 [n, 32]
        Holds the records between the reads and the writes (its contents are overwritten).
    backend : {"auto", "numpy", "cuda"}
    stream : CUDA stream, int handle or None

    Raises
    ------
    KvCanaryError
        KVC-K001, KVC-K002, KVC-K003; KVC-V001, KVC-C001 … KVC-C016, KVC-R007 … KVC-R009;
        KVC-C017 (the scratch sharing memory with another array).
    """
    handle = stream_handle(MOVE, stream)
    kwargs = as_native(
        MOVE,
        dict(
            context=context,
            src_slot_indices=src_slot_indices,
            dst_slot_indices=dst_slot_indices,
            scratch_records=scratch_records,
        ),
    )
    chosen, _ = validate_move(**kwargs, backend=backend)
    run_move(chosen, **kwargs, stream=handle)
