"""Chain glue: the bare recurrence (``kernels/chain.py``, benchmarks) and the write
chain shared by the launches of one step (``kernels/share.py``)."""

from __future__ import annotations

import contextlib
import threading

import numpy as np

from . import _common

__all__ = ["SharedChain", "chain_arguments", "launch_chain_limit", "sharing"]

# The monitor builds and enters shared chains on the CPU path too, where numba.cuda may be missing
# (pip install . without the gpu extra): the kernel modules are imported only by the launch side.
#: Rows of the published scratch: kernels/share.py's ENTRY_ROWS, SEED_ROWS (tests/test_cli.py checks).
ENTRY_ROWS, SEED_ROWS = 5, 2


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
    from ..kernels import chain as _kernels

    grid = _common.grid_for(out.shape[0], block)
    if tokens is None:
        name, args = "chain_synth", (int(steps), _common.kernel_array(out))
    else:
        arrays = (_common.kernel_array(a) for a in (tokens, positions, out))
        name, args = "chain_streamed", (int(steps), *arrays)
    _common.launch(_kernels.KERNELS[name], _kernels.SIGNATURES[name][0], grid, block, args)


class SharedChain:
    """Step scratch through which the write launches of one step share their chain.

    ``published`` int64 [5, tokens] and ``published_seeds`` int64 [2, requests]
    (layout: :mod:`kvcanary_numba.kernels.share`), allocated once, on the
    arrays' device (``xp`` is NumPy or CuPy).
    """

    def __init__(self, xp, *, tokens: int, requests: int):
        self.published = xp.zeros((ENTRY_ROWS, max(int(tokens), 1)), dtype=np.int64)
        self.published_seeds = xp.zeros((SEED_ROWS, max(int(requests), 1)), dtype=np.int64)


_state = threading.local()


@contextlib.contextmanager
def sharing(chain: SharedChain, *, publish: bool):
    """Write launches of this thread inside the block publish (or consume) ``chain``.

    The public ``launch_canary_write_kernel`` validates as always; its kernel
    launch then runs with the role. The NumPy reference ignores it (it
    computes the same records anyway).
    """
    previous = getattr(_state, "role", None)
    _state.role = ("PUBLISH" if publish else "CONSUME", chain)
    try:
        yield
    finally:
        _state.role = previous


def chain_arguments(fallback) -> tuple:
    """(role, published, published_seeds) kernel arguments of this thread's write launch.

    ``fallback`` (an int64 [:, ::1] kernel array the launch passes anyway) stands
    in for the scratch arrays when nothing is shared: role ``OWN`` never reads them.
    """
    from ..kernels import share as _share

    state = getattr(_state, "role", None)
    if state is None:
        return (int(_share.OWN), fallback, fallback)
    role, chain = state
    return (int(getattr(_share, role)), *_common.persistent_views(chain.published, chain.published_seeds))
