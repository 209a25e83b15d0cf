"""ToyEngine: a small, deterministic paged KV engine that drives a CanaryMonitor.

It schedules prefill and decode for a few requests, allocates pages, writes KV
bytes that are a function of (token, position, layer), shares prefixes through
a tiny prefix cache, keeps an SWA sub-pool with a full->SWA LUT when asked,
and calls the monitor hooks around its "forward" in SGLang's order. Faults
from :data:`~kvcanary_numba.engine.faults.FAULT_CLASSES` can be planted at a
chosen step; a clean run must report nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import numpy as np

from .._runtime import array_module, coded_allocation
from .._validate import check_bool, check_int
from ..constants import DEFAULT_RING_CAPACITY, RealKvHashMode
from ..errors import error
from ..monitor import CanaryMonitor, KvGroup, SlotChain, StepBatch
from .config import EngineConfig
from .faults import ALL_FAULT_CLASSES, TRANSIT_FAULT_CLASSES, FaultInjector, FaultRecord
from .host_tier import HostTier
from .memory import KvPool
from .scheduler import HostBatch, Scheduler

__all__ = ["ToyEngine"]

_FN = "ToyEngine"
_BATCH_FIELDS = {  # StepBatch field -> HostBatch field
    "req_pool_indices": "req_pool_indices",
    "prefix_lens": "prefix_lens",
    "extend_seq_lens": "extend_seq_lens",
    "input_ids": "input_ids",
    "positions": "positions",
    "out_cache_loc": "out_cache_loc",
    "expected_input_tokens": "expected_tokens",
    "expected_input_positions": "expected_positions",
    "token_ids_flat": "token_ids_flat",
    "token_offsets": "token_offsets",
}


def _fault_schedule(faults, fault_step: int) -> dict[str, int]:
    """Fault name -> first step, from names or a mapping (KVC-E004, KVC-E001, KVC-C011)."""
    if isinstance(faults, Mapping):
        schedule = dict(faults)
    elif isinstance(faults, (list, tuple, set, frozenset)):
        schedule = dict.fromkeys(faults, fault_step)
    else:  # a bare string would be read letter by letter
        raise error(
            "KVC-E004",
            function=_FN,
            argument="faults",
            expected="a list of fault names or a mapping of name to step",
            got=type(faults).__name__,
        )
    for name, at in schedule.items():
        if name not in ALL_FAULT_CLASSES:
            raise error("KVC-E001", function=_FN, argument="faults", expected=tuple(ALL_FAULT_CLASSES), got=name)
        check_int(_FN, f"faults[{name!r}]", at, low=0)
    return schedule


class ToyEngine:
    """Deterministic toy paged KV engine with fault injection.

    Parameters
    ----------
    config : EngineConfig, optional
        Pool geometry and workload (default: a small FULL-only pool).
    device : {"cpu", "cuda"}
        Where the KV pool, tables and batch arrays live (NumPy or CuPy).
    faults : list, tuple or set of str, or mapping of str to int
        Fault classes to plant; a mapping gives each its first possible step,
        names alone use ``fault_step``.
    fault_step : int
        Default first step of the faults.
    host_tier : int, optional
        Offload idle cached prefixes to host memory, keeping this many in the pool (the least
        recently used go first), and reload them when a request asks (:mod:`.host_tier`).
        Default: off, or 0 when a transit fault is planted. FULL-only pools.

    Raises
    ------
    KvCanaryError
        KVC-E004 for a config that is not an EngineConfig or faults of another
        type, KVC-E001 for an unknown fault, KVC-C011, KVC-C009 (a host tier with an
        SWA window), KVC-C008, and EngineConfig's codes.
    """

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        device: str = "cpu",
        faults: Iterable[str] | Mapping[str, int] = (),
        fault_step: int = 8,
        host_tier: int | None = None,
    ):
        c = config if config is not None else EngineConfig()
        if not isinstance(c, EngineConfig):
            raise error("KVC-E004", function=_FN, argument="config", expected="an EngineConfig", got=type(c).__name__)
        xp = array_module(_FN, device)
        schedule = _fault_schedule(faults, check_int(_FN, "fault_step", fault_step, low=0))
        if host_tier is None and set(schedule) & set(TRANSIT_FAULT_CLASSES):
            host_tier = 0
        if host_tier is not None:
            host_tier = check_int(_FN, "host_tier", host_tier, low=0)
            if c.swa_window:
                raise error(
                    "KVC-C009",
                    function=_FN,
                    argument="config.swa_window (with a host tier)",
                    expected=(0,),
                    got=c.swa_window,
                )
        self.config, self.device, self.xp = c, device, xp
        with coded_allocation(_FN, "config.num_pages", c.num_pages, what="KV pool", nbytes=c.pool_bytes):
            self.sched = Scheduler(c)
            self.kv = KvPool(
                num_slots=c.num_slots,
                page_size=c.page_size,
                bytes_per_token=c.bytes_per_token,
                num_layers=c.num_layers,
                xp=xp,
            )
            self.swa_kv = None
            if c.swa_window:
                self.swa_kv = KvPool(
                    num_slots=c.num_slots,
                    page_size=1,
                    bytes_per_token=c.bytes_per_token,
                    num_layers=c.num_layers,
                    xp=xp,
                    lane_offset=2 * c.num_layers,
                )
        on_host = xp is np
        self.req_to_token = self.sched.req_to_token if on_host else xp.asarray(self.sched.req_to_token)
        self.lut = self.sched.lut if on_host else xp.asarray(self.sched.lut)
        self._buffers = {} if on_host else self._device_buffers()
        self.injector = FaultInjector(self, schedule)
        self.host_tier = None if host_tier is None else HostTier(self, host_tier)
        self.monitor: CanaryMonitor | None = None
        self.sweep_interval = 0
        self.oracle = True
        self.step_index = 0

    def _device_buffers(self) -> dict:
        c = self.config
        sizes = dict.fromkeys(_BATCH_FIELDS, c.max_batch_tokens)
        sizes.update(
            req_pool_indices=c.max_running,
            prefix_lens=c.max_running,
            extend_seq_lens=c.max_running,
            token_offsets=c.max_running + 1,
            token_ids_flat=c.max_running * c.max_tokens,
        )
        return {name: self.xp.zeros(n, dtype=np.int64) for name, n in sizes.items()}

    # --- monitor ------------------------------------------------------------------
    def attach_monitor(
        self,
        *,
        mode: str = "log",
        real_kv_hash_mode: RealKvHashMode = RealKvHashMode.ALL,
        check_tokens: bool = True,
        write_input_assert: bool = True,
        sweep_interval: int = 0,
        v_half: bool = False,
        ring_capacity: int = DEFAULT_RING_CAPACITY,
        warmup_steps: int = 0,
        health_interval: int = 100,
        health_warmup_steps: int = 100,
        bundle_dir=None,
        verify_budget=None,
        backend: str = "auto",
        prepared: bool | None = None,
        rank: int | None = None,
        verdict: bool = False,
    ) -> CanaryMonitor:
        """Build a :class:`CanaryMonitor` over this engine's pool and call it every step.

        Everything is validated and the monitor built before the engine changes:
        a rejected call leaves the engine as it was.

        Parameters
        ----------
        mode, real_kv_hash_mode
            Passed to the monitor.
        check_tokens : bool
            Verify stored tokens against the requests' token lists.
        write_input_assert : bool
            Give the write kernels the oracle's expected tokens and positions.
        sweep_interval : int
            Sweep every cached prefix and running chain every N steps (0 = never).
        v_half : bool
            Also guard the V half (SGLang's default leaves it off: half the launches).
        ring_capacity, warmup_steps, health_interval, health_warmup_steps : int
            Passed to the monitor (see :class:`CanaryMonitor`).
        bundle_dir : str or os.PathLike, optional
            Folder for replayable violation bundles (see :class:`CanaryMonitor`).
        verify_budget : VerifyBudget, optional
            Budgeted verification (see :class:`CanaryMonitor`).
        backend, prepared
            Passed to the monitor: where its launches run and whether they are prepared
            (``backend="cuda"`` on a CPU engine runs the kernels under the simulator: tests).
        rank, verdict
            Passed to the monitor: its rank in a job of several, and the per-step verdict word
            the ranks merge (``examples/ranks/``).

        Raises
        ------
        KvCanaryError
            KVC-C010, KVC-C011, and CanaryMonitor's codes.
        """
        c = self.config
        mode_ = RealKvHashMode(
            check_int(_FN, "real_kv_hash_mode", real_kv_hash_mode, low=0, high=len(RealKvHashMode) - 1)
        )
        sweep_interval = check_int(_FN, "sweep_interval", sweep_interval, low=0)
        oracle = check_bool(_FN, "write_input_assert", write_input_assert)
        v_half = check_bool(_FN, "v_half", v_half)

        def group(kind: str, pool: KvPool, **extra) -> KvGroup:
            v_sources = pool.sources("v", mode_) if v_half else ()
            return KvGroup(
                kind=kind,
                num_slots=c.num_slots,
                k_sources=pool.sources("k", mode_),
                v_sources=v_sources,
                has_v=v_half,
                **extra,
            )

        full = group("full", self.kv)
        swa = None
        if self.swa_kv is not None:
            swa = group("swa", self.swa_kv, swa_window_size=c.swa_window, full_to_swa_index_mapping=self.lut)
        monitor = CanaryMonitor(
            full=full,
            swa=swa,
            device=self.device,
            mode=mode,
            real_kv_hash_mode=mode_,
            write_req_capacity=c.max_running,
            write_token_capacity=c.max_batch_tokens,
            check_verify_expected_token=check_tokens,
            max_requests=c.req_rows,
            max_context_len=c.max_tokens,
            ring_capacity=ring_capacity,
            warmup_steps=warmup_steps,
            health_interval=health_interval,
            health_warmup_steps=health_warmup_steps,
            bundle_dir=bundle_dir,
            verify_budget=verify_budget,
            backend=backend,
            prepared=prepared,
            rank=rank,
            verdict=verdict,
        )
        self.monitor, self.sweep_interval, self.oracle = monitor, sweep_interval, oracle
        return monitor

    # --- stepping -------------------------------------------------------------------
    def _sync_tables(self) -> None:
        if self.xp is not np:  # host bookkeeping -> device copies the kernels read
            self.req_to_token.set(self.sched.req_to_token)
            self.lut.set(self.sched.lut)

    def _device_batch(self, hb: HostBatch) -> StepBatch:
        arrays = {}
        for name, source in _BATCH_FIELDS.items():
            host = getattr(hb, source)
            if self.xp is np:
                arrays[name] = host
            else:
                arrays[name] = view = self._buffers[name][: host.shape[0]]
                view.set(host)
        if not self.oracle:
            arrays["expected_input_tokens"] = arrays["expected_input_positions"] = None
        return StepBatch(req_to_token=self.req_to_token, **arrays)

    def _forward(self, hb: HostBatch) -> None:
        """The model's KV writes: every layer, K and V, of every new token (as fed, faults included)."""
        self.kv.write(hb.out_cache_loc, hb.input_ids, hb.positions)
        if self.swa_kv is not None:
            self.swa_kv.write(self.sched.lut[hb.out_cache_loc], hb.input_ids, hb.positions)

    def step(self) -> HostBatch:
        """Run one engine step (schedule, monitor pre hook, forward, monitor post hook, finish)."""
        t, injector, monitor = self.step_index, self.injector, self.monitor
        injector.before_schedule(t)
        hb = self.sched.schedule()
        injector.after_schedule(t, hb)
        self._sync_tables()
        if monitor is not None:
            monitor.pre_forward(self._device_batch(hb))
        self._forward(hb)
        if monitor is not None:
            monitor.post_forward()
        injector.after_forward(t)
        self.sched.complete()
        self.step_index += 1
        if monitor is not None:
            self._sync_tables()
            due = self.sweep_interval and self.step_index % self.sweep_interval == 0
            monitor.end_step(sweep=self.live_chains() if due else None)
        if self.host_tier is not None:
            self.host_tier.after_step(self.step_index)  # between steps: offload, records with their KV
        return hb

    def run(self, steps: int, progress: Callable[[int, int], None] | None = None) -> None:
        """Run ``steps`` steps, then flush the monitor's pending readback."""
        steps = check_int(_FN, "steps", steps, low=0)
        for i in range(steps):
            self.step()
            if progress is not None:
                progress(i + 1, steps)
        if self.monitor is not None:
            self.monitor.flush()

    # --- inspection -------------------------------------------------------------------
    def live_chains(self) -> list[SlotChain]:
        """Chains a sweep should cover: every cached prefix and every running request's written KV."""
        chains = [SlotChain(slots=e.slots) for e in self.sched.entries.values()]
        chains += [SlotChain(slots=r.slots[: r.kv_len]) for r in self.sched.running if r.kv_len]
        return chains

    @property
    def faults(self) -> list[FaultRecord]:
        """Faults that fired so far."""
        return list(self.injector.records)

    def catches(self) -> dict[str, list]:
        """Fault kind -> the monitor's violations that report it (empty list: missed)."""
        found = self.monitor.violations if self.monitor is not None else []
        return {f.kind: [v for v in found if f.caught_by(v)] for f in self.injector.records}
