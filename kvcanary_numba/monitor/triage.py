"""Triage of a violation: what class of bug its bits point at, and whether it persists.

Two independent judgements are made for every violation row:

* **diagnosis**, from the fail-reason bits and the launch tag alone (no state):

  ==================  ===============================================  ==============================
  category            bits                                             usual causes
  ==================  ===============================================  ==============================
  ``out_of_range``    any of 64 / 128 / 256 (extensions)               corrupt req_to_token, SWA LUT
                                                                       or batch offsets
  ``write_path``      8 / 16 (write asserts), no verify bit            the forward fed a wrong token
                                                                       or position
  ``addressing``      1 / 2 / 32 (chain, position, token), with or     page table, slot reuse,
                      without 4                                        prefix-cache mix-up
  ``data_corruption`` 4 only (real-KV fingerprint)                     KV bytes changed after the write
  ==================  ===============================================  ==============================

* **persistence**, from a re-check of the slot one step after the row was read
  back (:func:`recheck_row`): the row's comparison is evaluated again against
  the slot's current canary record (and, for a real-KV row, the slot's live
  fingerprint). ``persistent``: the mismatch is still there; ``transient``: it
  went away (the slot was rewritten or the KV bytes restored). Rows without an
  in-range slot stay ``unchecked``; rows not re-checked yet are ``pending``.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from dataclasses import dataclass

import numpy as np

from ..constants import EXTENSION_FAIL_REASON_MASK, FailReason, RealKvHashMode
from ..fast.calls import compute_real_kv_hash
from ..hashing import to_unsigned

__all__ = [
    "BLIND_SPOT_MESSAGE",
    "CATEGORIES",
    "PERSISTENCE",
    "CanaryBlindSpotWarning",
    "Diagnosis",
    "Rechecker",
    "diagnose",
    "read_slots",
    "recheck_row",
    "rewritten",
    "slot_view",
    "warn_blind_spot",
]

logger = logging.getLogger("kvcanary_numba.monitor")

F = FailReason

#: Category -> one-line meaning (the docs' triage table repeats these).
CATEGORIES: dict[str, str] = {
    "addressing": "addressing bug: the slot does not hold the record the plan expects (page table, slot reuse, "
    "prefix-cache mix-up)",
    "data_corruption": "data corruption: the record is right but the live KV bytes changed after the write",
    "write_path": "write-path bug: the forward was fed a token or position the oracle did not expect",
    "out_of_range": "out-of-range index: a slot, predecessor or token range outside the buffers was requested "
    "(corrupt req_to_token, SWA LUT or batch offsets)",
    "unknown": "no bit this version knows",
}
#: Values of ``Violation.persistence``.
PERSISTENCE = ("pending", "persistent", "transient", "unchecked")

_ADDRESS = F.VERIFY_CHAIN_HASH_MISMATCH | F.VERIFY_POSITION_MISMATCH | F.VERIFY_TOKEN_MISMATCH
_WRITE = F.WRITE_TOKEN_MISMATCH | F.WRITE_POSITION_MISMATCH


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """Category of a violation and the most likely cause, in one sentence."""

    category: str
    cause: str

    @property
    def meaning(self) -> str:
        return CATEGORIES[self.category]


def _addressing_cause(bits: FailReason, stage: str) -> str:
    if bits & F.VERIFY_POSITION_MISMATCH:
        return (
            "the slot holds a record of another position: req_to_token points at a slot of another "
            "sequence or position, the slot was reused by another request, or a freed page is still "
            "referenced (stale page / prefix-cache entry)"
        )
    if bits & F.VERIFY_CHAIN_HASH_MISMATCH:
        where = " (seen by a sweep: a cached prefix)" if stage == "SWEEP" else ""
        return (
            "the slot's record does not continue its predecessor's chain: req_to_token points at a slot "
            f"of another sequence, or a prefix-cache hit mixed two sequences{where}"
        )
    return (
        "the slot holds a record of the right position but another token: a prefix-cache hit on a "
        "different prompt, or the slot was rewritten with another sequence's token"
    )


def diagnose(fail_reason: int, tag: str = "", *, rewritten: bool = False) -> Diagnosis:
    """Diagnosis of one row from its fail-reason bits (and launch tag name, for the stage).

    Parameters
    ----------
    fail_reason : int
        The row's ``fail_reason`` field (signed or unsigned int64).
    tag : str
        Launch tag name such as ``TAIL_K_FULL`` (only its stage is used).
    rewritten : bool
        The re-check found the slot holding another record (see :func:`rewritten`): a real-KV-only
        row then hints at slot reuse.
    """
    raw = to_unsigned(fail_reason)
    bits = F(raw & sum(b.value for b in F))
    stage = tag.split("_")[0]
    if raw & EXTENSION_FAIL_REASON_MASK:
        if bits & F.WRITE_RANGE_OUT_OF_BOUNDS:
            cause = "a request's write range ran past the token arrays: write offsets / extend_seq_lens are corrupt"
        elif bits & F.SLOT_OUT_OF_RANGE:
            cause = "the slot index lies outside the canary buffer: a corrupt req_to_token entry or SWA LUT value"
        else:
            cause = "the predecessor / seed slot lies outside the canary buffer: a corrupt req_to_token entry"
        return Diagnosis("out_of_range", cause)
    if bits & _ADDRESS:
        return Diagnosis("addressing", _addressing_cause(bits, stage))
    if bits & _WRITE:
        if bits & F.WRITE_TOKEN_MISMATCH:
            return Diagnosis(
                "write_path", "the forward wrote a token id other than the oracle's (sampler or input-id bookkeeping)"
            )
        return Diagnosis(
            "write_path",
            "the written position is not the expected one (off-by-one in positions, "
            "or the predecessor slot in req_to_token belongs to another position)",
        )
    if bits & F.VERIFY_REAL_KV_HASH_MISMATCH:
        if rewritten:
            return Diagnosis(
                "data_corruption",
                "the KV bytes changed and the slot holds a new record since: "
                "another request writing into a slot this one still owned (slot "
                "reuse, an addressing bug) looks like this; so does a slot freed "
                "and reallocated after a corruption",
            )
        return Diagnosis(
            "data_corruption",
            "the KV bytes of the slot changed after they were written (stray copy, overwrite by a kernel, bit flip)",
        )
    return Diagnosis("unknown", CATEGORIES["unknown"])


def rewritten(violation, record) -> bool:
    """True when a verify row's slot now holds another record (token, position, prev_hash) than the row saw."""
    if violation.is_write or violation.bits & F.SLOT_OUT_OF_RANGE:
        return False
    seen = (violation.stored_token, violation.position, violation.stored_chain_hash)
    return tuple(int(x) for x in record[:3]) != seen


def recheck_row(violation, record, live_fingerprint: int | None) -> str:
    """Re-evaluate a row's comparison against the slot's current record: ``persistent`` or ``transient``.

    Parameters
    ----------
    violation : Violation
        The row (its slot must be in range; the caller checks).
    record : sequence of 4 int
        The slot's current canary record (token, position, prev_hash, real_kv_hash), int64.
    live_fingerprint : int or None
        The slot's current real-KV fingerprint; None when no sources are folded (HEAD buffers).

    Notes
    -----
    Per bit: chain (1) stored prev_hash != the row's expected chain hash; position (2) the slot still holds
    the foreign position the row saw (the row has no expected position); real-KV (4) stored fingerprint != the live one; token (32 and 8) stored token != the
    expected token; write position (16) stored position != the expected position (``expected_aux``).
    """
    bits = violation.bits
    token, position, prev_hash, real = (int(x) for x in record[:4])
    still = False
    if bits & F.VERIFY_CHAIN_HASH_MISMATCH:
        still |= prev_hash != violation.expected_aux
    if bits & F.VERIFY_POSITION_MISMATCH:  # a verify row carries the stored (foreign) position, not the expected one
        still |= position == violation.position
    if bits & F.VERIFY_REAL_KV_HASH_MISMATCH and live_fingerprint is not None:
        still |= real != int(live_fingerprint)
    if bits & (F.VERIFY_TOKEN_MISMATCH | F.WRITE_TOKEN_MISMATCH) and violation.expected_token >= 0:
        still |= token != violation.expected_token
    if bits & F.WRITE_POSITION_MISMATCH:
        still |= position != violation.expected_aux
    return "persistent" if still else "transient"


def slot_view(monitor, violation):
    """(group state, endpoint, canary buffer) whose record the row compared, or None (foreign tag / group)."""
    stage, half, group = (violation.tag.split("_") + ["", "", ""])[:3]
    states = [g for g in monitor.groups if g.kind.upper() == group]
    if not states or stage not in ("HEAD", "TAIL", "SWEEP"):
        return None
    state = states[0]
    endpoints = {"HEAD": state.head, "TAIL": state.tail, "SWEEP": state.sweep}[stage]
    endpoint = next((e for e in endpoints if e.tag.name == violation.tag), None)
    if endpoint is None:
        return None
    return state, endpoint, endpoint.context.canary_buf


def read_slots(monitor, endpoint, slots) -> tuple[np.ndarray, np.ndarray | None]:
    """Host copies of the records (int64 [n, 4]) and live fingerprints (int64 [n]; None when the
    endpoint folds no real KV) of in-range ``slots``: one gather and one copy each (a sync on a GPU)."""
    xp, ctx = monitor.xp, endpoint.context
    index = xp.asarray(np.asarray(slots, dtype=np.int64))
    host = (lambda a: np.asarray(a)) if xp is np else xp.asnumpy
    records = host(ctx.canary_buf.view(np.int64)[index][:, :4])
    if not ctx.real_kv_sources or ctx.real_kv_hash_mode == RealKvHashMode.NONE:
        return records, None
    live = xp.zeros(index.shape[0], dtype=np.int64)
    compute_real_kv_hash(
        real_kv_sources=ctx.real_kv_sources, real_kv_hash_mode=ctx.real_kv_hash_mode, slot_indices=index, out=live
    )
    return records, host(live)


class Rechecker:
    """Keeps the rows decoded at one readback and re-checks their slots at the next one."""

    def __init__(self):
        self.pending: list[int] = []  # indices into the monitor's violation list

    def track(self, start: int, stop: int) -> None:
        """Rows ``[start, stop)`` of the violation list were just decoded: re-check them next time."""
        self.pending += range(start, stop)

    def run(self, monitor, step: int) -> None:
        """Re-check every pending row against its slot's current record (one read per launch tag);
        log one line per row."""
        found, by_tag = monitor.pump.violations, {}
        for i in self.pending:
            view = slot_view(monitor, found[i])
            if view is None or not 0 < found[i].slot_idx < view[2].shape[0]:
                found[i] = dataclasses.replace(found[i], persistence="unchecked")
            else:
                by_tag.setdefault(found[i].kernel_kind, (view[1], []))[1].append(i)
        for endpoint, rows in by_tag.values():
            records, live = read_slots(monitor, endpoint, [found[i].slot_idx for i in rows])
            for j, i in enumerate(rows):
                v = found[i] = dataclasses.replace(
                    found[i],
                    persistence=recheck_row(found[i], records[j], None if live is None else live[j]),
                    rewritten=rewritten(found[i], records[j]),
                )
                logger.info(  # the row was logged when read back: its re-check is detail (INFO)
                    "kv-canary: re-check at step %d: %s slot %d position %d is %s (%s)",
                    step,
                    v.tag,
                    v.slot_idx,
                    v.position,
                    v.persistence,
                    v.diagnosis.category,
                )
        self.pending = []


class CanaryBlindSpotWarning(UserWarning):
    """The monitor runs in a configuration with a known blind spot (see :func:`warn_blind_spot`)."""


BLIND_SPOT_MESSAGE = (
    "kv-canary blind spot: check_verify_expected_token is off, so a token corrupted in a request's newest "
    "slot goes unseen; pass check_verify_expected_token=True to close it (warned once per process)"
)

#: Whether this process has shown the blind-spot warning (it is advice about a configuration, not
#: about one monitor: an engine that builds a monitor per pool or per rank hears it once).
_blind_spot_warned = False


def warn_blind_spot(check_tokens: bool) -> None:
    """Warn (:class:`CanaryBlindSpotWarning`) when the expected-token check is off, once per process.

    ``docs/concepts/reading-a-violation.md`` explains the blind spot; the warning only names it.
    """
    global _blind_spot_warned
    if not check_tokens and not _blind_spot_warned:
        _blind_spot_warned = True
        warnings.warn(BLIND_SPOT_MESSAGE, CanaryBlindSpotWarning, stacklevel=3)
