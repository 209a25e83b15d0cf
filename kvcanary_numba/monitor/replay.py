"""Replaying a violation bundle: verify on the NumPy path over the bundle's records, and the explanation.

Per launch tag the recorded slots become a small canary buffer (slot ``i + 1``
holds the ``i``-th recorded slot; slot 0 stays padding) with one real-KV source
per recorded source (one row per slot, exactly the bytes the fold reads), and
the entries are verified there with the public verify function on
``backend="numpy"``. Slots are mapped back afterwards, so the replayed rows read
like the monitor's own. The fingerprint fold does not depend on where the bytes
sit, so a replay gives the same bits as the original verify of those records.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..constants import (
    CANARY_SLOT_BYTES,
    NUM_LAUNCH_TAGS,
    ROW_EXPECTED_AUX,
    ROW_FAIL_REASON,
    ROW_SLOT_IDX,
    FailReason,
    RealKvHashMode,
)
from ..context import CanaryContext, RealKvSource
from ..fast.calls import launch_canary_verify_kernel
from ..plans import VerifyPlan
from .bundle import load_bundle
from .report import decode_rows, tag_name

__all__ = ["Replay", "replay_bundle", "explain_bundle"]

F = FailReason
_WRITE_TO_VERIFY = {
    F.WRITE_TOKEN_MISMATCH: F.VERIFY_TOKEN_MISMATCH,
    F.WRITE_POSITION_MISMATCH: F.VERIFY_POSITION_MISMATCH,
}


@dataclass
class Replay:
    """A bundle and what verify finds over its data now."""

    bundle: dict
    recorded: list  # Violation rows stored in the bundle
    replayed: list  # Violation rows of the replay (original slot numbers)

    def replayable(self, violation) -> bool:
        """True when the bundle holds a verify entry for the row's slot (write-range and seed rows have none)."""
        e = self.bundle["entries"]
        return bool(((e[:, 0] == violation.kernel_kind) & (e[:, 1] == violation.slot_idx)).any())

    def reproduced(self, violation) -> bool:
        """True when the replay flags the row's slot with the row's verify bits (a write bit as its verify twin)."""
        want = F(0)
        for bit in F:
            if violation.bits & bit:
                want |= _WRITE_TO_VERIFY.get(bit, bit)
        same = [r for r in self.replayed if r.kernel_kind == violation.kernel_kind and r.slot_idx == violation.slot_idx]
        return any(r.bits & want for r in same)


def _source(rows: np.ndarray) -> RealKvSource:
    return RealKvSource(tensor=rows, page_size=1, num_bytes_per_token=rows.shape[1], read_bytes=rows.shape[1])


def _replay_tag(bundle: dict, tag: int, backend: str) -> np.ndarray:
    config = bundle["config"]
    name = tag_name(tag)
    num_slots = int(config["num_slots"].get(name.rsplit("_", 1)[-1], 0))
    pick = bundle["records"][:, 0] == tag
    records, kv, lens = bundle["records"][pick], bundle["kv"][pick], bundle["kv_lengths"][pick]
    entries = bundle["entries"][bundle["entries"][:, 0] == tag]
    compact = {int(s): i + 1 for i, s in enumerate(records[:, 1])}
    size = len(compact) + 1
    buf = np.zeros((size, CANARY_SLOT_BYTES), dtype=np.uint8)
    buf.view(np.int64)[1:, :4] = records[:, 2:6]

    def local(s: int) -> int:
        if s <= 0:  # padding (slot) / anchor / unreachable predecessor: same meaning in the small buffer
            return s
        return compact.get(s, max(s, size))  # recorded -> its row; out of range stays out of range

    n = max(entries.shape[0], 1)
    plan = VerifyPlan.allocate(verify_capacity=n)
    plan.verify_slot_indices[: entries.shape[0]] = [local(int(s)) for s in entries[:, 1]]
    plan.verify_expected_positions[: entries.shape[0]] = entries[:, 2]
    plan.verify_prev_slot_indices[: entries.shape[0]] = [local(int(s)) for s in entries[:, 3]]
    plan.verify_expected_tokens[: entries.shape[0]] = entries[:, 4]
    plan.verify_num_valid[0] = entries.shape[0]
    mode = RealKvHashMode(config["real_kv_hash_mode"]) if not name.startswith("HEAD") else RealKvHashMode.NONE
    sources = []
    for j in range(lens.shape[1]):
        width = int(lens[:, j].max(initial=0))
        if width and mode != RealKvHashMode.NONE:
            rows = np.zeros((size, width), dtype=np.uint8)
            rows[1:] = kv[:, j, :width]
            sources.append(_source(rows))
    ring = np.zeros((n, 8), dtype=np.int64)
    ctx = CanaryContext(
        canary_buf=buf,
        kernel_kind=tag,
        violation_ring=ring,
        violation_write_index=np.zeros(1, np.int32),
        slot_run_counter=np.zeros(1, np.int64),
        kernel_run_counter=np.zeros(1, np.int64),
        real_kv_sources=tuple(sources),
        real_kv_hash_mode=mode if sources else RealKvHashMode.NONE,
        enable_chain_position_assert=np.ones(1, np.int32),
    )
    launch_canary_verify_kernel(context=ctx, plan=plan, check_verify_expected_token=True, backend=backend)
    rows = ring[: min(int(ctx.violation_write_index[0]), n)].copy()
    back = {v: k for k, v in compact.items()}
    rows[:, ROW_SLOT_IDX] = [back.get(int(s), int(s)) for s in rows[:, ROW_SLOT_IDX]]
    out_of_range = (rows[:, ROW_FAIL_REASON] & int(F.SLOT_OUT_OF_RANGE)) != 0
    rows[out_of_range, ROW_EXPECTED_AUX] = num_slots
    return rows


def replay_bundle(path_or_bundle, *, backend: str = "numpy") -> Replay:
    """Load a bundle (path or :func:`~.bundle.load_bundle` dict) and re-run verify over its data.

    Raises
    ------
    KvCanaryError
        KVC-M020 for a bad bundle file.
    """
    bundle = path_or_bundle if isinstance(path_or_bundle, dict) else load_bundle(path_or_bundle)
    recorded = [dataclasses.replace(v, step=int(s)) for v, s in zip(decode_rows(bundle["rows"]), bundle["row_steps"])]
    rows = [
        _replay_tag(bundle, int(t), backend)
        for t in dict.fromkeys(bundle["entries"][:, 0].tolist())
        if 0 <= int(t) < NUM_LAUNCH_TAGS
    ]
    replayed = decode_rows(np.concatenate(rows) if rows else np.zeros((0, 8), np.int64))
    return Replay(bundle, recorded, replayed)


def explain_bundle(path_or_bundle) -> str:
    """The text ``kvcanary inspect`` prints: config, each recorded row with its triage, the replay verdict."""
    r = replay_bundle(path_or_bundle)
    c = r.bundle["config"]
    rank = "" if c.get("rank") is None else f" of rank {c['rank']}"  # bundles of a job of several ranks
    lines = [
        f"bundle of step {c['step']}{rank} ({c['device']} run, kvcanary_numba {c['kvcanary_numba']}): "
        f"{len(r.recorded)} row(s), {r.bundle['entries'].shape[0]} entries, {r.bundle['records'].shape[0]} "
        f"records; real_kv_hash_mode={RealKvHashMode(c['real_kv_hash_mode']).name}",
        "",
    ]
    for v in r.recorded:
        d = v.diagnosis
        lines += [v.summary(), f"  triage:     {d.category}: {d.cause}"]
        lines += [f"  why:        {text}" for text in v.explanations()]
        if not r.replayable(v):
            verdict = "not replayable (a write-side row that names no slot to verify)"
        elif r.reproduced(v):
            verdict = "reproduced"
        else:
            verdict = "not reproduced (the slot changed before the bundle was written)"
        lines += [f"  replay:     {verdict}", ""]
    lines.append(f"replay (verify on the NumPy path over the bundle): {len(r.replayed)} row(s)")
    lines += [f"  {v.summary()}" for v in r.replayed]
    return "\n".join(lines)
