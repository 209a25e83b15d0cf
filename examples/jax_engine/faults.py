"""KV-cache bugs planted into the JAX engine on purpose, and what catching each one means.

Each fault class is a bug a real JAX serving engine can have. A fault is scheduled
for a step and fires at the first step from then on where it can (a premature free
needs a request with a whole page written, ...). When it fires it leaves a
:class:`FaultRecord`: the slots the corruption lands on and the fail-reason bits a
working canary reports there.

============  =================================================================  ===========
class         the bug                                                            needs
============  =================================================================  ===========
kv_flip       one byte of a running request's cached K (layer 0) is changed      real-KV
              through a JAX update between two steps                             sources
table_slip    one ``req_to_token`` entry of a running request, on the device,    --
              points at another request's slot
slot_reuse    a page a running request still uses is freed and handed to         --
              another request, whose forward writes its own KV there
token_flip    the model is fed a wrong token id for one new token                --
position_flip one new token is fed with position + 1                             --
============  =================================================================  ===========
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvcanary_numba import FailReason

__all__ = ["FAULT_CLASSES", "REAL_KV_FAULTS", "FaultInjector", "FaultRecord"]

F = FailReason
_SEEN_BY_VERIFY = (
    F.VERIFY_CHAIN_HASH_MISMATCH | F.VERIFY_POSITION_MISMATCH | F.VERIFY_TOKEN_MISMATCH | F.VERIFY_REAL_KV_HASH_MISMATCH
)

#: Fault class -> (what goes wrong, the bits that count as catching it).
FAULT_CLASSES: dict[str, tuple[str, FailReason]] = {
    "kv_flip": (
        "one byte of a running request's cached K changes through a JAX update",
        F.VERIFY_REAL_KV_HASH_MISMATCH,
    ),
    "table_slip": (
        "a req_to_token entry of a running request points at another request's slot",
        _SEEN_BY_VERIFY | F.WRITE_POSITION_MISMATCH,
    ),
    "slot_reuse": ("a page still in use is freed early and another request's KV is written into it", _SEEN_BY_VERIFY),
    "token_flip": (
        "the model is fed a wrong token id for one new token",
        F.WRITE_TOKEN_MISMATCH | F.VERIFY_TOKEN_MISMATCH,
    ),
    "position_flip": (
        "one new token is fed with position + 1 (off by one)",
        F.WRITE_POSITION_MISMATCH | F.VERIFY_POSITION_MISMATCH,
    ),
}
#: Faults only real-KV fingerprints can see (the bytes change; no record or table does).
REAL_KV_FAULTS = frozenset({"kv_flip"})


@dataclass(frozen=True)
class FaultRecord:
    """A fault that fired: its class, step, the slots it hit and the bits that catch it."""

    kind: str
    step: int
    slots: tuple[int, ...]
    bits: FailReason
    detail: str

    def caught_by(self, violation) -> bool:
        """Whether a :class:`~kvcanary_numba.Violation` reports this fault: one of its slots, a
        catching bit, found no earlier than the fault fired."""
        return violation.step >= self.step and violation.slot_idx in self.slots and bool(violation.bits & self.bits)


def _remaining(req) -> int:
    """Tokens ``req`` still generates (each is one more step)."""
    return req.max_new - (len(req.tokens) - req.prompt_len)


class FaultInjector:
    """Fires scheduled faults into a :class:`~.engine.JaxEngine` at its hook points.

    Parameters
    ----------
    engine : JaxEngine
    schedule : dict of str to int
        Fault class -> first step it may fire.
    """

    def __init__(self, engine, schedule: dict[str, int]):
        unknown = set(schedule) - set(FAULT_CLASSES)
        if unknown:
            raise ValueError(f"FaultInjector: unknown fault classes {sorted(unknown)}; known: {sorted(FAULT_CLASSES)}")
        self.engine, self.pending = engine, dict(schedule)
        self.records: list[FaultRecord] = []
        self._armed_page: int | None = None

    def _due(self, kind: str, step: int) -> bool:
        return kind in self.pending and step >= self.pending[kind]

    def _record(self, kind: str, step: int, slots, detail: str) -> None:
        del self.pending[kind]
        self.records.append(FaultRecord(kind, step, tuple(int(s) for s in slots), FAULT_CLASSES[kind][1], detail))

    def _lasting(self, min_kv: int, steps: int = 2):
        """A running request with ``min_kv`` positions written that runs at least ``steps`` more steps
        (so that the canary verifies its prefix again after the fault)."""
        for req in self.engine.sched.running:
            if req.kv_len >= min_kv and _remaining(req) >= steps:
                return req
        return None

    # --- before the scheduler allocates this step's slots ------------------------------
    def before_schedule(self, step: int) -> None:
        sched, ps = self.engine.sched, self.engine.config.page_size
        if self._due("slot_reuse", step) and self._armed_page is None:
            for req in sched.running:
                full = [pg for i, pg in enumerate(req.pages) if (i + 1) * ps <= req.kv_len]
                # Room for the hand-over to happen (at the next page another request opens) and be verified.
                if full and _remaining(req) >= 4:
                    sched.pages.hand_over = (full[0], req.rid)  # the next other request to allocate gets it
                    self._armed_page = full[0]
                    break

    # --- after scheduling: the host batch, before anything reaches the device --------
    def after_schedule(self, step: int, batch) -> None:
        page, ps = self._armed_page, self.engine.config.page_size
        if page is not None and self.engine.sched.pages.hand_over is None:
            self._armed_page = None
            slots = range(page * ps, (page + 1) * ps)
            self._record("slot_reuse", step, slots, f"page {page} handed to a second request")
        for kind in ("token_flip", "position_flip"):
            if self._due(kind, step):
                self._flip_input(kind, step, batch)

    def _flip_input(self, kind: str, step: int, batch) -> None:
        ends = batch.offsets[1:]
        for r, req in enumerate(batch.requests):
            if _remaining(req) >= 2 and batch.extend_seq_lens[r] > 0:
                i = int(ends[r] - 1)
                if kind == "token_flip":
                    batch.input_ids[i] = batch.input_ids[i] % (self.engine.model.vocab_size - 1) + 1
                else:
                    batch.positions[i] += 1
                self._record(kind, step, [batch.out_cache_loc[i]], f"token {i} of the step")
                return

    # --- after the page table was written on the device ----------------------------------
    def after_table(self, step: int, req_to_token):
        """Returns the (possibly corrupted) device page table."""
        if not self._due("table_slip", step):
            return req_to_token
        victim = self._lasting(min_kv=2)
        others = [r for r in self.engine.sched.running if r is not victim and r.kv_len > 0]
        if victim is None or not others:
            return req_to_token
        p, target = victim.kv_len - 2, others[0].slots[0]
        self._record("table_slip", step, (target, victim.slots[p + 1]), f"row {victim.row} position {p} -> {target}")
        return req_to_token.at[victim.row, p].set(target)

    # --- after the TAIL launches: the pool as the next step will read it -----------------
    def after_forward(self, step: int) -> None:
        if not self._due("kv_flip", step):
            return
        victim = self._lasting(min_kv=1)
        if victim is None:
            return
        slot, engine = victim.slots[0], self.engine
        k0 = engine.k_pool[0]
        # A functional update: a new buffer, which the engine keeps using from now on.
        engine.k_pool[0] = k0.at[slot, 0, 0].set(k0[slot, 0, 0] ^ np.array(0xFF, k0.dtype))
        self._record("kv_flip", step, [slot], f"K layer 0 of slot {slot}, low byte of the first element")

    def catches(self, violations) -> dict[str, list]:
        """Fault class -> the violations that report it (empty: missed)."""
        return {f.kind: [v for v in violations if f.caught_by(v)] for f in self.records}
