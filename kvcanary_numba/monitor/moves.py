"""The monitor's record moves: its canary records follow the KV between steps.

:class:`RecordMoves` is the component :class:`~.monitor.CanaryMonitor` composes for this;
the monitor's methods (``take_records``, ``put_records``, ``move_records``,
``verify_records``, ``handoff_digest``) check the step order and call it. Every call is
made of the package's public operations, launched on the monitor's backend and stream with
no read of device values (nothing waits for the device); each launch counts in the health
check under a SWEEP tag, and what it finds is a violation row read back like any other.

Slots are FULL slots (int64, on the monitor's device). A group holds four canary buffers
(HEAD and TAIL, K and V); all of them move. An SWA group's records move through its LUT:
the SWA slot of each FULL slot, as the LUT says at the time of the call (0, a slot outside
the window, moves nothing). The KV must move first: the TAIL buffers' records are checked
against the live KV where they leave and where they land.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._validate import check_array, resolve_backend
from ..constants import CANARY_SLOT_BYTES, NUM_LAUNCH_TAGS, SPLITMIX64_MUL1, SPLITMIX64_MUL2, RealKvHashMode
from ..errors import error
from ..fast.calls import (
    compute_handoff_digest,
    gather_canary_records,
    move_canary_records,
    scatter_canary_records,
    verify_canary_records,
)
from ..handoff import HandoffDigest, HandoffSignature
from ..move import validate_move, validate_scatter
from .groups import translate_slots

__all__ = ["MovedRecords", "RecordMoves"]

_STAGES = ("HEAD", "TAIL")


@dataclass(frozen=True, slots=True)
class MovedRecords:
    """The canary records of a set of FULL slots, taken out of a monitor (:meth:`RecordMoves.take`).

    Attributes
    ----------
    records : dict of str to array
        One pack (uint8 ``[n, 32]``) per canary buffer, keyed by the buffer's HEAD / TAIL tag
        name (``"TAIL_K_FULL"``, ``"HEAD_V_SWA"``, ...): row ``i`` is the record of the
        ``i``-th slot taken (a zero row for an SWA slot outside the window).
    num_slots : int
        ``n``, the slots taken.
    digest : HandoffDigest or None
        The runs' hand-off digest, computed in the same pass, when ``run_offsets`` were given.
    """

    records: dict[str, Any]
    num_slots: int
    digest: HandoffDigest | None = None

    def to_host(self) -> MovedRecords:
        """A copy with NumPy packs and digests (a device-to-host copy of each: it waits for the device)."""
        digest = self.digest and HandoffDigest(signature=self.digest.signature, digests=self.digest.host())
        records = {k: v if isinstance(v, np.ndarray) else v.get() for k, v in self.records.items()}
        return MovedRecords(records, self.num_slots, digest)

    def to_device(self, xp) -> MovedRecords:
        """A copy with ``xp`` arrays (``cupy``: a host-to-device copy of each pack and of the digests)."""
        digest = self.digest and HandoffDigest(signature=self.digest.signature, digests=xp.asarray(self.digest.digests))
        return MovedRecords({k: xp.asarray(v) for k, v in self.records.items()}, self.num_slots, digest)


def _buffer_name(stage: str, half: str, kind: str) -> str:
    return f"{stage}_{half}_{kind.upper()}"


def _mix(xp, acc, digest):
    """``splitmix64(acc ^ digest)`` on int64 arrays (their uint64 bits), in any array module."""
    h = (acc ^ digest).view(np.uint64)
    h = h ^ (h >> np.uint64(30))
    h = h * np.uint64(SPLITMIX64_MUL1)
    h = h ^ (h >> np.uint64(27))
    h = h * np.uint64(SPLITMIX64_MUL2)
    return (h ^ (h >> np.uint64(31))).view(np.int64)


def _contexts(g) -> list:
    halves = [e.tag.name.split("_")[1] for e in g.sweep]
    sweep = dict(zip(halves, (e.context for e in g.sweep)))
    no_kv = dict(real_kv_sources=(), real_kv_hash_mode=RealKvHashMode.NONE)
    return [
        (
            _buffer_name(stage, half, g.kind),
            sweep[half].replace(canary_buf=g.buffers[stage, half], **no_kv) if stage == "HEAD" else sweep[half],
        )
        for stage in _STAGES
        for half in halves
    ]


class RecordMoves:
    """Moves, checks and digests of a monitor's records.

    Parameters
    ----------
    groups : list of GroupState
        The monitor's groups (FULL first): their buffers, SWEEP endpoints and LUT.
    xp : module
        NumPy or CuPy.
    placement : ArrayInfo
        Where the monitor's arrays live (every slot array must be there: KVC-C007).
    steps : EagerSteps
        Its ``backend`` is where the launches run.
    health : HealthChecker
        Counts every launch (SWEEP tags).
    """

    def __init__(self, groups, *, xp, placement, steps, health):
        self.groups, self.xp, self.placement, self.steps, self.health = groups, xp, placement, steps, health

    @property
    def contexts(self) -> dict[str, list]:
        """Per group kind: (buffer name, context) of each buffer, in HEAD K, HEAD V, TAIL K, TAIL V order.

        Every context is its half's SWEEP context as it is now (tag, ring, counters, real-KV sources:
        ``rebind_sources`` replaces them, and nothing here keeps the old ones); HEAD buffers fold no KV
        (HEAD records carry no fingerprint).
        """
        return {g.kind: _contexts(g) for g in self.groups}

    # --- arguments ------------------------------------------------------------
    def _slots(self, function: str, argument: str, slots):
        info = check_array(function, argument, slots, dtype=np.int64, ndim=1)
        resolve_backend(function, "auto", [("the monitor's buffers", self.placement), (argument, info)])
        return info.shape[0]

    def _group(self, function: str, kind: str):
        for g in self.groups:
            if g.kind == kind:
                return g
        raise error("KVC-K014", function=function, got=kind, kinds=[g.kind for g in self.groups])

    def _translate(self, g, slots):
        """The group's slots of FULL ``slots`` (SWA: through the LUT; a new array)."""
        if g.lut is None:
            return slots
        xp = self.xp
        scratch = dict(out=xp.empty_like(slots), clipped=xp.empty_like(slots), mask=xp.empty(slots.shape, dtype=bool))
        return translate_slots(xp, g.lut, slots, **scratch)

    def _count(self, contexts) -> None:
        launches = np.zeros(NUM_LAUNCH_TAGS, dtype=np.int64)
        for _, context in contexts:
            launches[int(context.kernel_kind)] += 1
        self.health.add(launches)

    def _all(self):
        return [(g, name, ctx) for g in self.groups for name, ctx in self.contexts[g.kind]]

    # --- moves ----------------------------------------------------------------
    def take(self, function: str, slot_indices, run_offsets=None) -> MovedRecords:
        """``CanaryMonitor.take_records``: every buffer's records of some FULL slots, in new packs.

        Call after the step that last wrote them (between steps) and before the KV leaves its slots: the
        TAIL buffers' records are checked against the live KV as they are taken (a SWEEP row, bit 4).
        With ``run_offsets`` the same pass computes the runs' hand-off digest (:meth:`digest`'s value).

        Parameters
        ----------
        function : str
            The public method, named in errors.
        slot_indices : int64 [n]
            FULL slots on the monitor's device, in the order the packs keep (a request's slots in
            position order). An SWA group takes the SWA slot the LUT gives for each (0: none).
        run_offsets : int64 [num_runs + 1], optional
            Runs of ``slot_indices`` to digest, as :meth:`digest` takes them.

        Returns
        -------
        MovedRecords
            One uint8 [n, 32] pack per canary buffer, on the monitor's device; the digest with ``run_offsets``.

        Raises
        ------
        KvCanaryError
            KVC-M005 (between pre_forward and post_forward), KVC-C002 … KVC-C007 for ``slot_indices``;
            for ``run_offsets`` :meth:`digest`'s codes.
        """
        n = self._slots(function, "slot_indices", slot_indices)
        runs = None if run_offsets is None else self._slots(function, "run_offsets", run_offsets) - 1
        backend, xp = self.steps.backend, self.xp
        packs, digest = {}, None
        for g in self.groups:
            slots, contexts = self._translate(g, slot_indices), self.contexts[g.kind]
            packs.update((name, xp.empty((n, CANARY_SLOT_BYTES), dtype=np.uint8)) for name, _ in contexts)
            fused = runs is not None and g is self.groups[0]
            if fused:  # first: a run table refused there leaves the monitor unchanged
                digest = self._digests(g, slots, run_offsets, runs, packs)
            for name, context in contexts:
                if not (fused and name.startswith("TAIL")):  # those were taken with the digest
                    gather_canary_records(context=context, slot_indices=slots, out_records=packs[name], backend=backend)
            self._count(contexts)
        return MovedRecords(packs, n, digest)

    def put(self, function: str, moved, slot_indices) -> None:
        """``CanaryMonitor.put_records``: put taken records at (other) FULL slots.

        Copy the KV to the new slots first (and set the SWA LUT for them): the TAIL buffers' records are
        checked against the KV where they land (a SWEEP row, bit 4). Then update the page table, and
        check the landed runs at once with :meth:`verify`.

        Parameters
        ----------
        function : str
            The public method, named in errors.
        moved : MovedRecords
            What :meth:`take` returned (on the monitor's device: ``to_device(xp)`` after a host tier).
        slot_indices : int64 [n]
            The new FULL slots, row ``i`` of each pack to ``slot_indices[i]`` (distinct slots).

        Raises
        ------
        KvCanaryError
            KVC-M005, KVC-K013 (not this monitor's buffers), KVC-K001 (packs of another length),
            KVC-C002 … KVC-C007; nothing is written when one is raised.
        """
        if not isinstance(moved, MovedRecords):
            raise error("KVC-K013", function=function, got=type(moved).__name__, expected=sorted(self._names()))
        if set(moved.records) != self._names():
            raise error("KVC-K013", function=function, got=sorted(moved.records), expected=sorted(self._names()))
        n = self._slots(function, "slot_indices", slot_indices)
        for name, pack in moved.records.items():
            info = check_array(function, f"moved.records[{name!r}]", pack, dtype=np.uint8, ndim=2)
            resolve_backend(function, "auto", [("the monitor's buffers", self.placement), (name, info)])
            if info.shape != (n, CANARY_SLOT_BYTES):
                raise error(
                    "KVC-K001",
                    function=function,
                    argument=f"moved.records[{name!r}]",
                    slots="slot_indices",
                    expected=n,
                    got=info.shape[0],
                )
        calls = [
            dict(context=context, records=moved.records[name], slot_indices=slots, backend=self.steps.backend)
            for g, slots in ((g, self._translate(g, slot_indices)) for g in self.groups)
            for name, context in self.contexts[g.kind]
        ]
        for kwargs in calls:  # every check before the first write (a pack inside a canary buffer: KVC-C017)
            validate_scatter(**kwargs)
        for kwargs in calls:
            scatter_canary_records(**kwargs)
        for g in self.groups:
            self._count(self.contexts[g.kind])

    def move(self, function: str, src_slot_indices, dst_slot_indices, group: str) -> None:
        """``CanaryMonitor.move_records``: compact one group's pool (``dst[i]`` gets the record of ``src[i]``).

        Move the group's KV first; every buffer of the group moves, sources and destinations may overlap,
        and the TAIL records are checked against the KV where they land.

        Parameters
        ----------
        function : str
            The public method, named in errors.
        src_slot_indices : int64 [n]
            The group's own slots (SWA slots for ``"swa"``: no LUT), where each record is.
        dst_slot_indices : int64 [n]
            Where each goes (distinct slots).
        group : {"full", "swa"}
            The group compacted.

        Raises
        ------
        KvCanaryError
            KVC-M005, KVC-K014 (no such group), KVC-K003 (lengths), KVC-C002 … KVC-C007.
        """
        g = self._group(function, group)
        n = self._slots(function, "src_slot_indices", src_slot_indices)
        if self._slots(function, "dst_slot_indices", dst_slot_indices) != n:
            raise error("KVC-K003", function=function, expected=n, got=int(dst_slot_indices.shape[0]))
        scratch = self.xp.empty((n, CANARY_SLOT_BYTES), dtype=np.uint8)
        calls = [
            dict(
                context=context,
                src_slot_indices=src_slot_indices,
                dst_slot_indices=dst_slot_indices,
                scratch_records=scratch,
                backend=self.steps.backend,
            )
            for _, context in self.contexts[g.kind]
        ]
        for kwargs in calls:  # every check before the first write
            validate_move(**kwargs)
        for kwargs in calls:
            move_canary_records(**kwargs)
        self._count(self.contexts[g.kind])

    def _names(self) -> set[str]:
        return {name for _, name, _ in self._all()}

    # --- checks ---------------------------------------------------------------
    def _tails(self, g):
        return [(name, ctx) for name, ctx in self.contexts[g.kind] if name.startswith("TAIL")]

    def verify(self, function: str, slot_indices, run_offsets, run_start_positions, run_prev_slots) -> None:
        """``CanaryMonitor.verify_records``: check landed runs now, in every group's TAIL buffers.

        Each run's slots are checked against its positions, its chain and the live KV, as verify checks
        a plan (:func:`~kvcanary_numba.verify_canary_records`); give the slots the page table lists,
        so that a reload into other slots is seen. Rows (SWEEP tags) are read back at the next
        ``end_step``. An SWA group checks the SWA slots of the same runs (outside the window: skipped).

        Parameters
        ----------
        function : str
            The public method, named in errors.
        slot_indices : int64 [n]
            FULL slots of every run, run after run, each in position order.
        run_offsets : int64 [num_runs + 1]
            Run ``r`` is entries ``[run_offsets[r], run_offsets[r + 1])``.
        run_start_positions : int64 [num_runs]
            Position of each run's first slot.
        run_prev_slots : int64 [num_runs]
            FULL slot of each run's predecessor (-1: the run starts its chain; 0: not checked).

        Raises
        ------
        KvCanaryError
            KVC-M005, KVC-K004 … KVC-K007 (the run table), KVC-C002 … KVC-C007.
        """
        self._slots(function, "slot_indices", slot_indices)
        for name, array in (("run_start_positions", run_start_positions), ("run_prev_slots", run_prev_slots)):
            self._slots(function, name, array)
        self._slots(function, "run_offsets", run_offsets)
        for g in self.groups:
            slots, prevs = self._translate(g, slot_indices), self._translate(g, run_prev_slots)
            for _, context in self._tails(g):
                verify_canary_records(
                    context=context,
                    slot_indices=slots,
                    run_offsets=run_offsets,
                    run_start_positions=run_start_positions,
                    run_prev_slots=prevs,
                    backend=self.steps.backend,
                )
            self._count(self._tails(g))

    def digest(self, function: str, slot_indices, run_offsets) -> HandoffDigest:
        """``CanaryMonitor.handoff_digest``: one hand-off digest per run of FULL slots.

        The FULL group's TAIL records and live KV of each run (K, then V, combined), signed with
        their layout; the same on the sending and the receiving monitor when the runs arrived
        intact (:func:`~kvcanary_numba.check_handoff_digest` compares two). Nothing waits for the
        device until the digests are read.

        Parameters
        ----------
        function : str
            The public method, named in errors.
        slot_indices : int64 [n]
            FULL slots of every run (a request's slots in position order, as its page table lists them).
        run_offsets : int64 [num_runs + 1]
            Run ``r`` is entries ``[run_offsets[r], run_offsets[r + 1])``.

        Returns
        -------
        HandoffDigest
            int64 [num_runs] digests on the monitor's device, and their signature.

        Raises
        ------
        KvCanaryError
            KVC-M005, KVC-K004 … KVC-K006, KVC-C002 … KVC-C007.
        """
        self._slots(function, "slot_indices", slot_indices)
        runs = self._slots(function, "run_offsets", run_offsets) - 1
        return self._digests(self.groups[0], slot_indices, run_offsets, runs)

    def _digests(self, g, slot_indices, run_offsets, runs: int, packs: dict | None = None) -> HandoffDigest:
        """Group ``g``'s TAIL digests (K, then V) combined and signed; given ``packs``, each TAIL
        buffer's records are taken into ``packs[name]`` in the same pass."""
        xp, tails = self.xp, self._tails(g)
        combined = xp.zeros(max(runs, 0), dtype=np.int64)
        for name, context in tails:
            part = xp.empty(max(runs, 0), dtype=np.int64)
            compute_handoff_digest(
                context=context,
                slot_indices=slot_indices,
                run_offsets=run_offsets,
                out_digests=part,
                out_records=None if packs is None else packs[name],
                backend=self.steps.backend,
            )
            combined = _mix(xp, combined, part)
        self._count(tails)  # with packs, a second launch count: the call stands for a gather and a digest
        return HandoffDigest(signature=HandoffSignature.of(*(ctx for _, ctx in tails)), digests=combined)
