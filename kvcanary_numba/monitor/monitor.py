"""CanaryMonitor: the per-step canary of one KV pool, in SGLang's order.

A step is ``pre_forward(batch)`` → the engine writes KV → ``post_forward()`` → ``end_step()``:

1. pre_forward: (expected-token scatter,) each group's plan, then the HEAD launches
   (verify, then write) of K and V, without real-KV sources.
2. post_forward: each group's TAIL launches (verify, then write) with real-KV sources.
3. end_step: an optional sweep of given chains (verify only, SWEEP tags), then the
   status readback: new violation rows, overflow warnings, health check.

Composition, no base classes: buffers (:mod:`.buffers`), batch checks, the step plan
(:class:`~.steps.EagerSteps`), on a GPU the fast wing's prepared steps and a captured
CUDA graph (:meth:`CanaryMonitor.capture_graph`), readback, pump, health, aftercare,
budget. Each phase runs on the fastest of graph, prepared steps and plan.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import numpy as np

from .._runtime import array_module
from .._validate import check_bool, check_int
from ..constants import DEFAULT_RING_CAPACITY, RealKvHashMode
from ..errors import error
from ..fast.capture import capture_step
from ..fast.steps import PreparedSteps
from .batch import BatchChecks, StepBatch
from .budget import BudgetState, VerifyBudget
from .buffers import MonitorBuffers
from .bundle import Aftercare, check_bundle_dir
from .device import HookDevice, hooks_on_own_device
from .groups import KvGroup, check_group_placement, check_groups
from .health import HealthChecker
from .paths import check_backend, check_capture, resolve_paths, run_head
from .pump import CanaryViolationError, ViolationPump
from .readback import CudaReadback, HostReadback
from .report import Violation
from .status import Snapshot
from .steps import EagerSteps
from .sweep import SlotChain, build_sweep_entries, launch_sweep
from .triage import warn_blind_spot
from .verdict import VerdictState, check_rank

__all__ = ["CanaryMonitor", "CanaryViolationError", "MODES"]

MODES = ("log", "raise")
_FN = "CanaryMonitor"
_IDLE, _PRE, _POST = "idle", "between pre_forward and post_forward", "after post_forward"
_ORDER = "pre_forward -> (engine writes KV) -> post_forward -> end_step"
_HOOKS = ("pre_forward", "post_forward", "end_step", "capture_graph", "finish_warmup", "sweep", "flush", "stats")


@hooks_on_own_device(*_HOOKS, "apply_verdict")  # each runs on the monitor's device (.device)
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
        ``log``: one ``logging.warning`` per violation. ``raise``: one
        :class:`CanaryViolationError` with all rows, raised once.
    real_kv_hash_mode : RealKvHashMode, optional
        Default: PARTIAL when any group has sources, else NONE.
    ring_capacity : int
        Violation rows kept (fill-once; later rows are counted, not stored).
        Every capacity and size is at most ``2**31 - 1`` (int32 device counters,
        KVC-C011); buffers that do not fit in memory raise KVC-C015.
    write_req_capacity : int
        Largest batch (requests) of a step.
    write_token_capacity : int, optional
        Largest number of new tokens of a step (default: FULL slots).
    verify_capacity : int, optional
        Verify entries per step and group (default 3 x FULL slots, as SGLang).
    sweep_capacity : int, optional
        Slots one sweep may cover (default: FULL slots).
    check_verify_expected_token : bool
        Verify stored tokens against a per-request token pool; needs
        ``max_requests`` and ``max_context_len`` and a token snapshot per batch.
        Off, the monitor cannot see a corrupted token in a request's newest
        slot and says so with a :class:`~.triage.CanaryBlindSpotWarning`.
    max_requests, max_context_len : int, optional
        Shape of that token pool (req_to_token rows, context length).
    warmup_steps : int
        Steps run with the write chain-position assert off (synthetic warm-up
        positions); 0 turns it on from the start. See :meth:`finish_warmup`.
    health_interval, health_warmup_steps : int
        Health check cadence (0 = off) and the steps before the first check.
    bundle_dir : str or path, optional
        Write a replayable bundle (``.npz``, :mod:`.bundle`) of every readback
        that finds new violation rows into this directory (created if missing);
        ``kvcanary inspect BUNDLE`` replays one. Paths: :attr:`bundles`.
    verify_budget : VerifyBudget, optional
        Budgeted verification (:mod:`.budget`): each step verifies only the
        prefix entries due then; every entry that stays in the plans for K
        consecutive steps is verified within them (K: ``stats()["verify_period"]``).
    backend : {"auto", "numpy", "cuda"}
        Where the launches run: ``auto`` follows ``device``. ``cuda`` with
        ``device="cpu"`` runs the Numba-CUDA kernels on NumPy buffers under Numba's
        CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``): for tests and host-time
        measurements, not for production.
    prepared : bool, optional
        Record each batch shape's launches once and relaunch them (the fast wing's
        prepared steps) instead of running the step plan every step. Default: on
        with ``device="cuda"``. True needs the kernels (``backend`` resolving to
        ``cuda``); under the simulator it records without compiling (tests).
    rank : int, optional
        This monitor's rank in a job of several (>= 0): named in reports, errors and bundles.
    verdict : bool
        Write a per-step verdict word ranks merge (:mod:`.verdict`); ``raise`` then raises in :meth:`apply_verdict`.

    Attributes
    ----------
    step_plan : EagerSteps
        Which launches each phase makes; run every step on the eager path.
    fast : PreparedSteps or None
        The prepared steps (None: every step runs the plan). Setting it to None
        switches a monitor to the eager path (benchmarks compare both).
    graph : CapturedStep or None
        The captured step (:meth:`capture_graph`).
    phase_launches : (ndarray, ndarray)
        Launches per tag of one HEAD and one TAIL phase (int64 ``[NUM_LAUNCH_TAGS]`` each).
    verdict : VerdictState or None
        The verdict word (``verdict.word``) and what acts on merged words.

    Raises
    ------
    KvCanaryError
        KVC-M001, KVC-M008, KVC-M009, KVC-C007 (a group array on another device),
        KVC-C008, KVC-C009, KVC-C010, KVC-C011, KVC-C015, KVC-M021, KVC-M022.
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
        if real_kv_hash_mode is None:
            has_sources = any(g.k_sources or g.v_sources for g in groups)
            real_kv_hash_mode = RealKvHashMode.PARTIAL if has_sources else RealKvHashMode.NONE
        self.real_kv_hash_mode = RealKvHashMode(check_int(_FN, "real_kv_hash_mode", real_kv_hash_mode, low=0, high=2))
        self.check_tokens = check_bool(_FN, "check_verify_expected_token", check_verify_expected_token)
        warn_blind_spot(self.check_tokens)
        self.warmup_steps = check_int(_FN, "warmup_steps", warmup_steps, low=0)
        interval = check_int(_FN, "health_interval", health_interval, low=0)
        health_warmup = check_int(_FN, "health_warmup_steps", health_warmup_steps, low=0)
        self._placement = here = check_group_placement(_FN, groups, xp)
        self.hook_device = HookDevice(None if xp is np else here.device)  # current around each hook
        backend, prepared = resolve_paths(_FN, backend, prepared, here, xp)
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
        self.batch_checks = BatchChecks(self._placement, caps, check_tokens=self.check_tokens)
        self.status, self.ring, self.groups = buffers.status, buffers.ring, buffers.groups
        self.enable_chain_position_assert = buffers.enable_chain_position_assert
        self.token_pool, self.valid_lens = buffers.token_pool, buffers.valid_lens
        self.readback = readback = HostReadback(self.status) if xp is np else CudaReadback(self.status)
        self.phase_launches = tuple(sum(g.launch_counts(stage) for g in self.groups) for stage in ("head", "tail"))
        self.health = health = HealthChecker(interval=interval, warmup_steps=health_warmup, phases=self.phase_launches)
        plans = [(g.kind.upper(), caps["verify_capacity"]) for g in self.groups]
        self.verdict = VerdictState.build(_FN, verdict, self, placement=here)  # None unless verdict=True
        pump_mode = "log" if self.verdict else mode  # with a verdict, every rank raises together (apply_verdict)
        self.pump = ViolationPump(
            mode=pump_mode, ring=self.ring, readback=readback, health=health, plan_capacities=plans, rank=self.rank
        )
        self.step = self.sweeps = 0
        self._phase, self._batch, self._tail = _IDLE, None, None
        self.budget = BudgetState.build(self, verify_budget, _FN)
        self.step_plan = EagerSteps(
            buffers, xp=xp, backend=backend, check_tokens=self.check_tokens, budget=self.budget, verdict=self.verdict
        )
        self.graph = None
        # On a GPU, PreparedSteps compiles the kernels every step uses now (never inside a capture).
        self.fast = PreparedSteps(self.step_plan, compile=xp is not np) if prepared else None
        self.aftercare = Aftercare(check_bundle_dir(_FN, bundle_dir))  # triage re-checks, bundles
        self.bundles = self.aftercare.bundles

    @property
    def backend(self) -> str:
        """Where the eager steps launch: ``"numpy"`` or ``"cuda"``; settable between steps (with
        prepared steps, only to ``"cuda"``: they launch the kernels)."""
        return self.step_plan.backend

    @backend.setter
    def backend(self, backend: str) -> None:
        fn = "CanaryMonitor.backend"
        if self._phase is not _IDLE:
            raise error("KVC-M005", function=fn, state=self._phase, expected=_ORDER)
        self.step_plan.use_backend(check_backend(fn, backend, self._placement, prepared=self.fast is not None))

    _backend = backend  # the spelling earlier test harnesses set

    # --- step hooks -------------------------------------------------------------
    def pre_forward(self, batch: StepBatch) -> None:
        """Plan the step and run the HEAD launches; call before the engine writes KV.

        Raises
        ------
        KvCanaryError
            KVC-M005 (order), KVC-M009, KVC-M002, KVC-M003, KVC-M008, and the
            launch functions' codes for malformed batch arrays.
        """
        fn = "CanaryMonitor.pre_forward"
        if self._phase is not _IDLE:
            raise error("KVC-M005", function=fn, state=self._phase, expected=_ORDER)
        self.batch_checks(fn, batch)  # all of it, before the first launch
        self._tail = run_head(self.graph, self.fast, self.step_plan, batch, self.batch_checks.checked)
        self._batch, self._phase = batch, _PRE
        self.pump.mark_planned(self.step)
        self.health.pre += 1  # one HEAD phase's launches (health.host counts them per tag)

    def post_forward(self) -> None:
        """Run the TAIL launches (verify the prefix against live KV, stamp the new slots).

        Raises
        ------
        KvCanaryError
            KVC-M005 (order); the batch's array codes when one of its fields was
            reassigned to a bad array since pre_forward (the step stays open).

        Notes
        -----
        The TAIL launches use the batch's arrays as they were at ``pre_forward`` (the
        ones the step was planned with) on every path: a field reassigned since is
        checked, not launched on.
        """
        fn = "CanaryMonitor.post_forward"
        if self._phase is not _PRE:
            raise error("KVC-M005", function=fn, state=self._phase, expected=_ORDER)
        self.batch_checks(fn, self._batch)
        self._tail()
        self._phase = _POST
        self.health.post += 1

    @contextlib.contextmanager
    def forward(self, batch: StepBatch):
        """``with monitor.forward(batch): write_kv()``: pre_forward, the block, post_forward."""
        self.pre_forward(batch)
        try:
            yield self
        except BaseException:
            self._phase, self._batch = _IDLE, None  # the step is abandoned: no TAIL launches
            raise
        self.post_forward()

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
        if self._phase is _PRE:
            raise error("KVC-M005", function="CanaryMonitor.end_step", state=self._phase, expected=_ORDER)
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

    # --- controls ---------------------------------------------------------------
    def capture_graph(self, batch: StepBatch) -> None:
        """Capture both launch phases of ``batch`` into CUDA graphs, replayed whenever
        :meth:`pre_forward` / :meth:`post_forward` get this same batch object.

        The engine must refill the batch arrays in place (same objects and shapes)
        between steps. Health counting is unchanged: each replay counts its launches.

        Raises
        ------
        KvCanaryError
            KVC-C008 without prepared steps on a GPU, KVC-M005 between pre_forward and
            end_step, and pre_forward's codes for the batch.
        """
        fn = "CanaryMonitor.capture_graph"
        self.graph = None
        check_capture(fn, self.fast, self.xp, self.device)
        if self._phase is not _IDLE:
            raise error("KVC-M005", function=fn, state=self._phase, expected=_ORDER)
        self.batch_checks(fn, batch)
        self.graph = capture_step(self.fast, batch)

    def finish_warmup(self) -> None:
        """Turn the write chain-position assert on (SGLang: ``mark_init_finished``)."""
        self.enable_chain_position_assert.fill(1)

    def sweep(self, chains: Sequence[SlotChain]) -> None:
        """Verify whole chains (FULL slot indices) against the tail buffers, SWEEP tags.

        Parameters
        ----------
        chains : list or tuple of SlotChain
            Checked before the first launch (a generator is refused: KVC-M009).

        Raises
        ------
        KvCanaryError
            KVC-M005 (between pre_forward and post_forward), KVC-M009, KVC-M004.
        """
        fn = "CanaryMonitor.sweep"
        if self._phase is _PRE:
            raise error("KVC-M005", function=fn, state=self._phase, expected=_ORDER)
        entries = build_sweep_entries(fn, chains, self.sweep_capacity)  # every check before the first launch
        self.health.add(sum(launch_sweep(self.xp, g, entries) for g in self.groups))  # in group order
        self.sweeps += 1

    def flush(self) -> None:
        """Process every pending readback, then a merged verdict still copied (end of a run; waits)."""
        self.aftercare.process(self, self.readback.flush(), self.step)
        if self.verdict is not None:
            self.verdict.flush("CanaryMonitor.flush", step=self.step, violations=self.pump.violations)

    def apply_verdict(self, merged):
        """Act on the ranks' merged verdict word: :meth:`.verdict.VerdictState.apply` (what it returns
        and raises); KVC-M050 on a monitor built without ``verdict=True``."""
        fn = "CanaryMonitor.apply_verdict"
        if self.verdict is None:
            raise error("KVC-M050", function=fn)
        return self.verdict.apply(fn, merged, step=self.step, violations=self.pump.violations)

    @property
    def violations(self) -> list[Violation]:
        """Every violation decoded so far, in ring order (rows lost to a full ring are not included)."""
        return self.pump.violations

    def stats(self) -> dict:
        """Counters as of now (reads the device: not for the hot path)."""
        snap = Snapshot(self.step, self.status.words.get() if self.xp is not np else self.status.words.copy())
        return {
            "step": self.step,
            "protected_tokens": int(snap.slot_run_counters.sum()),
            "kernel_runs": int(snap.kernel_run_counters.sum()),
            "sweep_passes": self.sweeps,
            "violations_recorded": snap.write_index,
            "violations_decoded": len(self.violations),
            **({} if self.budget is None else self.budget.stats()),
        }
