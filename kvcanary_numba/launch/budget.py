"""CUDA launch glue of the budget selection (kernel: :mod:`kvcanary_numba.kernels.budget`).

Called by :func:`kvcanary_numba.monitor.budget.select_verify_entries` with the
reference's keyword arguments. The grid is sized from the plan's capacity (the
host never reads ``verify_num_valid``); every argument is long-lived
(persistent views), so the launch is recorded and captured like the others.
"""

from __future__ import annotations

from ..kernels import budget as kernels
from . import _launch as _common

__all__ = ["select_verify_entries", "SELECT_BLOCK"]

#: Threads per block (= entries per tile) on a GPU.
SELECT_BLOCK = 256

_SIG = kernels.SIGNATURES["select"][0]
_FIELDS = (
    "verify_slot_indices",
    "verify_expected_tokens",
    "verify_expected_positions",
    "verify_prev_slot_indices",
    "verify_num_valid",
    "enable",
)


def select_verify_entries(
    *, plan, out_plan, step, scratch, period: int, multiplier: int, offset: int, stream: int | None = None
) -> None:
    """Compact the due entries on the device (see :mod:`kvcanary_numba.reference.budget`)."""
    block = _common.block_size(SELECT_BLOCK)
    grid = _common.resident_grid(kernels.select_kernel, _SIG, plan.verify_slot_indices.shape[0], block)
    args = (
        *_common.persistent_views(*(getattr(plan, f) for f in _FIELDS)),
        *_common.persistent_views(*(getattr(out_plan, f) for f in _FIELDS)),
        *_common.persistent_views(step, scratch),
        int(period),
        int(multiplier),
        int(offset),
    )
    _common.launch(kernels.select_kernel, _SIG, grid, block, args, stream)
