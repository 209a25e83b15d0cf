"""Launch glue of the bare chain recurrence (``kvcanary_numba.kernels.chain``), for benchmarks."""

from __future__ import annotations

from ..kernels import chain as _kernels
from . import _common

__all__ = ["launch_chain_limit"]


def launch_chain_limit(*, out, steps: int, tokens=None, positions=None, block: int = 32) -> None:
    """Run one chain of ``steps`` ``mix3`` rounds per element of ``out`` (int64 [threads]).

    Parameters
    ----------
    out : int64 [threads]
        Each thread's final chain hash (written).
    steps : int
        Rounds per chain.
    tokens, positions : int64 [n] or None
        Streamed inputs (``chain_streamed``, step ``i`` reads index ``i % n``);
        None synthesizes them (``chain_synth``).
    block : int
        Threads per block (32: one warp per block keeps each SM's scheduler lightly loaded).
    """
    grid = _common.grid_for(out.shape[0], block)
    if tokens is None:
        name, args = "chain_synth", (int(steps), _common.kernel_array(out))
    else:
        arrays = (_common.kernel_array(a) for a in (tokens, positions, out))
        name, args = "chain_streamed", (int(steps), *arrays)
    _common.launch(_kernels.KERNELS[name], _kernels.SIGNATURES[name][0], grid, block, args)
