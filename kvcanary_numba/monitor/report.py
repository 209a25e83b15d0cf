"""Readable violation records decoded from violation-ring rows.

A ring row is 8 int64 fields (kernel_kind, slot_idx, position, stored_token,
expected_token, stored_chain_hash, expected_aux, fail_reason). :class:`Violation`
names the launch tag and the fail-reason bits, explains each bit in one line,
and prints SGLang's frozen one-line summary so that log parsers written for
SGLang read ours too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..constants import (
    ROW_EXPECTED_AUX,
    ROW_EXPECTED_TOKEN,
    ROW_FAIL_REASON,
    ROW_KERNEL_KIND,
    ROW_POSITION,
    ROW_SLOT_IDX,
    ROW_STORED_CHAIN_HASH,
    ROW_STORED_TOKEN,
    VIOLATION_FIELDS,
    VIOLATION_INDEX_SATURATED,
    CanaryLaunchTag,
    FailReason,
    fail_reason_label,
)
from ..hashing import to_unsigned
from .triage import Diagnosis, diagnose

__all__ = ["BIT_EXPLANATIONS", "Violation", "decode_rows", "ring_summary", "tag_name", "reason_labels"]

#: One line per FailReason bit: what the check saw and what usually causes it.
BIT_EXPLANATIONS: dict[FailReason, str] = {
    FailReason.VERIFY_CHAIN_HASH_MISMATCH: (
        "the slot's stored prev_hash is not the chain hash of the slot the plan names as its "
        "predecessor: the slot was overwritten by another sequence, or req_to_token points at the "
        "wrong slot (expected_aux = expected chain hash)"
    ),
    FailReason.VERIFY_POSITION_MISMATCH: (
        "the slot holds a record for another position than the plan expects: slot reuse, a stale "
        "page, or a position bug when it was written"
    ),
    FailReason.VERIFY_REAL_KV_HASH_MISMATCH: (
        "the live KV bytes of the slot no longer match the fingerprint stamped when it was written: "
        "the KV memory changed after the write (overwrite, stray copy, bit flip)"
    ),
    FailReason.WRITE_TOKEN_MISMATCH: (
        "the token written into the slot differs from the token the oracle expected for this position (expected_token)"
    ),
    FailReason.WRITE_POSITION_MISMATCH: (
        "the position written differs from the expected one (expected_aux): either the oracle's "
        "position or the predecessor's position + 1 (chain-position assert)"
    ),
    FailReason.VERIFY_TOKEN_MISMATCH: (
        "the slot's stored token differs from the request's token at that position in the "
        "expected-token pool: the KV belongs to another token"
    ),
    FailReason.SLOT_OUT_OF_RANGE: (
        "the slot index is outside the canary buffer (expected_aux = number of slots); nothing was "
        "read or written (extension)"
    ),
    FailReason.PREV_SLOT_OUT_OF_RANGE: (
        "the predecessor / seed slot index is outside the canary buffer, so the chain could not be checked (extension)"
    ),
    FailReason.WRITE_RANGE_OUT_OF_BOUNDS: (
        "a request's write range [stored_token, expected_token) ran past the token arrays "
        "(expected_aux = number of tokens) and was clipped (extension)"
    ),
}

_WRITE_BITS = FailReason.WRITE_TOKEN_MISMATCH | FailReason.WRITE_POSITION_MISMATCH


def tag_name(kernel_kind: int) -> str:
    """Name of a launch tag (``HEAD_K_FULL`` ...); ``UNKNOWN_<n>`` for values SGLang does not define."""
    try:
        return CanaryLaunchTag(int(kernel_kind)).name
    except ValueError:
        return f"UNKNOWN_{int(kernel_kind)}"


def reason_labels(bits: int) -> tuple[str, ...]:
    """SGLang's labels of the set bits, lowest bit first; unknown bits read ``bit_<value>``."""
    bits = to_unsigned(bits)
    labels = [fail_reason_label(b) for b in FailReason if bits & b.value]
    known = sum(b.value for b in FailReason)
    rest = bits & ~known
    labels += [f"bit_{1 << i}" for i in range(64) if rest >> i & 1]
    return tuple(labels)


def _hex(value: int) -> str:
    return f"0x{to_unsigned(value):016x}"


@dataclass(frozen=True, slots=True, repr=False)
class Violation:
    """One decoded violation-ring row.

    Attributes
    ----------
    kernel_kind, slot_idx, position, stored_token, expected_token,
    stored_chain_hash, expected_aux, fail_reason : int
        The 8 ring fields, as stored (signed int64).
    step : int
        Monitor step whose readback found the row (-1 when decoded directly).
    persistence : str
        ``pending`` until the monitor re-checks the slot a step later, then
        ``persistent`` or ``transient`` (``unchecked`` without an in-range slot);
        see :mod:`kvcanary_numba.monitor.triage`.
    rewritten : bool
        The re-check found a verify row's slot holding another record than the row saw.
    """

    kernel_kind: int
    slot_idx: int
    position: int
    stored_token: int
    expected_token: int
    stored_chain_hash: int
    expected_aux: int
    fail_reason: int
    step: int = -1
    persistence: str = "pending"
    rewritten: bool = False

    def __repr__(self) -> str:
        """The row as a reader wants it: the tag's and bits' names, hashes in hex (fields as stored:
        :meth:`to_dict`)."""
        rewritten = ", rewritten" if self.rewritten else ""
        return (
            f"Violation({self.tag}, slot_idx={self.slot_idx}, position={self.position}, "
            f"reasons={'+'.join(self.reasons) or 'none'}, stored_token={self.stored_token}, "
            f"expected_token={self.expected_token}, stored_chain_hash={_hex(self.stored_chain_hash)}, "
            f"expected_aux={_hex(self.expected_aux)}, step={self.step}, {self.persistence}{rewritten})"
        )

    @property
    def tag(self) -> str:
        """Launch tag name, e.g. ``TAIL_K_FULL``."""
        return tag_name(self.kernel_kind)

    @property
    def bits(self) -> FailReason:
        """The known fail-reason bits as a flag."""
        return FailReason(to_unsigned(self.fail_reason) & sum(b.value for b in FailReason))

    @property
    def reasons(self) -> tuple[str, ...]:
        """SGLang's labels of the bits (``verify_chain_hash`` ...)."""
        return reason_labels(self.fail_reason)

    @property
    def stage(self) -> str:
        """``HEAD``, ``TAIL`` or ``SWEEP`` (``UNKNOWN`` for a foreign tag)."""
        return self.tag.split("_")[0]

    @property
    def group(self) -> str:
        """``FULL`` or ``SWA``."""
        return self.tag.rsplit("_", 1)[-1]

    @property
    def is_write(self) -> bool:
        """True for rows recorded by the write kernel (write-input or chain-position assert)."""
        return bool(to_unsigned(self.fail_reason) & _WRITE_BITS.value)

    @property
    def canary_kind(self) -> str:
        """SGLang's ``canary_kind`` label: ``per_forward_<tag>`` or ``sweep_<tag>`` in lower case."""
        tag = self.tag.lower()
        return tag if self.stage == "SWEEP" else f"per_forward_{tag}"

    @property
    def diagnosis(self) -> Diagnosis:
        """Triage of the row: category (addressing, data_corruption, write_path, out_of_range) and cause."""
        return diagnose(self.fail_reason, self.tag, rewritten=self.rewritten)

    def explanations(self) -> tuple[str, ...]:
        """One human sentence per set bit, in bit order."""
        out = [f"{fail_reason_label(b)}: {BIT_EXPLANATIONS[b]}" for b in FailReason if self.bits & b]
        out += [f"{label}: not a bit this version knows" for label in self.reasons if label.startswith("bit_")]
        return tuple(out)

    def summary(self) -> str:
        """SGLang's one-line summary (field order and formats are frozen; log parsers rely on them)."""
        return (
            f"kv_canary violation: launch_tag={self.tag} fail_reason={'+'.join(self.reasons) or 'none'} "
            f"slot_idx={self.slot_idx} position={self.position} stored_token={self.stored_token} "
            f"expected_token={self.expected_token} stored_chain_hash={_hex(self.stored_chain_hash)} "
            f"expected_aux={_hex(self.expected_aux)}"
        )

    def describe(self) -> str:
        """Multi-line report: the summary, a header, the values compared and the explanations."""
        stored, expected = ("actual", "expected") if self.is_write else ("stored", "expected")
        aux = "position" if self.is_write else "chain_hash"
        lines = [
            self.summary(),
            f"KV cache canary violation detected (kernel_kind={self.tag}, slot_idx={self.slot_idx}, "
            f"position={self.position})",
            f"  canary_kind: {self.canary_kind}",
            f"  fail_reasons: {', '.join(self.reasons) or 'none'}",
            f"  {stored}: token={self.stored_token} chain_hash={_hex(self.stored_chain_hash)}",
            f"  {expected}: token={self.expected_token} {aux}={_hex(self.expected_aux)}",
        ]
        lines += [f"  why: {text}" for text in self.explanations()]
        d = self.diagnosis
        state = f"{self.persistence}, slot rewritten" if self.rewritten else self.persistence
        lines += [f"  triage: {d.category} ({state}): {d.cause}"]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of the fields plus tag name, labels and explanations."""
        return {
            "tag": self.tag,
            "kernel_kind": self.kernel_kind,
            "slot_idx": self.slot_idx,
            "position": self.position,
            "stored_token": self.stored_token,
            "expected_token": self.expected_token,
            "stored_chain_hash": _hex(self.stored_chain_hash),
            "expected_aux": _hex(self.expected_aux),
            "fail_reason": self.fail_reason,
            "reasons": list(self.reasons),
            "step": self.step,
            "category": self.diagnosis.category,
            "cause": self.diagnosis.cause,
            "persistence": self.persistence,
            "rewritten": self.rewritten,
            "summary": self.summary(),
        }


def decode_rows(ring: np.ndarray, start: int = 0, stop: int | None = None, *, step: int = -1) -> list[Violation]:
    """Decode host ring rows ``[start, stop)`` into :class:`Violation` records.

    Parameters
    ----------
    ring : numpy.ndarray, int64 [capacity, 8]
        A host copy of the violation ring.
    start, stop : int
        Row range; ``stop`` defaults to the capacity and is clipped to it.
    step : int
        Stamped into every record.
    """
    rows = np.asarray(ring, dtype=np.int64).reshape(-1, VIOLATION_FIELDS)
    stop = rows.shape[0] if stop is None else min(stop, rows.shape[0])
    fields = (
        ROW_KERNEL_KIND,
        ROW_SLOT_IDX,
        ROW_POSITION,
        ROW_STORED_TOKEN,
        ROW_EXPECTED_TOKEN,
        ROW_STORED_CHAIN_HASH,
        ROW_EXPECTED_AUX,
        ROW_FAIL_REASON,
    )
    return [Violation(*(int(row[f]) for f in fields), step=step) for row in rows[max(start, 0) : stop]]


def ring_summary(recorded: int, capacity: int) -> str:
    """One line on the ring's count: rows recorded and kept, and whether the count saturated.

    Parameters
    ----------
    recorded : int
        The write index (rows ever recorded; a negative caller-set index reads as 0).
    capacity : int
        Rows the ring keeps.
    """
    recorded = max(int(recorded), 0)
    kept = f"{min(recorded, capacity)} kept (ring capacity {capacity})"
    if recorded >= VIOLATION_INDEX_SATURATED:
        return (
            f"kv-canary: violation count saturated: at least {recorded} rows recorded, {kept}; the int32 write "
            "index stays at its limit, so later rows are neither kept nor counted"
        )
    return f"kv-canary: {recorded} violation row(s) recorded, {kept}"
