"""Fault injection: real classes of KV-cache bugs, planted into the toy engine on purpose.

Each fault is scheduled for a step and fires at the first step from then on
where it can (e.g. a stale-page fault needs a cached prefix nobody uses). When
it fires it leaves a :class:`FaultRecord`: where the corruption is and which
fail-reason bits a working canary must report there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..constants import FailReason
from ..monitor.report import Violation

__all__ = ["ALL_FAULT_CLASSES", "FAULT_CLASSES", "TRANSIT_FAULT_CLASSES", "FaultRecord", "FaultInjector"]

F = FailReason
_SEEN_BY_VERIFY = (
    F.VERIFY_CHAIN_HASH_MISMATCH | F.VERIFY_POSITION_MISMATCH | F.VERIFY_TOKEN_MISMATCH | F.VERIFY_REAL_KV_HASH_MISMATCH
)

#: Fault class -> (one-line description, bits that count as catching it).
FAULT_CLASSES: dict[str, tuple[str, FailReason]] = {
    "token_flip": (
        "the forward is fed a wrong token id for one new token",
        F.WRITE_TOKEN_MISMATCH | F.VERIFY_TOKEN_MISMATCH,
    ),
    "position_flip": (
        "one new token is written with position + 1 (off by one)",
        F.WRITE_POSITION_MISMATCH | F.VERIFY_POSITION_MISMATCH,
    ),
    "slot_reuse": ("the allocator hands a page still owned by a running request to another one", _SEEN_BY_VERIFY),
    "stale_page": ("a cached prefix is freed but stays in the prefix index; a new request hits it", _SEEN_BY_VERIFY),
    "kv_byte_flip": ("one KV byte of a running request changes after it was written", F.VERIFY_REAL_KV_HASH_MISMATCH),
    "cached_kv_flip": (
        "one KV byte of an idle cached prefix changes (only a sweep looks there)",
        F.VERIFY_REAL_KV_HASH_MISMATCH,
    ),
    "req_to_token": (
        "a req_to_token entry of a running request is trampled to another slot",
        _SEEN_BY_VERIFY | F.WRITE_POSITION_MISMATCH,
    ),
}

#: Faults of KV in transit (the host tier's reloads, :mod:`.host_tier`; a pair's hand-off, :mod:`.pair`):
#: the records move with their KV (:mod:`.transit`), and the landed runs are checked where the page table says.
TRANSIT_FAULT_CLASSES: dict[str, tuple[str, FailReason]] = {
    "host_bit_flip": (
        "one KV byte of a prefix changes while it rests in host memory",
        F.VERIFY_REAL_KV_HASH_MISMATCH,
    ),
    "stale_host_copy": ("a prefix is reloaded from host memory that another prefix's offload reused", _SEEN_BY_VERIFY),
    "pages_swapped": ("two pages of a reload land in each other's slots (KV and records alike)", _SEEN_BY_VERIFY),
    "page_missing": ("one page of a reload never arrives (neither its KV nor its records)", _SEEN_BY_VERIFY),
    "records_left_behind": ("a reload copies the KV but leaves its canary records behind", _SEEN_BY_VERIFY),
    "wrong_reload_slots": ("a reload lands in other slots than the page table names", _SEEN_BY_VERIFY),
}

#: Every fault class the toy engine plants: in the pool, then in transit.
ALL_FAULT_CLASSES: dict[str, tuple[str, FailReason]] = {**FAULT_CLASSES, **TRANSIT_FAULT_CLASSES}


@dataclass(frozen=True, slots=True)
class FaultRecord:
    """A fault that fired: kind, step, the FULL (and SWA) slots it hit, and the bits that catch it."""

    kind: str
    step: int
    slots: tuple[int, ...]
    swa_slots: tuple[int, ...]
    bits: FailReason
    detail: str

    def caught_by(self, violation: Violation) -> bool:
        """True when the violation reports this fault: right slot (of its group), a catching bit, not earlier."""
        slots = self.swa_slots if violation.group == "SWA" else self.slots
        return violation.step >= self.step and violation.slot_idx in slots and bool(violation.bits & self.bits)


class FaultInjector:
    """Fires the scheduled faults into a :class:`~kvcanary_numba.engine.ToyEngine`."""

    def __init__(self, engine, schedule: dict[str, int]):
        self.engine = engine
        self.pending = dict(schedule)  # kind -> first step it may fire
        self.records: list[FaultRecord] = []
        self._armed: dict[str, object] = {}  # faults fired in two halves (before / after scheduling)

    def due(self, kind: str, step: int) -> bool:
        """Whether ``kind`` is scheduled and may fire at ``step``."""
        return kind in self.pending and step >= self.pending[kind]

    def fired(self, kind: str, step: int, slots, detail: str) -> None:
        """Record that ``kind`` fired at ``step``, hitting FULL ``slots`` (it fires once)."""
        del self.pending[kind]
        lut = self.engine.sched.lut
        swa = tuple(int(lut[s]) for s in slots if lut[s]) if self.engine.sched.swa is not None else ()
        bits = ALL_FAULT_CLASSES[kind][1]
        self.records.append(FaultRecord(kind, step, tuple(int(s) for s in slots), swa, bits, detail))

    def _victim(self, min_kv: int = 1):
        """A running request verified again next step (not finishing now), with some KV written."""
        for req in self.engine.sched.running:
            if req.kv_len >= min_kv and req.remaining >= 2:
                return req
        return None

    # --- before the scheduler allocates this step's slots ---------------------------
    def before_schedule(self, step: int) -> None:
        sched, ps = self.engine.sched, self.engine.config.page_size
        if self.due("slot_reuse", step) and "slot_reuse" not in self._armed:
            for req in sched.running:
                written = set(req.slots[: req.kv_len])
                full_pages = [pg for pg in req.pages if all(pg * ps + j in written for j in range(ps))]
                if req.remaining >= 2 and full_pages:
                    sched.pages.forced = (full_pages[0], req.rid)
                    self._armed["slot_reuse"] = full_pages[0]
                    break
        if self.due("stale_page", step) and "stale_page" not in self._armed:
            idle = [e for e in sched.entries.values() if e.refs == 0]
            if idle and len(sched.running) < self.engine.config.max_running:
                sched.evict_prefix(idle[0], keep_index=True)
                sched.forced_prefix = idle[0].prefix_id
                self._armed["stale_page"] = idle[0]
        if self.due("req_to_token", step):
            victim = self._victim(min_kv=2)
            others = [r for r in sched.running if r is not victim and r.kv_len > 0]
            if victim is not None and others:
                p, target = victim.kv_len - 1, others[0].slots[0]
                sched.req_to_token[victim.row, p] = target
                self._armed["req_to_token"] = (victim, target)

    # --- after scheduling, before the forward ----------------------------------------
    def after_schedule(self, step: int, batch) -> None:
        sched, ps = self.engine.sched, self.engine.config.page_size
        page = self._armed.get("slot_reuse")
        if page is not None and sched.pages.forced is None:
            hit = [int(s) for s in batch.out_cache_loc if s // ps == page]
            del self._armed["slot_reuse"]
            self.fired("slot_reuse", step, hit, f"page {page} given to a second request")
        entry = self._armed.get("stale_page")
        if entry is not None and sched.forced_prefix is None:
            del self._armed["stale_page"]
            sched.entries.pop(entry.prefix_id, None)  # the stale entry served one hit; drop it
            self.fired("stale_page", step, entry.slots, f"freed prefix {entry.prefix_id} reused")
        armed = self._armed.pop("req_to_token", None)
        if armed is not None:
            victim, target = armed
            new_slot = victim.slots[victim.kv_len]
            self.fired(
                "req_to_token", step, (target, new_slot), f"row {victim.row} pos {victim.kv_len - 1} -> {target}"
            )
        for kind in ("token_flip", "position_flip"):
            if self.due(kind, step):
                self._flip_input(kind, step, batch)

    def _flip_input(self, kind: str, step: int, batch) -> None:
        offsets = np.concatenate([[0], np.cumsum(batch.extend_seq_lens)])
        for r, req in enumerate(batch.requests):
            if req.remaining >= 2 and batch.extend_seq_lens[r] > 0:
                i = int(offsets[r + 1] - 1)
                if kind == "token_flip":
                    batch.input_ids[i] = batch.input_ids[i] % (self.engine.config.vocab_size - 1) + 1
                else:
                    batch.positions[i] += 1
                self.fired(kind, step, [batch.out_cache_loc[i]], f"token {i} of the batch")
                return

    # --- after the TAIL launches -------------------------------------------------------
    def after_forward(self, step: int) -> None:
        engine = self.engine
        if self.due("kv_byte_flip", step):
            victim = self._victim()
            if victim is not None:
                self._flip_kv("kv_byte_flip", step, victim.slots[-1])
        if self.due("cached_kv_flip", step):
            idle = [e for e in engine.sched.entries.values() if e.refs == 0]
            if idle:
                self._flip_kv("cached_kv_flip", step, idle[0].slots[-1])

    def _flip_kv(self, kind: str, step: int, slot: int) -> None:
        engine = self.engine
        engine.kv.flip_byte(slot)
        swa_slot = int(engine.sched.lut[slot])
        if engine.swa_kv is not None and swa_slot:
            engine.swa_kv.flip_byte(swa_slot)
        self.fired(kind, step, [slot], f"K layer 0 byte 0 of slot {slot}")
