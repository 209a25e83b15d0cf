"""CUDA launch glue of the verdict word (kernel: :mod:`kvcanary_numba.kernels.verdict`).

Called by :class:`kvcanary_numba.monitor.verdict.VerdictState` with the reference's
keyword arguments (:func:`kvcanary_numba.reference.verdict.write_verdict`). One block;
every array is the monitor's own (persistent views) and every scalar a constant of the
monitor, so the launch is recorded into the prepared TAIL phase and captured with it.
"""

from __future__ import annotations

from ..kernels import verdict as kernels
from . import _launch as _common

__all__ = ["write_verdict"]

_SIG = kernels.SIGNATURES["verdict"][0]


def write_verdict(
    *,
    status_lanes,
    ring,
    state,
    stalled,
    word,
    first_plan_lane: int,
    plan_lane_stride: int,
    num_groups: int,
    rank: int,
    stream: int | None = None,
) -> None:
    """Write the verdict word on the device (see :mod:`kvcanary_numba.reference.verdict`)."""
    block = _common.block_size(kernels.VERDICT_BLOCK)
    args = (
        *_common.persistent_views(status_lanes, ring, state, stalled, word),
        int(first_plan_lane),
        int(plan_lane_stride),
        int(num_groups),
        int(rank),
    )
    _common.launch(kernels.verdict_kernel, _SIG, 1, block, args, stream)
