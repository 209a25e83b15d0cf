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
from .bundle import MAX_BUNDLE_BYTES, load_bundle
from .bundle_check import check_bundle_dict
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
    recorded = records[:, 1]  # distinct, in range (bundle_check): recorded slot i sits in row i + 1
    order = np.argsort(recorded)
    size = recorded.shape[0] + 1
    buf = np.zeros((size, CANARY_SLOT_BYTES), dtype=np.uint8)
    buf.view(np.int64)[1:, :4] = records[:, 2:6]

    def local(slots: np.ndarray) -> np.ndarray:
        """Recorded slot -> its row; a slot <= 0 (padding, anchor, unreachable predecessor) keeps its
        meaning; any other slot stays out of range of the small buffer."""
        out = np.where(slots <= 0, slots, np.maximum(slots, size))
        if order.shape[0]:
            at = np.minimum(np.searchsorted(recorded[order], slots), order.shape[0] - 1)
            hit = (recorded[order][at] == slots) & (slots > 0)
            out[hit] = order[at[hit]] + 1
        return out

    n = max(entries.shape[0], 1)
    plan = VerifyPlan.allocate(verify_capacity=n)
    plan.verify_slot_indices[: entries.shape[0]] = local(entries[:, 1])
    plan.verify_expected_positions[: entries.shape[0]] = entries[:, 2]
    plan.verify_prev_slot_indices[: entries.shape[0]] = local(entries[:, 3])
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
    slots = rows[:, ROW_SLOT_IDX]
    mine = (slots >= 1) & (slots < size)  # rows of the small buffer: back to the slots they stand for
    slots[mine] = recorded[slots[mine] - 1]
    out_of_range = (rows[:, ROW_FAIL_REASON] & int(F.SLOT_OUT_OF_RANGE)) != 0
    rows[out_of_range, ROW_EXPECTED_AUX] = num_slots
    return rows


def replay_bundle(path_or_bundle, *, backend: str = "numpy", max_bytes: int = MAX_BUNDLE_BYTES) -> Replay:
    """Load a bundle (path or :func:`~.bundle.load_bundle` dict) and re-run verify over its data.

    A dict is checked against the bundle schema as a file is (its digest aside: an edited
    dict is an experiment, not a damaged file).

    Raises
    ------
    KvCanaryError
        :func:`~.bundle.load_bundle`'s codes (KVC-M020, KVC-M030 … KVC-M033) for a bad bundle.
    """
    if isinstance(path_or_bundle, dict):
        check_bundle_dict("replay_bundle", path_or_bundle)
        bundle = path_or_bundle
    else:
        bundle = load_bundle(path_or_bundle, max_bytes=max_bytes)
    recorded = [dataclasses.replace(v, step=int(s)) for v, s in zip(decode_rows(bundle["rows"]), bundle["row_steps"])]
    rows = [
        _replay_tag(bundle, int(t), backend)
        for t in dict.fromkeys(bundle["entries"][:, 0].tolist())
        if 0 <= int(t) < NUM_LAUNCH_TAGS
    ]
    replayed = decode_rows(np.concatenate(rows) if rows else np.zeros((0, 8), np.int64))
    return Replay(bundle, recorded, replayed)


def explain_bundle(path_or_bundle, *, max_bytes: int = MAX_BUNDLE_BYTES) -> str:
    """The text ``kvcanary inspect`` prints: config, each recorded row with its triage, the replay verdict.

    Raises
    ------
    KvCanaryError
        :func:`replay_bundle`'s codes for a bad bundle (nothing is printed then).
    """
    r = replay_bundle(path_or_bundle, max_bytes=max_bytes)
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
