"""Sweep plans: verify entries for whole slot chains, including cached slots no request touches.

A per-step verify only sees the prefixes of the running requests. A sweep
checks any chains the caller lists (SGLang walks its radix cache), so KV that
sits in a cache and is corrupted there is found before a request reuses it.
Chains are given in FULL slot indices; SWA groups translate slots and
predecessors through their LUT (negative stays negative, evicted becomes 0, which
verify skips), as SGLang's sweep does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .._arrays import check_int
from ..constants import EXPECTED_TOKEN_UNCHECKED, NO_PREDECESSOR, NUM_LAUNCH_TAGS
from ..errors import error
from ..verify import launch_canary_verify_kernel
from .groups import translate_slots

__all__ = ["SlotChain", "build_sweep_entries", "fill_sweep_plan", "launch_sweep"]


@dataclass(frozen=True, slots=True)
class SlotChain:
    """Consecutive positions of one sequence and the FULL slot holding each.

    Attributes
    ----------
    slots : sequence of int
        FULL slot of positions ``start_position, start_position + 1, ...``.
    start_position : int
        Position of ``slots[0]`` (>= 0).
    prev_slot : int
        Slot of position ``start_position - 1``; -1 (default) when the chain
        starts at its head, 0 when the predecessor is unknown (chain check skipped).
    """

    slots: Sequence[int]
    start_position: int = 0
    prev_slot: int = NO_PREDECESSOR


def build_sweep_entries(function: str, chains: Sequence[SlotChain], capacity: int) -> tuple[np.ndarray, ...]:
    """Host arrays (slots, positions, prev slots) of all chains, in order.

    Raises
    ------
    KvCanaryError
        KVC-C011 for a negative start position, KVC-M004 when the chains hold
        more than ``capacity`` slots.
    """
    total = sum(len(chain.slots) for chain in chains)
    if total > capacity:
        raise error("KVC-M004", function=function, got=total, capacity=capacity)
    slots = np.empty(total, dtype=np.int64)
    positions = np.empty(total, dtype=np.int64)
    prevs = np.empty(total, dtype=np.int64)
    at = 0
    for i, chain in enumerate(chains):
        start = check_int(function, f"chains[{i}].start_position", chain.start_position, low=0)
        n = len(chain.slots)
        if n == 0:
            continue
        slots[at : at + n] = chain.slots
        positions[at : at + n] = np.arange(start, start + n)
        prevs[at] = chain.prev_slot
        prevs[at + 1 : at + n] = slots[at : at + n - 1]
        at += n
    return slots, positions, prevs


def _translate(xp, lut, index):
    """SWA slots of a sweep's FULL slots (eager path: scratch allocated per call)."""
    scratch = dict(out=xp.empty_like(index), clipped=xp.empty_like(index), mask=xp.empty(index.shape, dtype=bool))
    return translate_slots(xp, lut, index, **scratch)


def fill_sweep_plan(xp, plan, entries: tuple[np.ndarray, ...], lut) -> None:
    """Write the entries into a preallocated VerifyPlan (translated through ``lut`` when given)."""
    slots, positions, prevs = (xp.asarray(a) for a in entries)
    if lut is not None:
        slots, prevs = _translate(xp, lut, slots), _translate(xp, lut, prevs)
    n = int(positions.shape[0])
    plan.verify_slot_indices[:n] = slots
    plan.verify_expected_positions[:n] = positions
    plan.verify_prev_slot_indices[:n] = prevs
    plan.verify_expected_tokens[:n] = EXPECTED_TOKEN_UNCHECKED
    plan.verify_num_valid[...] = n
    plan.enable[...] = 1


def launch_sweep(xp, group, entries: tuple[np.ndarray, ...]) -> np.ndarray:
    """Fill a group's sweep plan and verify it on every SWEEP endpoint; returns launches per tag."""
    fill_sweep_plan(xp, group.sweep_plan, entries, group.lut)
    launches = np.zeros(NUM_LAUNCH_TAGS, dtype=np.int64)
    for endpoint in group.sweep:
        launch_canary_verify_kernel(context=endpoint.context, plan=group.sweep_plan, check_verify_expected_token=False)
        launches[endpoint.tag] += 1
    return launches
