"""KV groups of a monitored pool: their canary buffers, launch contexts and plans.

SGLang's layout per group (FULL, and SWA for sliding-window pools): four canary
buffers ``k_head, k_tail, v_head, v_tail`` (uint8 ``[num_slots, 32]``, the V
pair only when the pool has a V half). HEAD launches use the head buffers and
no real-KV sources (the forward has not written the KV yet); TAIL and SWEEP
launches share the tail buffers and fingerprint the live KV.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._runtime import INT32_MAX
from .._validate import check_array, check_bool, check_int, inspect_array, resolve_backend
from ..constants import CANARY_SLOT_BYTES, NUM_LAUNCH_TAGS, OUT_OF_RANGE_SLOT, CanaryLaunchTag, RealKvHashMode
from ..context import CanaryContext, RealKvSource, check_real_kv_sources
from ..errors import error
from ..plans import VerifyPlan, WritePlan

__all__ = [
    "KvGroup",
    "GroupState",
    "Endpoint",
    "check_group_placement",
    "check_groups",
    "check_hash_mode",
    "check_type",
    "translate_slots",
]

_KINDS = ("full", "swa")
_LOC_VIEWS = 64  # token counts whose translated-slot views a group keeps


@dataclass(frozen=True, slots=True, kw_only=True)
class KvGroup:
    """Description of one KV group (sub-pool) the monitor protects.

    Attributes
    ----------
    kind : {"full", "swa"}
        FULL verifies every prefix slot; SWA only the last ``swa_window_size``
        positions, addressed through ``full_to_swa_index_mapping``.
    num_slots : int
        KV slots of the group (slot 0 = padding), in ``[1, 2**31 - 1]`` (slots are
        int32 in req_to_token); canary slot index == KV slot index.
    k_sources, v_sources : tuple of RealKvSource
        Live KV fingerprinted by TAIL and SWEEP launches (SGLang: layer 0 only);
        at most 4 each, every one covering ``num_slots`` slots (checked here, so a
        monitor never fails mid-step on a source).
    has_v : bool
        The pool has a V half (False for MLA-style K-only pools): V launches run.
    swa_window_size : int
        0 for FULL, the sliding window for SWA.
    full_to_swa_index_mapping : int64 [full_slots + 1] or None
        SWA groups only: FULL slot -> SWA slot, 0 = evicted / padding.

    Raises
    ------
    KvCanaryError
        KVC-C009, KVC-C011, KVC-C010, KVC-M006, KVC-M007, KVC-R007 … KVC-R009 for
        the sources, and the array codes KVC-C001 … KVC-C006 for the mapping.
    """

    kind: str
    num_slots: int
    k_sources: tuple[RealKvSource, ...] = ()
    v_sources: tuple[RealKvSource, ...] = ()
    has_v: bool = True
    swa_window_size: int = 0
    full_to_swa_index_mapping: Any = None

    def __post_init__(self) -> None:
        fn = "KvGroup"
        if self.kind not in _KINDS:
            raise error("KVC-C009", function=fn, argument="kind", expected=_KINDS, got=self.kind)
        num_slots = check_int(fn, "num_slots", self.num_slots, low=1, high=INT32_MAX)
        check_bool(fn, "has_v", self.has_v)
        window = check_int(fn, "swa_window_size", self.swa_window_size, low=0, high=2**63 - 1)
        swa = self.kind == "swa"
        if swa != (window > 0):
            raise error(
                "KVC-M006",
                function=fn,
                argument="swa_window_size",
                expected="> 0" if swa else "0",
                kind=self.kind,
                got=window,
            )
        lut = self.full_to_swa_index_mapping
        if swa != (lut is not None):
            got = "None" if lut is None else f"an array of shape {getattr(lut, 'shape', '?')}"
            expected = "an int64 array" if swa else "None"
            raise error("KVC-M007", function=fn, expected=expected, kind=self.kind, got=got)
        if swa:
            check_array(fn, "full_to_swa_index_mapping", lut, dtype=np.int64, ndim=1, min_len=1)
        for name in ("k_sources", "v_sources"):
            sources = getattr(self, name)
            check_real_kv_sources(f"{fn}.{name}", sources, RealKvHashMode.NONE, num_slots=num_slots)
            object.__setattr__(self, name, tuple(sources))
        object.__setattr__(self, "num_slots", num_slots)
        object.__setattr__(self, "swa_window_size", window)

    def arrays(self) -> list[tuple[str, Any]]:
        """(name, array) of every array the group holds: the LUT and the source tensors."""
        out = (
            []
            if self.full_to_swa_index_mapping is None
            else [("full_to_swa_index_mapping", self.full_to_swa_index_mapping)]
        )
        for name in ("k_sources", "v_sources"):
            out += [(f"{name}[{i}].tensor", source.tensor) for i, source in enumerate(getattr(self, name))]
        return out


def translate_slots(xp, lut, index, *, out, clipped, mask):
    """``lut[index]`` with the plan's rules, into ``out`` without allocating.

    Negative indices pass through (skipped entries stay skipped), indices past
    the LUT become ``OUT_OF_RANGE_SLOT`` (reported by the kernels, never read);
    ``clipped`` (int64) and ``mask`` (bool) are scratch of ``index``'s shape.
    """
    xp.clip(index, 0, lut.shape[0] - 1, out=clipped)
    xp.take(lut, clipped, out=out)
    xp.less(index, 0, out=mask)
    xp.copyto(out, index, where=mask)
    xp.greater_equal(index, lut.shape[0], out=mask)
    xp.copyto(out, np.int64(OUT_OF_RANGE_SLOT), where=mask)
    return out


def check_type(function: str, argument: str, value: Any, cls: type) -> None:
    """Require an instance of one of the monitor's bundle types (KVC-M009)."""
    if not isinstance(value, cls):
        raise error("KVC-M009", function=function, argument=argument, expected=cls.__name__, got=type(value).__name__)


def check_group_placement(function: str, groups: list[KvGroup], xp) -> Any:
    """Every group array must live where the monitor allocates (KVC-C007); returns that placement.

    The returned object has ``kind`` ("numpy" | "cuda") and ``device`` (CUDA device id or None),
    what :meth:`StepBatch.check_arrays` compares each step's arrays with.
    """
    probe = xp.zeros(1, dtype=np.int64)
    here = inspect_array(function, "device", probe)
    infos = [("the monitor's buffers", here)]
    for group in groups:
        infos += [
            (f"{group.kind}.{name}", inspect_array(function, f"{group.kind}.{name}", array))
            for name, array in group.arrays()
        ]
    resolve_backend(function, "auto", infos)
    return here


def check_hash_mode(function: str, mode: Any, groups: list[KvGroup]) -> RealKvHashMode:
    """The monitor's real-KV hash mode: ``mode`` checked (KVC-C011), by default PARTIAL when any group
    has sources, else NONE."""
    if mode is None:
        has_sources = any(g.k_sources or g.v_sources for g in groups)
        mode = RealKvHashMode.PARTIAL if has_sources else RealKvHashMode.NONE
    return RealKvHashMode(check_int(function, "real_kv_hash_mode", mode, low=0, high=2))


def check_groups(function: str, full: Any, swa: Any) -> list[KvGroup]:
    """The monitor's groups, FULL first (KVC-M009 for a non-KvGroup, KVC-C009 for the wrong kind)."""
    groups = []
    for argument, group in (("full", full), ("swa", swa)):
        if group is None and argument == "swa":
            continue
        check_type(function, argument, group, KvGroup)
        if group.kind != argument:
            raise error(
                "KVC-C009", function=function, argument=f"{argument}.kind", expected=(argument,), got=group.kind
            )
        groups.append(group)
    return groups


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One (stage, half) launch target of a group: its tag and launch context."""

    tag: CanaryLaunchTag
    context: CanaryContext


def _tag(stage: str, half: str, kind: str) -> CanaryLaunchTag:
    return CanaryLaunchTag[f"{stage}_{half}_{kind.upper()}"]


class GroupState:
    """Buffers, endpoints and plans of one group, allocated once.

    Parameters
    ----------
    group : KvGroup
    xp : module
        NumPy or CuPy.
    shared : dict
        ``violation_ring``, ``violation_write_index``, ``kernel_run_counters``,
        ``slot_run_counters`` (int64 [12]), ``enable_chain_position_assert``,
        and ``plan_lanes`` (int32 [4] view: enable, num_valid, write_num_valid_reqs),
        the latter being this group's lanes of the monitor's status block.
    mode : RealKvHashMode
    device : {"cpu", "cuda"}
        Where the plans are allocated.
    verify_capacity, write_req_capacity, write_token_capacity, sweep_capacity : int
        Plan and scratch sizes.
    """

    def __init__(
        self,
        group: KvGroup,
        *,
        xp,
        shared: dict,
        mode: RealKvHashMode,
        device: str,
        verify_capacity: int,
        write_req_capacity: int,
        write_token_capacity: int,
        sweep_capacity: int,
    ):
        # The description without its sources: the TAIL and SWEEP contexts hold those (:meth:`use_sources`).
        self.group, self.kind = dataclasses.replace(group, k_sources=(), v_sources=()), group.kind
        self.window = group.swa_window_size
        self.lut = group.full_to_swa_index_mapping
        halves = ("K", "V") if group.has_v else ("K",)
        self.buffers = {
            (stage, half): xp.zeros((group.num_slots, CANARY_SLOT_BYTES), dtype=np.uint8)
            for stage in ("HEAD", "TAIL")
            for half in halves
        }
        sources = {"K": group.k_sources, "V": group.v_sources}

        def endpoint(stage: str, half: str) -> Endpoint:
            tag = _tag(stage, half, group.kind)
            live = stage != "HEAD"  # HEAD runs before the forward wrote KV: nothing to fingerprint
            ctx = CanaryContext(
                canary_buf=self.buffers["HEAD" if stage == "HEAD" else "TAIL", half],
                kernel_kind=tag,
                violation_ring=shared["violation_ring"],
                violation_write_index=shared["violation_write_index"],
                slot_run_counter=shared["slot_run_counters"][tag : tag + 1],
                kernel_run_counter=shared["kernel_run_counters"][tag : tag + 1],
                real_kv_sources=sources[half] if live else (),
                real_kv_hash_mode=mode if live else RealKvHashMode.NONE,
                enable_chain_position_assert=shared["enable_chain_position_assert"],
            )
            return Endpoint(tag, ctx)

        self.head = [endpoint("HEAD", h) for h in halves]
        self.tail = [endpoint("TAIL", h) for h in halves]
        self.sweep = [endpoint("SWEEP", h) for h in halves]
        lanes = shared["plan_lanes"]
        vplan = VerifyPlan.allocate(verify_capacity=verify_capacity, device=device)
        self.verify_plan = dataclasses.replace(vplan, enable=lanes[0:1], verify_num_valid=lanes[1:2])
        wplan = WritePlan.allocate(write_req_capacity=write_req_capacity, device=device)
        self.write_plan = dataclasses.replace(wplan, write_num_valid_reqs=lanes[2:3])
        self.sweep_plan = VerifyPlan.allocate(verify_capacity=sweep_capacity, device=device)
        # SWA groups write through the LUT: scratch for the translated slots of one step.
        scratch = write_token_capacity if self.lut is not None else 0
        self.loc_scratch = (
            xp.zeros(scratch, dtype=np.int64),
            xp.zeros(scratch, dtype=np.int64),
            xp.zeros(scratch, dtype=bool),
        )
        self._loc_views: dict[int, tuple] = {}  # n -> the scratch views of n tokens: same objects every step

    @property
    def sources(self) -> dict[str, tuple[RealKvSource, ...]]:
        """The real-KV sources the TAIL and SWEEP launches fold, by half (``"K"``, and ``"V"`` with a V half)."""
        return {endpoint.tag.name.split("_")[1]: endpoint.context.real_kv_sources for endpoint in self.tail}

    def use_sources(self, sources: dict[str, tuple[RealKvSource, ...]]) -> None:
        """Fold ``sources`` (by half, checked by the caller) from the next TAIL and SWEEP launch on.

        The group keeps no reference to the sources it folded before.
        """
        for endpoints in (self.tail, self.sweep):
            endpoints[:] = [
                Endpoint(e.tag, e.context.replace(real_kv_sources=sources[e.tag.name.split("_")[1]])) for e in endpoints
            ]

    @staticmethod
    def allocation_bytes(
        group: KvGroup, *, verify_capacity: int, write_req_capacity: int, write_token_capacity: int, sweep_capacity: int
    ) -> int:
        """Bytes a group's buffers, plans and scratch take (for the allocation error's message)."""
        buffers = (4 if group.has_v else 2) * group.num_slots * CANARY_SLOT_BYTES
        plans = VerifyPlan.allocation_bytes(verify_capacity) + VerifyPlan.allocation_bytes(sweep_capacity)
        scratch = 17 * write_token_capacity if group.full_to_swa_index_mapping is not None else 0
        return buffers + plans + WritePlan.allocation_bytes(write_req_capacity) + scratch

    def translate_loc(self, xp, out_cache_loc, n: int, *, eager: bool = True):
        """This group's slots of the step's ``n`` new tokens: FULL slots as given, SWA slots via the LUT.

        ``eager=False``: an SWA group's view of ``n`` slots is returned unfilled (the same object
        for the same ``n``); the monitor's prepared HEAD phase fills it with one launch
        (``launch.translate.translate_slots``) instead of the six array operations.
        """
        if self.lut is None:
            return out_cache_loc
        views = self._loc_views.get(n)
        if views is None:
            if len(self._loc_views) >= _LOC_VIEWS:
                self._loc_views.clear()  # many batch sizes: start over rather than keep them all
            views = self._loc_views[n] = tuple(a[:n] for a in self.loc_scratch)
        out, clipped, mask = views
        if not eager:
            return out
        return translate_slots(xp, self.lut, out_cache_loc, out=out, clipped=clipped, mask=mask)

    def launch_counts(self, stage: str) -> np.ndarray:
        """Launches per tag of one HEAD or TAIL phase: a verify and a write per endpoint."""
        counts = np.zeros(NUM_LAUNCH_TAGS, dtype=np.int64)
        for endpoint in self.head if stage == "head" else self.tail:
            counts[endpoint.tag] += 2
        return counts
