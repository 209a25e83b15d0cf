"""Specification of the hand-off digest (``kernels/digest.py``): one value per run, free of slot numbers.

When KV goes from one pool to another (a prefill engine to a decode engine, a host copy back
to the device), both sides can reduce each request's records and live KV to one 64-bit
value and compare: the value depends on what the slots hold, in position order, and not on
which slots they are. Run ``r`` is entries ``[run_offsets[r], run_offsets[r + 1])`` of
``slot_indices`` (a request's slots in position order, as the page table lists them; the
offsets run from 0 to ``n`` without going down). Entry ``e`` of a run (its index in the run)
holding the record ``(token, position, prev_hash, real_kv_hash)`` and whose slot's live KV
fingerprints to ``live`` contributes::

    a = mix3(HANDOFF_DIGEST_ANCHOR ^ e, token, position)
    h = splitmix64(mix3(a, prev_hash, real_kv_hash) ^ live)

and the run's digest is the sum of its entries' ``h`` modulo 2**64 (stored as int64). ``e``
makes the value depend on the order (two swapped pages change it), the record fields on
every record byte, ``live`` on the KV bytes the mode folds (0 in NONE mode: records only).
A sum is the same whatever order the entries are added in, so the GPU adds in parallel and
gets the CPU's value. Slot 0 (padding, an SWA slot outside the window) contributes nothing;
a slot outside ``[0, num_slots)`` contributes nothing and records a bit-64 row.
``kernel_run_counter`` += 1, ``slot_run_counter`` += ``n``.

With ``out_records`` the call first does what :func:`.move.gather_canary_records` does (the
pack, its rows and its counters): an offload takes its records out and computes their digest
in one call, and the kernel in one pass over the records and the KV.
"""

from __future__ import annotations

import numpy as np

from ..constants import (
    FIELD_POSITION,
    FIELD_PREV_HASH,
    FIELD_REAL_KV_HASH,
    FIELD_TOKEN,
    HANDOFF_DIGEST_ANCHOR,
)
from .live import live_fingerprints, mix_into
from .move import gather_canary_records, range_rows, record_in_order, slot_classes
from .ring import bump, canary_fields

__all__ = ["compute_handoff_digest", "entry_hashes", "entry_terms", "finish", "run_index"]

_ANCHOR = np.uint64(HANDOFF_DIGEST_ANCHOR)


def entry_hashes(index: np.ndarray, fields: np.ndarray, live: np.ndarray) -> np.ndarray:
    """``h`` of each entry: uint64 [k] from its index in its run (int64 [k]), record fields
    (int64 [k, 4]) and live fingerprint (uint64 [k])."""
    f = fields.view(np.uint64)
    h, scratch = np.zeros(index.shape[0], dtype=np.uint64), np.empty(index.shape[0], dtype=np.uint64)
    # mix3(a, b, c) = S(S(S(0 ^ a) ^ b) ^ c): six steps for the two mix3, one for the live fingerprint.
    for word in (index.view(np.uint64) ^ _ANCHOR, f[:, FIELD_TOKEN], f[:, FIELD_POSITION]):
        mix_into(h, word, scratch)
    a = h.copy()
    h[...] = 0
    for word in (a, f[:, FIELD_PREV_HASH], f[:, FIELD_REAL_KV_HASH], live):
        mix_into(h, word, scratch)
    return h


def run_index(slots: np.ndarray, run_offsets) -> np.ndarray:
    """Each entry's index in its run (int64 [n]), from a valid run table."""
    offsets = np.asarray(run_offsets, dtype=np.int64)
    run = np.repeat(np.arange(offsets.shape[0] - 1), np.diff(offsets))
    return np.arange(slots.shape[0], dtype=np.int64) - offsets[run]


def entry_terms(context, slots: np.ndarray, index: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """(``h`` of entries ``[lo, hi)`` as uint64 [hi - lo], 0 where skipped; their rows ``[k, 9]``)."""
    records = canary_fields(context.canary_buf)
    mine = slots[lo:hi]
    live, bad = slot_classes(mine, records.shape[0])
    h = np.zeros(mine.shape[0], dtype=np.uint64)
    entries = np.flatnonzero(live)
    fingerprints = live_fingerprints(context.real_kv_sources, context.real_kv_hash_mode, mine[entries])
    fields = np.take(records, mine[entries], axis=0)[:, :4]
    h[entries] = entry_hashes(index[lo:hi][entries], fields, fingerprints)
    return h, range_rows(context, lo + np.flatnonzero(bad), mine[bad])


def finish(context, out_digests, run_offsets, parts) -> None:
    """Sum the entry hashes of ``parts`` (:func:`entry_terms` of consecutive ranges) per run, record the rows."""
    h = np.concatenate([part[0] for part in parts])
    offsets = np.asarray(run_offsets, dtype=np.int64)
    sums = np.zeros(h.shape[0] + 1, dtype=np.uint64)
    np.cumsum(h, out=sums[1:])  # uint64 arithmetic wraps modulo 2**64
    out_digests[...] = (sums[offsets[1:]] - sums[offsets[:-1]]).view(np.int64)
    record_in_order(context, *(part[1] for part in parts))


def compute_handoff_digest(*, context, slot_indices, run_offsets, out_digests, out_records=None) -> None:
    """Write the digest of every run into ``out_digests`` (and, given ``out_records``, gather first).

    Parameters
    ----------
    context : CanaryContext
        NumPy arrays: the canary buffer holding the records (only read), the real-KV sources
        and mode of the live fingerprint; ring, write index and counters are updated.
    slot_indices : int64 [n]
        Every run's slots, run after run, each in position order.
    run_offsets : int64 [num_runs + 1]
        Run ``r`` is entries ``[run_offsets[r], run_offsets[r + 1])``.
    out_digests : int64 [num_runs]
        Receives each run's digest (uint64 bits as int64).
    out_records : uint8 [n, 32] or None
        Receives the records of ``slot_indices``, as :func:`.move.gather_canary_records`.
    """
    if out_records is not None:
        gather_canary_records(context=context, slot_indices=slot_indices, out_records=out_records)
    slots = np.asarray(slot_indices, dtype=np.int64)
    bump(context.kernel_run_counter, 1)
    bump(context.slot_run_counter, slots.shape[0])
    index = run_index(slots, run_offsets)
    finish(context, out_digests, run_offsets, [entry_terms(context, slots, index, 0, slots.shape[0])])
