"""Budgeted verification: each step verifies a seeded subset of the prefix entries, every one within K steps.

Rule. Entry (slot, expected position ``p``) of a step's verify plan is verified
at monitor step ``t`` when ``(a * p + c + t) mod K == 0``, with ``K`` the
period, ``a`` coprime to ``K`` and ``c`` both derived from the seed.

Bound (proof in docs/concepts/reading-a-violation.md). For a fixed ``p`` the
condition holds for exactly one ``t`` in every K consecutive steps, so an entry
that stays in the plan for K consecutive steps is verified in one of them:
a corruption present at step ``t0`` is reported by step ``t0 + K - 1`` at the
latest (detection delay <= K - 1 steps). And ``p -> a p + c mod K`` is a
bijection of the residues, so of any K consecutive positions exactly one is due:
a request with L prefix entries contributes at most ``ceil(L / K)``, a step at
most ``N / K + bs`` entries (N entries, bs requests).

Budget. ``K = ceil(expected_entries / entries_per_step)``, where
``entries_per_step`` is ``budget_entries`` or ``budget_bytes // entry_bytes``
(the bytes one verify entry reads: plan entry, record, predecessor record,
real-KV bytes). ``period=K`` gives K directly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .._runtime import CUDA_IMPORTS
from .._validate import inspect_array, resolve_backend
from ..constants import CANARY_SLOT_BYTES, PARTIAL_READ_BYTES, RealKvHashMode
from ..errors import error
from ..hashing import splitmix64
from ..plans import VerifyPlan
from ..reference import budget as reference_budget
from .groups import check_type

__all__ = ["VerifyBudget", "BudgetState", "select_verify_entries", "seeded_affine", "verify_entry_bytes"]

_FN = "VerifyBudget"


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifyBudget:
    """How much a budgeted monitor verifies per step; give exactly one of ``period``, ``budget_entries``, ``budget_bytes``.

    Attributes
    ----------
    period : int, optional
        K itself (>= 1; 1 = verify everything every step).
    budget_entries, budget_bytes : int, optional
        Verify entries (or bytes read by verify) allowed per step and launch.
    expected_entries : int, optional
        Prefix entries of a typical step (needed with a budget to derive K).
    seed : int
        Chooses which entries share a step.
    max_period : int
        Largest K accepted (the detection-delay bound you tolerate).

    Raises
    ------
    KvCanaryError
        KVC-M021 (at :meth:`resolve`) for a missing, doubled or out-of-range value.
    """

    period: int | None = None
    budget_entries: int | None = None
    budget_bytes: int | None = None
    expected_entries: int | None = None
    seed: int = 0
    max_period: int = 1 << 16

    def resolve(self, function: str, entry_bytes: int) -> int:
        """The period K for verify entries of ``entry_bytes`` bytes each."""

        def bad(argument: str, problem: str, got):
            return error("KVC-M021", function=function, argument=argument, problem=problem, got=got)

        given = {
            k: getattr(self, k) for k in ("period", "budget_entries", "budget_bytes") if getattr(self, k) is not None
        }
        if len(given) != 1:
            raise bad("period / budget_entries / budget_bytes", "must be given exactly once", tuple(given) or None)
        for name, value in (*given.items(), ("seed", self.seed), ("max_period", self.max_period)):
            if (
                not isinstance(value, (int, np.integer))
                or isinstance(value, bool)
                or value < (0 if name == "seed" else 1)
            ):
                raise bad(name, "must be a positive int" if name != "seed" else "must be an int >= 0", value)
        if self.max_period > 1 << 31:
            raise bad("max_period", "must be <= 2**31", self.max_period)
        if self.period is not None:
            k = int(self.period)
        else:
            n = self.expected_entries
            if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
                raise bad("expected_entries", "must be a positive int when a budget is given", n)
            per_step = (
                int(self.budget_entries) if self.budget_entries is not None else int(self.budget_bytes) // entry_bytes
            )
            if per_step < 1:
                raise bad("budget_bytes", f"is less than one verify entry ({entry_bytes} bytes)", self.budget_bytes)
            k = max(1, math.ceil(int(n) / per_step))
        if k > self.max_period:
            raise bad("period", f"(derived) exceeds max_period={self.max_period}", k)
        return k


def verify_entry_bytes(monitor) -> int:
    """Bytes one verify entry reads in the heaviest launch: plan entry (32), record and predecessor
    record (64), and the real-KV bytes its TAIL launch folds (16 per source in PARTIAL, read_bytes in ALL)."""
    folded = 0
    for g in monitor.groups:
        for endpoint in g.tail:
            ctx = endpoint.context
            per = (
                [
                    PARTIAL_READ_BYTES if ctx.real_kv_hash_mode == RealKvHashMode.PARTIAL else int(s.read_bytes)
                    for s in ctx.real_kv_sources
                ]
                if ctx.real_kv_hash_mode != RealKvHashMode.NONE
                else []
            )
            folded = max(folded, sum(per))
    return 32 + 2 * CANARY_SLOT_BYTES + folded


def seeded_affine(period: int, seed: int) -> tuple[int, int]:
    """(multiplier coprime to ``period``, offset in ``[0, period)``) derived from ``seed``."""
    if period == 1:
        return 1, 0
    offset = splitmix64(2 * seed) % period
    a = 1 + splitmix64(2 * seed + 1) % (period - 1)
    while math.gcd(a, period) != 1:
        a = a % (period - 1) + 1
    return a, offset


def select_verify_entries(
    *, plan, out_plan, step, scratch, period: int, multiplier: int, offset: int, backend: str = "auto"
) -> None:
    """Compact the entries of ``plan`` due at ``step[0]`` into ``out_plan`` (NumPy reference or kernel)."""
    fn = "select_verify_entries"
    arrays = [(name, inspect_array(fn, name, a)) for name, a in (("plan", plan.verify_slot_indices), ("step", step))]
    kwargs = dict(
        plan=plan, out_plan=out_plan, step=step, scratch=scratch, period=period, multiplier=multiplier, offset=offset
    )
    if resolve_backend(fn, backend, arrays) == "numpy":
        reference_budget.select_verify_entries(**kwargs)
    else:
        with CUDA_IMPORTS:  # needs numba-cuda: imported on the kernel path only, one thread at a time
            from ..launch import budget as glue

        glue.select_verify_entries(**kwargs)


class BudgetState:
    """A budgeted monitor's period, selection constants, step counter and one budget plan per group."""

    @classmethod
    def build(cls, monitor, budget, function: str):
        """The monitor's state for ``budget`` (None: full verification); KVC-M009 for a non-VerifyBudget."""
        if budget is None:
            return None
        check_type(function, "verify_budget", budget, VerifyBudget)
        return cls(
            budget,
            xp=monitor.xp,
            device=monitor.device,
            groups=monitor.groups,
            function=function,
            entry_bytes=verify_entry_bytes(monitor),
        )

    def __init__(self, budget: VerifyBudget, *, xp, device: str, groups, entry_bytes: int, function: str):
        self.budget = budget
        self.period = budget.resolve(function, entry_bytes)
        self.multiplier, self.offset = seeded_affine(self.period, int(budget.seed))
        self.step = xp.zeros(1, dtype=np.int64)
        self.scratch = xp.zeros(2, dtype=np.int64)
        self.plans = [VerifyPlan.allocate(verify_capacity=g.verify_plan.verify_capacity, device=device) for g in groups]

    def select(self, index: int, group, backend: str) -> None:
        """Fill group ``index``'s budget plan from its verify plan (one launch; no host reads)."""
        select_verify_entries(
            plan=group.verify_plan,
            out_plan=self.plans[index],
            step=self.step,
            scratch=self.scratch,
            period=self.period,
            multiplier=self.multiplier,
            offset=self.offset,
            backend=backend,
        )

    def advance(self, xp) -> None:
        """Next monitor step (a device add on a GPU: no sync)."""
        xp.add(self.step, 1, out=self.step)

    def stats(self) -> dict:
        return {"verify_period": self.period, "max_detection_delay_steps": self.period - 1}
