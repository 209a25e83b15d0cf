"""The hand-off digest: ``compute_handoff_digest``, one value per request, free of slot numbers.

:func:`validate` checks, :func:`run` dispatches with one explicit ``if`` to the NumPy
specification (:mod:`kvcanary_numba.reference.digest`, which defines the value) or the launch
glue (:mod:`kvcanary_numba.launch.digest`). Both sides of a hand-off compute it from their
own records and live KV and compare (:mod:`kvcanary_numba.handoff`).
"""

from __future__ import annotations

import numpy as np

from . import _overlap
from ._validate import as_native, check_array, resolve_backend, stream_handle
from .context import check_context
from .move import check_pack, check_slots
from .records import check_run_values, check_runs
from .reference import digest as reference

__all__ = ["FUNCTION", "compute_handoff_digest", "run", "validate"]

FUNCTION = "compute_handoff_digest"


def validate(
    *, context, slot_indices, run_offsets, out_digests, out_records=None, backend: str = "auto"
) -> tuple[str, list]:
    """Every check of a digest call; returns (backend, every array as (name, ArrayInfo))."""
    arrays = check_context(FUNCTION, context, writes_buffer=False, needs_chain_flag=False)
    slots = check_slots(FUNCTION, "slot_indices", slot_indices)
    arrays += [("slot_indices", slots), *check_runs(FUNCTION, slots.shape[0], run_offsets, {})]
    runs = arrays[-1][1].shape[0] - 1
    out = check_array(
        FUNCTION,
        "out_digests",
        out_digests,
        dtype=np.int64,
        ndim=1,
        shape=(runs,),
        shape_of="run_offsets[1:]",
        writeable=True,
    )
    arrays.append(("out_digests", out))
    if out_records is not None:
        pack = check_pack(FUNCTION, "out_records", out_records, slots.shape[0], "slot_indices", writeable=True)
        arrays.append(("out_records", pack))
    chosen = resolve_backend(FUNCTION, backend, arrays)
    check_run_values(FUNCTION, slots.shape[0], run_offsets)
    _overlap.check(FUNCTION, arrays)
    return chosen, arrays


def run(backend: str, *, context, slot_indices, run_offsets, out_digests, out_records=None, stream=None) -> None:
    """Run a validated digest call on ``backend``; ``stream`` is a CUDA stream handle or None."""
    kwargs = dict(
        context=context,
        slot_indices=slot_indices,
        run_offsets=run_offsets,
        out_digests=out_digests,
        out_records=out_records,
    )
    if backend == "numpy":
        reference.compute_handoff_digest(**kwargs)
    else:
        from .launch import digest as glue  # needs numba-cuda: imported on the kernel path only

        glue.compute_handoff_digest(**kwargs, stream=stream)


def compute_handoff_digest(
    *, context, slot_indices, run_offsets, out_digests, out_records=None, backend: str = "auto", stream=None
) -> None:
    """The hand-off digest of each run (a request's slots in position order): records and live KV.

    Entry ``e`` of a run (its index in the run) contributes
    ``splitmix64(mix3(mix3(HANDOFF_DIGEST_ANCHOR ^ e, token, position), prev_hash,
    real_kv_hash) ^ live)`` from its slot's record and the slot's live fingerprint (0 in NONE
    mode); a run's digest is the sum of its entries' values modulo 2**64. The value depends on
    what the slots hold and in which order, not on which slots they are: two engines (or a
    pool and its host copy) holding the same request compute the same digests. Slot 0
    contributes nothing; a slot outside the buffer contributes nothing and records a bit-64
    row. The same value on every backend. ``kernel_run_counter`` += 1, ``slot_run_counter`` += n.

    With ``out_records`` the call is also :func:`~kvcanary_numba.gather_canary_records`: the
    same pack, departure check, rows and counters as that call followed by this one, in one
    pass over the records and the KV (an offload's take-out and digest).

    Parameters
    ----------
    context : CanaryContext
        Where the records are (``canary_buf``, only read), the real-KV sources and mode of the
        live fingerprint, and the ring and counters.
    slot_indices : int64 [n]
        Every run's slots, run after run, each in position order.
    run_offsets : int64 [num_runs + 1]
        Run ``r`` is entries ``[run_offsets[r], run_offsets[r + 1])``: 0 to n, never going down
        (checked for host arrays).
    out_digests : int64 [num_runs]
        Receives each run's digest (uint64 bits as int64), written completely.
    out_records : uint8 [n, 32], optional
        Receives the records of ``slot_indices`` (a pack: C-contiguous, 8-byte aligned), as
        :func:`~kvcanary_numba.gather_canary_records` writes it.
    backend : {"auto", "numpy", "cuda"}
    stream : CUDA stream, int handle or None

    Raises
    ------
    KvCanaryError
        KVC-K004 … KVC-K006; KVC-K001, KVC-K002 for ``out_records``; KVC-V001, KVC-C001 … KVC-C016,
        KVC-R007 … KVC-R009; KVC-C017.
    """
    handle = stream_handle(FUNCTION, stream)
    kwargs = as_native(
        FUNCTION,
        dict(
            context=context,
            slot_indices=slot_indices,
            run_offsets=run_offsets,
            out_digests=out_digests,
            out_records=out_records,
        ),
    )
    chosen, _ = validate(**kwargs, backend=backend)
    run(chosen, **kwargs, stream=handle)
