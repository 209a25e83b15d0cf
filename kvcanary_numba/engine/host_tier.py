"""The toy engine's host tier: idle cached prefixes go to host memory and come back when needed.

After every step, the least recently used idle prefixes beyond ``keep_idle`` leave the pool:
their KV and canary records are copied to host memory (:func:`.transit.capture`) and their
pages freed. A request that asks for an offloaded prefix reloads it into other pages
(:func:`.transit.land`: records with their KV, the landed run checked where the page table
says), as SGLang's hierarchical cache does. The transit faults are planted here:
``host_bit_flip`` and ``stale_host_copy`` act on the host copy, the others while it lands.
"""

from __future__ import annotations

from dataclasses import dataclass

from .faults import TRANSIT_FAULT_CLASSES
from .scheduler import CACHE_OWNER, PrefixEntry
from .transit import LANDING_FAULTS, Cargo, capture, land

__all__ = ["HostCopy", "HostTier"]


@dataclass
class HostCopy:
    """A prefix in host memory: its tokens, the pages it left, its KV and records."""

    prefix_id: int
    tokens: list[int]
    origin_pages: list[int]
    cargo: Cargo


class HostTier:
    """Offload and reload of a :class:`~kvcanary_numba.engine.ToyEngine`'s cached prefixes.

    Parameters
    ----------
    engine : ToyEngine
        A FULL-only engine (its scheduler's reload hook is set here).
    keep_idle : int
        Idle prefixes kept in the pool; the least recently used beyond them are offloaded.
    """

    def __init__(self, engine, keep_idle: int):
        self.engine, self.keep_idle = engine, keep_idle
        self.copies: dict[int, HostCopy] = {}
        self.last_used: dict[int, int] = {}
        self.offloads = self.reloads = 0
        self._stale: tuple[int, int] | None = None  # (prefix id, step) of a planted stale host copy
        engine.sched.reload = self.reload

    def after_step(self, step: int) -> None:
        """Offload the least recently used idle prefixes beyond ``keep_idle`` (between steps)."""
        entries = self.engine.sched.entries
        for entry in entries.values():
            if entry.refs:
                self.last_used[entry.prefix_id] = step
        idle = sorted((e for e in entries.values() if e.refs == 0), key=lambda e: self.last_used.get(e.prefix_id, -1))
        for entry in idle[: max(0, len(idle) - self.keep_idle)]:
            self.offload(entry, step)

    def offload(self, entry: PrefixEntry, step: int) -> None:
        """Copy ``entry`` to host memory and free its pages."""
        sched, injector = self.engine.sched, self.engine.injector
        copy = HostCopy(entry.prefix_id, list(entry.tokens), list(entry.pages), capture(self.engine, entry.slots))
        others = [c for c in self.copies.values() if c.prefix_id != entry.prefix_id]
        if injector.due("stale_host_copy", step) and others and self._stale is None:
            # The host buffers of an offloaded prefix are reused for this one while its index still names them.
            stale = others[0]
            self.copies[stale.prefix_id] = HostCopy(stale.prefix_id, stale.tokens, stale.origin_pages, copy.cargo)
            sched.forced_prefix = stale.prefix_id  # the next request asks for it
            self._stale = (stale.prefix_id, step)
        self.copies[entry.prefix_id] = copy
        sched.evict_prefix(entry, keep_index=False)
        self.offloads += 1

    def reload(self, prefix_id: int) -> PrefixEntry | None:
        """Bring an offloaded prefix back into new pages (the scheduler's hook); None when not offloaded."""
        copy = self.copies.pop(prefix_id, None)
        if copy is None:
            return None
        engine = self.engine
        sched, injector, ps, step = engine.sched, engine.injector, engine.config.page_size, engine.step_index
        alloc = lambda: sched.pages.alloc_avoiding(CACHE_OWNER, copy.origin_pages)  # noqa: E731
        pages = [alloc() for _ in range(len(copy.tokens) // ps)]
        slots = [pg * ps + j for pg in pages for j in range(ps)]
        if injector.due("host_bit_flip", step):
            copy.cargo.k[0][-1, 0] ^= 0xFF  # K layer 0 byte 0 of the last slot, in host memory
            injector.fired("host_bit_flip", step, slots[-1:], f"host copy of prefix {prefix_id}, its last slot")
        fault = next((kind for kind in LANDING_FAULTS if injector.due(kind, step)), None)
        if fault == "pages_swapped" and len(pages) < 2:
            fault = None
        elsewhere = None
        if fault == "wrong_reload_slots":
            elsewhere = [pg * ps + j for pg in (alloc() for _ in pages) for j in range(ps)]  # leaked pages
        hit = land(engine, copy.cargo, slots, fault=fault, elsewhere=elsewhere)
        if fault is not None:
            injector.fired(fault, step, hit, f"reload of prefix {prefix_id}: {TRANSIT_FAULT_CLASSES[fault][0]}")
        if self._stale is not None and self._stale[0] == prefix_id:
            self._stale = None
            injector.fired("stale_host_copy", step, slots, f"prefix {prefix_id} reloaded from reused host memory")
        entry = PrefixEntry(prefix_id, copy.tokens, slots, pages, [])
        sched.entries[prefix_id] = entry
        self.reloads += 1
        return entry
