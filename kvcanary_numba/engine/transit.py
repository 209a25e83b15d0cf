"""KV in transit: a run of slots leaves the pool with its canary records and lands elsewhere.

:func:`capture` copies the KV of some slots (every layer, K and V) to host memory and takes
their records out of the monitor (``CanaryMonitor.take_records``: the records are checked
against the KV they leave with). :func:`land` copies both into other slots
(``put_records``: checked against the KV where it lands), then checks the landed run where
the page table says it is (``verify_records``: positions, chain links and live KV). The
host tier (:mod:`.host_tier`) and a prefill -> decode pair (:mod:`.pair`) move KV through
these two; the faults of :data:`~.faults.TRANSIT_FAULT_CLASSES` are planted in :func:`land`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..monitor import MovedRecords

__all__ = ["Cargo", "LANDING_FAULTS", "capture", "land", "landing_run"]

#: Faults planted while a run lands (the others act on the host copy: :mod:`.host_tier`).
LANDING_FAULTS = ("pages_swapped", "page_missing", "records_left_behind", "wrong_reload_slots")


def _host(array) -> np.ndarray:
    return array if isinstance(array, np.ndarray) else array.get()


@dataclass
class Cargo:
    """A run of slots in host memory: its KV per layer (uint8 ``[n, bytes_per_token]`` each) and its
    records (host packs; None when the engine has no monitor)."""

    k: list[np.ndarray]
    v: list[np.ndarray]
    records: MovedRecords | None

    @property
    def num_slots(self) -> int:
        return self.k[0].shape[0]

    def rows(self, keep: np.ndarray) -> Cargo:
        """The rows ``keep`` of the run (a copy)."""
        records = None
        if self.records is not None:
            records = MovedRecords({name: p[keep] for name, p in self.records.records.items()}, len(keep))
        return Cargo([a[keep] for a in self.k], [a[keep] for a in self.v], records)


def capture(engine, slots, run_offsets=None) -> Cargo:
    """Copy the KV of ``slots`` to host memory and take their records (call between steps, before the
    slots are freed); with ``run_offsets`` (on the engine's device) the records carry the runs'
    hand-off digest, computed in the same pass."""
    xp, pool = engine.xp, engine.kv
    index = xp.asarray(np.asarray(slots, dtype=np.int64))
    records = None if engine.monitor is None else engine.monitor.take_records(index, run_offsets).to_host()
    k = [_host(pool._token_view(a)[index]).copy() for a in pool.k]
    v = [_host(pool._token_view(a)[index]).copy() for a in pool.v]
    return Cargo(k, v, records)


def landing_run(slots) -> tuple[np.ndarray, ...]:
    """The run table of one prefix at ``slots`` (positions from 0, the chain's head)."""
    n = len(slots)
    return (
        np.asarray(slots, dtype=np.int64),
        np.array([0, n], dtype=np.int64),
        np.zeros(1, dtype=np.int64),
        np.full(1, -1, dtype=np.int64),
    )


def land(engine, cargo: Cargo, slots, *, fault: str | None = None, elsewhere=None) -> list[int]:
    """Copy ``cargo`` into ``slots`` (row ``i`` to ``slots[i]``) with its records, then check the run
    where the page table says it is (``slots``). Returns the FULL slots a planted ``fault`` hit.

    ``fault`` (one of :data:`LANDING_FAULTS`) plants a transit bug: ``pages_swapped`` lands the
    first two pages in each other's slots, ``page_missing`` drops the second page (the first when
    there is one), ``records_left_behind`` lands the KV only, ``wrong_reload_slots`` lands at
    ``elsewhere`` (slots the page table does not name).
    """
    ps, n = engine.config.page_size, cargo.num_slots
    target = np.asarray(slots, dtype=np.int64).copy()
    rows, hit, put = np.arange(n), [], True
    pages = -(-n // ps)
    if fault == "pages_swapped" and pages >= 2:
        a, b = np.arange(0, ps), np.arange(ps, min(2 * ps, n))
        target[a[: len(b)]], target[b] = target[b].copy(), target[a[: len(b)]].copy()
        hit = [int(s) for s in np.asarray(slots)[: ps + len(b)]]
    elif fault == "page_missing":
        lost = np.arange(ps, min(2 * ps, n)) if pages >= 2 else np.arange(0, min(ps, n))
        rows = np.setdiff1d(rows, lost)
        hit = [int(s) for s in np.asarray(slots)[lost]]
    elif fault == "records_left_behind":
        put, hit = False, [int(s) for s in slots]
    elif fault == "wrong_reload_slots":
        target, hit = np.asarray(elsewhere, dtype=np.int64), [int(s) for s in slots]
    cargo, target = cargo.rows(rows), target[rows]
    xp, pool = engine.xp, engine.kv
    index = xp.asarray(target)
    for arrays, layers in ((pool.k, cargo.k), (pool.v, cargo.v)):
        for array, data in zip(arrays, layers):
            pool._token_view(array)[index] = xp.asarray(data)
    monitor = engine.monitor
    if monitor is not None:
        if put:
            monitor.put_records(cargo.records.to_device(xp), index)
        monitor.verify_records(*(xp.asarray(a) for a in landing_run(slots)))
    return hit
