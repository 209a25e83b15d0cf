"""Chain glue: the bare recurrence (``kernels/chain.py``, benchmarks) and the write
chain shared by the launches of one step (``kernels/share.py``)."""

from __future__ import annotations

import contextlib
import threading

import numpy as np

from . import _common, _kernel_launch

__all__ = ["TILED_MIN_EXTRA_TOKENS", "SharedChain", "chain_arguments", "launch_chain_limit", "long_step", "replay_key",
           "sharing", "tiled_step"]

# The monitor builds and enters shared chains on the CPU path too, where numba.cuda may be missing
# (pip install . without the gpu extra): the kernel modules are imported only by the launch side.
#: Rows of the published scratch: kernels/share.py's ENTRY_ROWS, SEED_ROWS (tests/test_cli.py checks).
ENTRY_ROWS, SEED_ROWS = 5, 2
#: A shared write takes the tiled path when it has at least this many tokens more than one per
#: request: decode-shaped steps (one token per request) keep four serial launches.
TILED_MIN_EXTRA_TOKENS = 64


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
def sharing(chain: SharedChain, *, publish: bool, requests: int | None = None):
    """Write launches of this thread inside the block publish (or consume) ``chain``.

    The public ``launch_canary_write_kernel`` validates as always; its kernel
    launch then runs with the role. The NumPy reference ignores it (it
    computes the same records anyway). ``requests``: the step's batch size
    (None: the plan's capacity), which with the token count picks the path
    (:func:`tiled_step`).
    """
    previous = getattr(_state, "role", None)
    # (name, chain), as the launch layer's replay key reads it; the batch size, which picks
    # the path, rides in the name so that it is part of that key too.
    name = "PUBLISH" if publish else "CONSUME"
    _state.role = (name if requests is None else f"{name}/{int(requests)}", chain)
    try:
        yield
    finally:
        _state.role = previous


def replay_key():
    """What this thread's write launches read besides their arguments: the role of a ``sharing``
    block and its scratch pointers (None outside one). A launch packed inside a block replays
    only inside an equal one (``_kernel_launch.LAUNCH_STATE``)."""
    state = getattr(_state, "role", None)
    if state is None:
        return None
    role, chain = state
    return role, _common.array_layout(chain.published)[0], _common.array_layout(chain.published_seeds)[0]


_kernel_launch.LAUNCH_STATE.append(replay_key)


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
    name = role.split("/")[0]
    return (int(getattr(_share, name)), *_common.persistent_views(chain.published, chain.published_seeds))


def tiled_step(num_tokens: int, capacity: int) -> str | None:
    """The role of this thread's write launch if it takes the tiled path, else None.

    Tiled (a long, prefill-shaped step): the publishing launch first runs
    ``chain_publish`` (the chain alone), then it and every other write of the
    step stamp in parallel (``kernels/write_tiled.py``), one more launch per
    step in all. Otherwise (decode-shaped, or nothing shared) the serial
    kernel, four launches, as before.
    """
    state = getattr(_state, "role", None)
    if state is None:
        return None
    role = state[0]
    name, _, requests = role.partition("/")
    requests = int(requests) if requests else capacity
    return name if long_step(num_tokens, requests) else None


def long_step(num_tokens: int, requests: int) -> bool:
    """Whether a shared step of ``num_tokens`` tokens over ``requests`` requests takes the tiled path."""
    return num_tokens >= requests + TILED_MIN_EXTRA_TOKENS


def launch_chain_publish(args: tuple, capacity: int) -> None:
    """``chain_publish`` over the write kernel's arguments ``args`` (with the chain arguments)."""
    from ..constants import WARP_SIZE
    from ..kernels import chain as _kernels

    buf, offsets, seeds, nvr, tokens, positions, locs = args[:7]
    block = _kernels.PUBLISH_WARPS * WARP_SIZE
    grid = _common.persistent_grid(capacity, _kernels.PUBLISH_WARPS, blocks_per_sm=_common.THREADS_PER_SM // block)
    name = "chain_publish"
    _common.launch(_kernels.KERNELS[name], _kernels.SIGNATURES[name][0], grid, block,
                   (buf, offsets, seeds, nvr, tokens, positions, locs, args[-2], args[-1]))  # fmt: skip
