"""A prefill -> decode pair of toy engines, each with its own monitor, handing requests over.

The prefill engine admits requests and runs their prefill; after the step that prefilled a
request, the pair hands it over (between steps of both engines):

1. the prefill monitor's hand-off digest of the request's slots (``handoff_digest``);
2. its KV and records leave the prefill pool (:func:`.transit.capture`), and the prefill
   engine releases the request;
3. the decode engine gives it a row and pages (:meth:`.scheduler.Scheduler.accept`), the KV
   and records land there (:func:`.transit.land`: checked where the page table says);
4. the decode monitor's digest of the landed slots is compared with the sent one
   (:func:`~kvcanary_numba.check_handoff_digest`, ``on_mismatch="miss"``): a request whose
   digest differs is a cache miss, dropped from the decode engine (:attr:`EnginePair.misses`).

The decode engine then decodes the request to its end. A landing fault of
:data:`~.transit.LANDING_FAULTS` (or ``host_bit_flip``: a byte of the KV in transit) can be
planted in the first hand-off from ``fault_step`` on.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import error
from ..handoff import check_handoff_digest
from .config import EngineConfig
from .engine import ToyEngine
from .transit import LANDING_FAULTS, capture, land

__all__ = ["EnginePair"]

_FAULTS = ("host_bit_flip", *LANDING_FAULTS)


class EnginePair:
    """Two :class:`~kvcanary_numba.engine.ToyEngine` (prefill, decode), each with a monitor.

    Parameters
    ----------
    config : EngineConfig, optional
        Both engines' geometry and the prefill engine's workload (FULL-only pools).
    device : {"cpu", "cuda"}
    fault : str, optional
        A transit fault planted in a hand-off (``host_bit_flip`` or one of ``LANDING_FAULTS``).
    fault_step : int
        The first step at which the fault may fire.
    **monitor_options
        Passed to both engines' ``attach_monitor``.

    Raises
    ------
    KvCanaryError
        KVC-E001 for another fault; ToyEngine's and attach_monitor's codes.

    Attributes
    ----------
    handoffs, misses : list of (step, tokens)
        Requests handed over, and those whose digest differed (dropped as cache misses).
    faults : list of FaultRecord
        The planted fault, when it fired (slots of the decode pool).
    """

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        device: str = "cpu",
        fault=None,
        fault_step=4,
        **monitor_options: Any,
    ):
        if fault is not None and fault not in _FAULTS:
            raise error("KVC-E001", function="EnginePair", argument="fault", expected=_FAULTS, got=fault)
        config = config if config is not None else EngineConfig()
        self.prefill = ToyEngine(config, device=device)
        self.decode = ToyEngine(config, device=device, faults={fault: fault_step} if fault else {})
        self.decode.sched.admit = False  # requests arrive only by hand-off
        self.fault, self.step_index = fault, 0
        self.monitors = (self.prefill.attach_monitor(**monitor_options), self.decode.attach_monitor(**monitor_options))
        self.handoffs: list[tuple[int, list[int]]] = []
        self.misses: list[tuple[int, list[int]]] = []

    @property
    def faults(self) -> list:
        return self.decode.faults

    def step(self) -> None:
        """One step of each engine, then every prefilled request handed over."""
        self.prefill.step()
        if self.decode.sched.running:
            self.decode.step()
        for req in [r for r in self.prefill.sched.running if r.kv_len >= r.prompt_len]:
            if len(self.decode.sched.running) < self.decode.config.max_running:
                self._hand_over(req)
        self.step_index += 1

    def run(self, steps: int) -> None:
        """``steps`` steps of the pair, then both monitors flushed."""
        for _ in range(steps):
            self.step()
        for monitor in self.monitors:
            monitor.flush()

    def _hand_over(self, req) -> None:
        prefill, decode = self.prefill, self.decode
        n, xp = req.kv_len, prefill.xp
        offsets = xp.asarray(np.array([0, n], dtype=np.int64))
        cargo = capture(prefill, req.slots[:n], offsets)  # the records and their digest, in one pass
        sent = cargo.records.digest
        prefill.sched.release(req)
        landed_req = decode.sched.accept(req.tokens, req.prompt_len, req.max_new, n)
        slots, step, injector = landed_req.slots, decode.step_index, decode.injector
        kind = next((k for k in _FAULTS if injector.due(k, step)), None)
        if kind == "pages_swapped" and n < 2 * decode.config.page_size:
            kind = None
        elsewhere = None
        if kind == "host_bit_flip":
            cargo.k[0][-1, 0] ^= 0xFF
        elif kind == "wrong_reload_slots":
            ps = decode.config.page_size
            pages = [decode.sched.pages.alloc(landed_req.rid) for _ in range(-(-n // ps))]  # leaked
            elsewhere = [pg * ps + j for pg in pages for j in range(ps)][:n]
        hit = land(decode, cargo, slots, fault=None if kind == "host_bit_flip" else kind, elsewhere=elsewhere)
        if kind is not None:
            injector.fired(kind, step, slots[-1:] if kind == "host_bit_flip" else hit, f"hand-off of {n} slots")
        got = decode.monitor.handoff_digest(xp.asarray(np.asarray(slots, dtype=np.int64)), offsets)
        self.handoffs.append((self.step_index, list(req.tokens)))
        if not bool(check_handoff_digest(sent, got, on_mismatch="miss")[0]):
            self.misses.append((self.step_index, list(req.tokens)))
            decode.sched.release(landed_req)  # a cache miss: the decode engine does not serve it
