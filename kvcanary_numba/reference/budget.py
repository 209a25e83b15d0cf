"""Specification of the budget selection (``kernels/budget.py``): the verify entries due this step.

A monitor with a verify budget checks only a share of a plan's entries each
step, so that every position comes round once every ``K = period`` steps.
Entry ``i`` (expected position ``p``) of an enabled plan is due at step ``t``
when ``(multiplier * (p mod K) + offset + (t mod K)) mod K == 0``, where
``mod`` is the non-negative remainder and ``multiplier`` is coprime to ``K``
(so each step picks a different residue class of positions).

The due entries are copied, in plan order, to the front of ``out_plan``;
``out_plan.verify_num_valid`` receives their count and ``out_plan.enable`` the
plan's flag. A disabled plan (overflow: its entries are stale) selects nothing.
The CUDA kernel selects the same set in the order its blocks reserve their
output ranges (``docs/concepts/reading-a-violation.md``).
"""

from __future__ import annotations

import numpy as np

__all__ = ["due_mask", "select_verify_entries"]

_FIELDS = ("verify_slot_indices", "verify_expected_tokens", "verify_expected_positions", "verify_prev_slot_indices")


def due_mask(positions: np.ndarray, step: int, period: int, multiplier: int, offset: int) -> np.ndarray:
    """bool [n]: which entries of expected ``positions`` (int64 [n]) are due at ``step``."""
    k = np.int64(period)
    residue = (np.int64(multiplier) * (positions % k)) % k  # < K**2 < 2**63 for K <= 2**31
    return (residue + np.int64(offset) + np.int64(step) % k) % k == 0


def select_verify_entries(*, plan, out_plan, step, scratch, period: int, multiplier: int, offset: int) -> None:
    """Compact the due entries of ``plan`` into ``out_plan`` (NumPy arrays).

    Parameters
    ----------
    plan, out_plan : VerifyPlan
        Source plan and the budget plan (capacity >= the source's).
    step : int64 [1]
        The monitor's budget step counter.
    scratch : int64 [2]
        The kernel's completion counters; left as they are (zero) here.
    period, multiplier, offset : int
        ``K`` >= 1, ``multiplier`` coprime to ``K``, ``0 <= offset < K``.
    """
    del scratch  # the kernel's cross-block bookkeeping; a sequential selection needs none
    capacity = plan.verify_slot_indices.shape[0]
    n = min(max(int(plan.verify_num_valid[0]), 0), capacity) if int(plan.enable[0]) else 0
    due = np.flatnonzero(due_mask(plan.verify_expected_positions[:n], int(step[0]), period, multiplier, offset))
    for name in _FIELDS:
        getattr(out_plan, name)[: due.shape[0]] = getattr(plan, name)[due]
    out_plan.verify_num_valid[0] = due.shape[0]
    out_plan.enable[0] = plan.enable[0]
