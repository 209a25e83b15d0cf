"""CanaryMonitor: the per-step canary of one KV pool, in SGLang's order.

A step is ``pre_forward(batch)`` (each group's plan, then the HEAD launches: verify, then write, of K
and V, without real-KV sources) → the engine writes KV → ``post_forward()`` (the TAIL launches, with
real-KV sources) → ``end_step()`` (an optional sweep of given chains, SWEEP tags; then the status
readback: new violation rows, overflow warnings, health check). Between steps, records move with their KV.

Composition, no base classes: buffers, batch checks, sources, step plan, prepared steps and graph (GPU), readback,
pump, health, verdict, aftercare, budget, hook scope (thread, device, scratch), record moves; each phase takes
the fastest path (.paths).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import numpy as np

from .._runtime import array_module
from .._validate import check_bool, check_int, resolve_backend
from ..constants import DEFAULT_RING_CAPACITY, RealKvHashMode
from ..errors import error
from ..fast.capture import capture_step
from ..handoff import HandoffDigest
from . import paths
from .batch import BatchChecks, StepBatch
from .budget import BudgetState, VerifyBudget
from .buffers import MonitorBuffers
from .bundle import Aftercare, check_bundle_dir
from .groups import KvGroup, check_group_placement, check_groups, check_hash_mode
from .hooks import HookScope, guarded, on_device
from .moves import MovedRecords, RecordMoves
from .pump import CanaryViolationError
from .report import Violation
from .reporting import build_reporting, monitor_stats
from .sources import SourceWatch
from .steps import EagerSteps
from .sweep import SlotChain, sweep_chains
from .triage import warn_blind_spot
from .verdict import apply_verdict, check_rank, flush_verdict

__all__ = ["CanaryMonitor", "CanaryViolationError", "MODES"]

MODES = ("log", "raise")
_FN = "CanaryMonitor"
_IDLE, _PRE, _POST = "idle", "between pre_forward and post_forward", "after post_forward"
_ORDER = "pre_forward -> (engine writes KV) -> post_forward -> end_step"
_REBIND = "rebind_sources between end_step and pre_forward, or between pre_forward and post_forward"


class CanaryMonitor:
    """Canary buffers, plans, ring and counters for one KV pool, and the step hooks.

    Parameters
    ----------
    full : KvGroup
        The FULL group (``kind="full"``).
    swa : KvGroup, optional
        The SWA group of a sliding-window pool (``kind="swa"``).
    device : {"cpu", "cuda"}
        NumPy (reference path) or CuPy (Numba-CUDA kernels) buffers.
    mode : {"log", "raise"}
        ``log``: one log line per violation. ``raise``: one :class:`CanaryViolationError` with all rows.
    real_kv_hash_mode : RealKvHashMode, optional
        Default: PARTIAL when any group has sources, else NONE.
    ring_capacity : int
        Violation rows kept (fill-once; later rows are counted, not stored). Every capacity is
        at most ``2**31 - 1`` (int32 counters, KVC-C011); buffers that do not fit: KVC-C015.
    write_req_capacity : int
        Largest batch (requests) of a step.
    write_token_capacity : int, optional
        Largest number of new tokens of a step (default: FULL slots).
    verify_capacity : int, optional
        Verify entries per step and group (default 3 x FULL slots, as SGLang).
    sweep_capacity : int, optional
        Slots one sweep may cover (default: FULL slots).
    check_verify_expected_token : bool
        Verify stored tokens against a per-request token pool (needs ``max_requests``,
        ``max_context_len`` and a token snapshot per batch). Off, a corrupted token in a
        request's newest slot is unseen (:class:`~.triage.CanaryBlindSpotWarning` says so).
    max_requests, max_context_len : int, optional
        Shape of that token pool (req_to_token rows, context length).
    warmup_steps : int
        Steps with the chain-position assert off (warm-up positions; 0: on at once; :meth:`finish_warmup`).
    health_interval, health_warmup_steps : int
        Health check cadence (0 = off) and the steps before the first check.
    bundle_dir : str or path, optional
        Write a replayable bundle (``.npz``, :mod:`.bundle`; ``kvcanary inspect`` replays it) of
        every readback with new violation rows here (created if missing). Paths: :attr:`bundles`.
    verify_budget : VerifyBudget, optional
        Budgeted verification (:mod:`.budget`): each step verifies the prefix entries due then;
        an entry in the plans for K steps is verified within them (K: ``stats()["verify_period"]``).
    backend : {"auto", "numpy", "cuda"}
        Where the launches run: ``auto`` follows ``device``. ``cuda`` with ``device="cpu"`` runs
        the kernels on NumPy buffers under Numba's CUDA simulator (tests, not production).
    prepared : bool, optional
        Record each batch shape's launches once and relaunch them (the fast wing's prepared steps).
        Default: on with ``device="cuda"``. True needs the kernels (``backend`` resolving to ``cuda``).
    rank : int, optional
        This monitor's rank in a job of several (>= 0): named in reports, errors and bundles.
    verdict : bool
        Write a per-step verdict word ranks merge (:mod:`.verdict`); ``raise`` acts in :meth:`apply_verdict`.

    Attributes
    ----------
    step_plan : EagerSteps
        Which launches each phase makes; run every step on the eager path.
    fast : PreparedSteps or None
        The prepared steps (None, or set to None: every step runs the plan).
    graph : CapturedStep or None
        The captured step (:meth:`capture_graph`).
    sources : SourceWatch
        The real-KV sources as last checked (:meth:`rebind_sources`; re-checked before each TAIL).
    verdict : VerdictState or None
        The verdict word (``verdict.word``) and what acts on merged words.

    Raises
    ------
    KvCanaryError
        KVC-M001, M008, M009, C007 (a group array on another device), C008 ... C011, C015, M021, M022.

    Notes
    -----
    One host thread at a time: a hook called while another thread is inside one (or inside
    ``with monitor.forward(batch):``) raises KVC-M026 and changes nothing (:mod:`.hooks`).
    """

    def __init__(
        self,
        *,
        full: KvGroup,
        swa: KvGroup | None = None,
        device: str = "cpu",
        mode: str = "log",
        real_kv_hash_mode: RealKvHashMode | None = None,
        ring_capacity: int = DEFAULT_RING_CAPACITY,
        write_req_capacity: int,
        write_token_capacity: int | None = None,
        verify_capacity: int | None = None,
        sweep_capacity: int | None = None,
        check_verify_expected_token: bool = False,
        max_requests: int | None = None,
        max_context_len: int | None = None,
        warmup_steps: int = 0,
        health_interval: int = 100,
        health_warmup_steps: int = 100,
        bundle_dir=None,
        verify_budget: VerifyBudget | None = None,
        backend: str = "auto",
        prepared: bool | None = None,
        rank: int | None = None,
        verdict: bool = False,
    ):
        groups = check_groups(_FN, full, swa)
        if mode not in MODES:
            raise error("KVC-M001", function=_FN, argument="mode", expected=MODES, got=mode)
        self.mode, self.device, self.rank = mode, device, check_rank(_FN, rank)
        self.xp = xp = array_module(_FN, device)
        self.real_kv_hash_mode = check_hash_mode(_FN, real_kv_hash_mode, groups)  # default: PARTIAL with sources
        self.check_tokens = check_bool(_FN, "check_verify_expected_token", check_verify_expected_token)
        warn_blind_spot(self.check_tokens)
        self.warmup_steps = check_int(_FN, "warmup_steps", warmup_steps, low=0)
        self._placement = here = check_group_placement(_FN, groups, xp)
        self.hook_scope = HookScope(None if xp is np else here.device)  # thread guard, device, scratch (hooks.py)
        backend = resolve_backend(_FN, backend, [("the monitor's buffers", self._placement)])
        prepared = paths.use_prepared(_FN, prepared, backend, xp)
        buffers = MonitorBuffers(
            _FN,
            groups,
            xp=xp,
            device=device,
            hash_mode=self.real_kv_hash_mode,
            chain_assert=self.warmup_steps == 0,
            ring_capacity=ring_capacity,
            write_req_capacity=write_req_capacity,
            write_token_capacity=write_token_capacity,
            verify_capacity=verify_capacity,
            sweep_capacity=sweep_capacity,
            token_pool=(max_requests, max_context_len) if self.check_tokens else None,
        )
        caps = buffers.caps
        self.write_req_capacity, self.write_token_capacity = caps["write_req_capacity"], caps["write_token_capacity"]
        self.sweep_capacity = caps["sweep_capacity"]
        self.batch_checks = BatchChecks(self._placement, caps, check_tokens=self.check_tokens, buffers=buffers)
        self.status, self.ring, self.groups = buffers.status, buffers.ring, buffers.groups
        self.sources = SourceWatch(self.groups, placement=self._placement, mode=self.real_kv_hash_mode)
        self.enable_chain_position_assert = buffers.enable_chain_position_assert
        self.token_pool, self.valid_lens = buffers.token_pool, buffers.valid_lens
        self.readback, self.phase_launches, self.health, self.verdict, self.pump = build_reporting(
            _FN, self, verdict, (health_interval, health_warmup_steps), caps["verify_capacity"], placement=here
        )
        self.step, self.sweeps, self._phase, self._batch, self._launched, self._tail = 0, 0, _IDLE, None, None, None
        self.budget = BudgetState.build(self, verify_budget, _FN)
        self.step_plan = EagerSteps(
            buffers, xp=xp, backend=backend, check_tokens=self.check_tokens, budget=self.budget, verdict=self.verdict
        )
        self.graph, self.fast = None, paths.prepared_steps(self.step_plan, xp) if prepared else None
        self.aftercare = Aftercare(check_bundle_dir(_FN, bundle_dir))  # triage re-checks, bundles
        self.moves = RecordMoves(self.groups, xp=xp, placement=here, steps=self.step_plan, health=self.health)
        self.bundles = self.aftercare.bundles

    @property
    def backend(self) -> str:
        """Where the eager steps launch (``"numpy"`` or ``"cuda"``); settable between steps (prepared: ``"cuda"``)."""
        return self.step_plan.backend

    @backend.setter
    @guarded
    def backend(self, backend: str) -> None:
        fn = self._order("CanaryMonitor.backend", _IDLE)
        self.step_plan.use_backend(paths.switched_backend(fn, backend, self._placement, self.fast))

    _backend = backend  # the spelling earlier test harnesses set

    # --- step hooks -------------------------------------------------------------
    @guarded
    def pre_forward(self, batch: StepBatch) -> None:
        """Plan the step and run the HEAD launches; call before the engine writes KV.

        Raises
        ------
        KvCanaryError
            KVC-M005 (order), KVC-M009, KVC-M002, KVC-M003, KVC-M008, the launches' array codes.
        """
        fn = self._order("CanaryMonitor.pre_forward", _IDLE)
        launched = self.batch_checks(fn, batch)  # all of it, before the first launch (int32 fields: int64 copies)
        self._tail = paths.head(self.graph, self.fast, self.step_plan, launched, self.batch_checks.checked)
        self._batch, self._launched, self._phase = batch, launched, _PRE
        self.pump.mark_planned(self.step)
        self.health.pre += 1  # one HEAD phase's launches

    @guarded
    def post_forward(self) -> None:
        """Run the TAIL launches (verify the prefix against live KV, stamp the new slots).

        The TAIL launches use the batch's arrays as they were at ``pre_forward`` on every path:
        a field reassigned since is checked, not launched on.

        Raises
        ------
        KvCanaryError
            KVC-M005 (order); a field reassigned to a bad array since pre_forward: its codes (the step stays open).
        """
        fn = self._order("CanaryMonitor.post_forward", _PRE)
        self.batch_checks(fn, self._batch)
        self._follow(self.sources.recheck(fn))  # a source moved in place: validated again, followed or refused
        self._tail()
        self._phase = _POST
        self.health.post += 1

    @contextlib.contextmanager
    def forward(self, batch: StepBatch):
        """``with monitor.forward(batch): write_kv()``: pre_forward, the block, post_forward (one hook)."""
        with self.hook_scope.holding("CanaryMonitor.forward"):
            self.pre_forward(batch)
            try:
                yield self
            except BaseException:
                self._phase, self._batch = _IDLE, None  # the step is abandoned: no TAIL launches
                raise
            self.post_forward()

    @guarded
    def end_step(self, sweep: Sequence[SlotChain] | None = None) -> None:
        """Finish the step: optional sweep, then process the (previous, on a GPU) step's readback.

        Raises
        ------
        CanaryViolationError
            Mode ``raise``, the first time violation rows are read back.
        CanaryStalledError
            Mode ``raise``, when a health check finds launches that did not run.
        KvCanaryError
            KVC-M005 when called between pre_forward and post_forward; sweep's codes.
        """
        self._order("CanaryMonitor.end_step", _IDLE, _POST)
        if sweep is not None:
            self.sweep(sweep)
        step, self.step = self.step, self.step + 1
        self._phase, self._batch = _IDLE, None
        self.health.end_step(step)
        if self.step == self.warmup_steps:
            self.finish_warmup()
        if self.budget is not None:
            self.budget.advance(self.xp)
        # The readback skips a snapshot of the previous step that would change nothing (most steps).
        snapshot = self.readback.push(step, self.aftercare.quiet_index(self.pump, step - 1))
        if snapshot is not None:
            self.aftercare.process(self, snapshot, step)
        if self.verdict is not None:
            self.verdict.observe(self.health)  # a failed health check: later words say stalled

    @guarded
    def rebind_sources(self, *, k_sources, v_sources=(), group: str = "full") -> None:
        """Point ``group``'s real-KV sources at new memory (a JAX pool's buffer after an update).

        Parameters
        ----------
        k_sources, v_sources : tuple of RealKvSource
            As many per half as the group was built with, folding as many bytes per slot each.
        group : {"full", "swa"}

        Raises
        ------
        KvCanaryError
            Nothing changed: KVC-M005 after post_forward, C009, M023, R007 ... R011, C007 (:mod:`.sources`).
        """
        fn = self._order("CanaryMonitor.rebind_sources", _IDLE, _PRE, expected=_REBIND)
        self._follow(self.sources.rebind(fn, self.sources.group(fn, group), k_sources, v_sources))

    def _follow(self, change) -> None:  # the paths after the sources changed (paths.follow)
        pending = self._tail if self._phase is _PRE else None
        self.graph, tail = paths.follow(change, self.fast, self.graph, pending, self.step_plan, self._launched)
        self._tail = self._tail if pending is None else tail

    @guarded
    def capture_graph(self, batch: StepBatch) -> None:
        """Capture both launch phases of ``batch`` into CUDA graphs, replayed whenever the hooks get
        this batch object, refilled in place; :meth:`rebind_sources` elsewhere drops the graph.

        Raises
        ------
        KvCanaryError
            KVC-C008 without prepared steps on a GPU, KVC-M005 inside a step, pre_forward's batch codes.
        """
        fn = "CanaryMonitor.capture_graph"
        self.graph = paths.check_capture(fn, self.fast, self.xp, self.device)  # None, or KVC-C008
        self._order(fn, _IDLE)
        self.graph = capture_step(self.fast, self.batch_checks(fn, batch))

    @guarded
    def finish_warmup(self) -> None:
        """Turn the write chain-position assert on (SGLang: ``mark_init_finished``)."""
        self.enable_chain_position_assert.fill(1)

    @guarded
    def sweep(self, chains: Sequence[SlotChain]) -> None:
        """Verify whole chains (FULL slot indices) against the tail buffers (:func:`.sweep.sweep_chains`)."""
        sweep_chains(self._between_steps("sweep"), chains, self.groups, xp=self.xp, health=self.health)
        self.sweeps += 1

    @guarded
    def flush(self) -> None:
        """Process every pending readback, then a merged verdict still copied (end of a run; waits)."""
        self.aftercare.process(self, self.readback.flush(), self.step)
        flush_verdict(self, "CanaryMonitor.flush")

    @guarded
    def apply_verdict(self, merged):
        """Act on the ranks' merged verdict word: :func:`.verdict.apply_verdict` (returns, raises)."""
        return apply_verdict(self, "CanaryMonitor.apply_verdict", merged)

    @property
    def violations(self) -> list[Violation]:
        """Every violation decoded so far, in ring order (rows lost to a full ring are not included)."""
        return self.pump.violations

    @on_device
    def stats(self) -> dict:
        """Counters as of now (reads the device: not for the hot path)."""
        return monitor_stats(self)

    # --- moved records: thin delegations to monitor/moves.py ------------------------
    @guarded
    def take_records(self, slot_indices, run_offsets=None) -> MovedRecords:
        """Take the records of FULL ``slot_indices`` out, with their digest (:meth:`.moves.RecordMoves.take`)."""
        return self.moves.take(self._between_steps("take_records"), slot_indices, run_offsets)

    @guarded
    def put_records(self, moved: MovedRecords, slot_indices) -> None:
        """Put taken records at FULL ``slot_indices``, after their KV (:meth:`.moves.RecordMoves.put`)."""
        self.moves.put(self._between_steps("put_records"), moved, slot_indices)

    @guarded
    def move_records(self, src_slot_indices, dst_slot_indices, *, group: str = "full") -> None:
        """Move one group's records within its pool, after the KV (:meth:`.moves.RecordMoves.move`)."""
        self.moves.move(self._between_steps("move_records"), src_slot_indices, dst_slot_indices, group)

    @guarded
    def verify_records(self, slot_indices, run_offsets, run_start_positions, run_prev_slots) -> None:
        """Check landed runs now; rows come back at end_step (:meth:`.moves.RecordMoves.verify`)."""
        runs = (slot_indices, run_offsets, run_start_positions, run_prev_slots)
        self.moves.verify(self._between_steps("verify_records"), *runs)

    @guarded
    def handoff_digest(self, slot_indices, run_offsets) -> HandoffDigest:
        """One digest per request of the FULL TAIL records and live KV (:meth:`.moves.RecordMoves.digest`)."""
        return self.moves.digest(self._between_steps("handoff_digest"), slot_indices, run_offsets)

    def _order(self, fn: str, *phases: str, expected: str = _ORDER) -> str:  # fn in phases, else KVC-M005
        if self._phase not in phases:
            raise error("KVC-M005", function=fn, state=self._phase, expected=expected)
        return fn

    def _between_steps(self, name: str) -> str:  # KVC-M005 inside a step; moved sources checked first (live KV)
        self._follow(self.sources.recheck(fn := self._order(f"CanaryMonitor.{name}", _IDLE, _POST)))
        return fn
