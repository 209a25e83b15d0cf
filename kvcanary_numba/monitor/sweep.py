"""Sweep plans: verify entries for whole slot chains, including cached slots no request touches.

A per-step verify only sees the prefixes of the running requests. A sweep
checks any chains the caller lists (SGLang walks its radix cache), so KV that
sits in a cache and is corrupted there is found before a request reuses it.
Chains are given in FULL slot indices; SWA groups translate slots and
predecessors through their LUT (negative stays negative, evicted becomes 0, which
verify skips), as SGLang's sweep does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .._validate import check_int
from ..constants import EXPECTED_TOKEN_UNCHECKED, NO_PREDECESSOR, NUM_LAUNCH_TAGS
from ..errors import error
from ..fast.calls import launch_canary_verify_kernel
from .groups import check_type, translate_slots

__all__ = ["SlotChain", "build_sweep_entries", "fill_sweep_plan", "launch_sweep"]


@dataclass(frozen=True, slots=True)
class SlotChain:
    """Consecutive positions of one sequence and the FULL slot holding each.

    Attributes
    ----------
    slots : sequence of int or 1-D integer array
        FULL slot of positions ``start_position, start_position + 1, ...``;
        stored as an int64 array. Ints outside int64, floats, bools and nested
        sequences are rejected (KVC-M010); slots outside the pool are reported by
        the sweep's verify, not rejected.
    start_position : int
        Position of ``slots[0]``, in ``[0, 2**63 - 1 - len(slots)]`` (KVC-C011).
    prev_slot : int
        Slot of position ``start_position - 1``, an int64; -1 (default) when the
        chain starts at its head, 0 when the predecessor is unknown (chain check
        skipped).

    Raises
    ------
    KvCanaryError
        KVC-M010, KVC-C011.
    """

    slots: Sequence[int]
    start_position: int = 0
    prev_slot: int = NO_PREDECESSOR

    def __post_init__(self) -> None:
        fn = "SlotChain"
        slots = _slot_array(fn, self.slots)
        start = check_int(fn, "start_position", self.start_position, low=0, high=_INT64_MAX - len(slots))
        prev = check_int(fn, "prev_slot", self.prev_slot, low=_INT64_MIN, high=_INT64_MAX)
        object.__setattr__(self, "slots", slots)
        object.__setattr__(self, "start_position", start)
        object.__setattr__(self, "prev_slot", prev)


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _slot_array(function: str, slots) -> np.ndarray:
    """``slots`` as a read-only 1-D int64 array, or KVC-M010."""
    problem = None
    if isinstance(slots, (str, bytes)) or slots is None:
        problem = type(slots).__name__
    elif isinstance(slots, (np.ma.MaskedArray, np.matrix)):  # np.asarray would drop the mask, keep 2-D
        problem = f"a {type(slots).__name__}"
    else:
        try:
            array = np.asarray(slots)
        except Exception as exc:  # noqa: BLE001 - ragged, beyond every integer dtype, or an object that raises
            array, problem = None, f"{type(exc).__name__}: {str(exc)[:60]}"
        if array is not None:
            if array.size == 0 and array.ndim == 1:
                array = np.zeros(0, dtype=np.int64)
            if array.ndim != 1 or array.dtype.kind not in "iu":
                problem = f"shape {array.shape} of dtype {array.dtype}"
            elif array.dtype.kind == "u" and array.size and int(array.max()) > _INT64_MAX:
                problem = f"a slot {int(array.max())} beyond int64"
    if problem is not None:
        raise error("KVC-M010", function=function, argument="slots", got=problem)
    out = array.astype(np.int64)  # a copy: the chain does not follow later edits of the caller's list
    out.setflags(write=False)
    return out


def build_sweep_entries(function: str, chains: Sequence[SlotChain], capacity: int) -> tuple[np.ndarray, ...]:
    """Host arrays (slots, positions, prev slots) of all chains, in order.

    Raises
    ------
    KvCanaryError
        KVC-M009 when ``chains`` is not a list or tuple of SlotChain (a generator is refused:
        the checks would use it up), KVC-M004 when the chains hold more than ``capacity`` slots.
    """
    if not isinstance(chains, (list, tuple)):
        raise error(
            "KVC-M009",
            function=function,
            argument="chains",
            expected="list or tuple of SlotChain",
            got=type(chains).__name__,
        )
    for i, chain in enumerate(chains):
        check_type(function, f"chains[{i}]", chain, SlotChain)
    total = sum(len(chain.slots) for chain in chains)
    if total > capacity:
        raise error("KVC-M004", function=function, got=total, capacity=capacity)
    slots = np.empty(total, dtype=np.int64)
    positions = np.empty(total, dtype=np.int64)
    prevs = np.empty(total, dtype=np.int64)
    at = 0
    for chain in chains:  # each chain was checked when it was built
        start = chain.start_position
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
