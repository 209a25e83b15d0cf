"""Chain glue: the write chain shared by the launches of one monitor step (``fast/kernels/share.py``),
and the chain a long public write publishes for its own tiled stamp (``fast/kernels/chain.py``)."""

from __future__ import annotations

import contextlib
import threading

import numpy as np

from ..constants import WARP_SIZE
from ..launch import _launch as _common
from . import replay
from .scratch import STREAM_SCRATCH

__all__ = [
    "OWN_TILED_MIN_TOKENS",
    "TILED_MIN_EXTRA_TOKENS",
    "SharedChain",
    "launch_chain_publish",
    "long_step",
    "own_tiled",
    "replay_key",
    "sharing",
    "write_chain",
]

# The monitor builds and enters shared chains on the CPU path too, where numba.cuda may be missing
# (pip install . without the gpu extra): the kernel modules are imported only by the launch side.
#: Rows of the published scratch: fast/kernels/share.py's ENTRY_ROWS, SEED_ROWS (tests/test_cli.py checks).
ENTRY_ROWS, SEED_ROWS = 5, 2
#: A shared write takes the tiled path when it has at least this many tokens more than one per
#: request: decode-shaped steps (one token per request) keep four serial launches.
TILED_MIN_EXTRA_TOKENS = 64
#: A write outside a monitor step (the public path) publishes its own chain and stamps tiled
#: when its requests average at least this many tokens. H200 (2026-12-04), no real-KV
#: sources: the serial kernel runs 152 ns per token of a request, chain_publish + the tiled
#: stamp 131 (8 x 8k, 8 x 32k, 1 x 128k alike), one more launch (a few us): the tiled path
#: wins from ~200 tokens per request.
OWN_TILED_MIN_TOKENS = 256


class SharedChain:
    """Step scratch through which the write launches of one step share their chain.

    ``published`` int64 [5, tokens] and ``published_seeds`` int64 [2, requests]
    (layout: :mod:`kvcanary_numba.fast.kernels.share`), allocated once, on the
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
    (:func:`write_chain`).
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
    block and its scratch pointers; outside one, the threshold of :func:`own_tiled` (benchmarks
    and tests change it). A launch packed inside a block replays only inside an equal one
    (``_kernel_launch.LAUNCH_STATE``)."""
    state = getattr(_state, "role", None)
    if state is None:
        return OWN_TILED_MIN_TOKENS
    role, chain = state
    return role, _common.array_layout(chain.published)[0], _common.array_layout(chain.published_seeds)[0]


replay.LAUNCH_STATE.append(replay_key)


def write_chain(num_tokens: int, capacity: int, stream: int) -> tuple[str | None, tuple | None]:
    """How this thread's write launch of ``num_tokens`` entries and plan ``capacity`` gets its chain.

    Returns (the tiled role, ``"PUBLISH"`` / ``"CONSUME"``, or None for a serial kernel;
    the (role, published, published_seeds) arguments of the fast write kernels, or None
    for the core's plain kernel). Inside a :func:`sharing` block: the block's role and
    scratch, tiled for a long step (:func:`long_step` of the block's batch size, else of
    ``capacity``), else the serial ``write_shared``. Outside one (the public path): a long
    write (:func:`own_tiled`) publishes its own chain to launch scratch and stamps tiled;
    any other runs the core's plain kernel on its own chain, ``(None, None)``.
    """
    # numba.cuda: the monitor imports this module on the CPU path too.
    from .kernels import share as _share

    state = getattr(_state, "role", None)
    if state is None:
        if not own_tiled(num_tokens, capacity):
            return None, None
        return "PUBLISH", (int(_share.PUBLISH), *own_scratch(num_tokens, capacity, stream))
    role, chain = state
    name, _, requests = role.partition("/")
    args = (int(getattr(_share, name)), *_common.persistent_views(chain.published, chain.published_seeds))
    return (name if long_step(num_tokens, int(requests) if requests else capacity) else None), args


def own_tiled(num_tokens: int, capacity: int) -> bool:
    """Whether a write outside a monitor step takes the tiled path: its requests average at least
    :data:`OWN_TILED_MIN_TOKENS` tokens (the plan's capacity counts as the request count, since
    the batch size lives on the device; an engine whose capacity far exceeds its prefill batch
    keeps the serial kernel)."""
    per_request = OWN_TILED_MIN_TOKENS
    if _common.ON_SIMULATOR:  # tests take the tiled path with small inputs
        per_request = _common.sim_shape("own_tiled_min_tokens", per_request)
    return num_tokens > 0 and num_tokens >= max(int(capacity), 1) * per_request


def own_scratch(num_tokens: int, capacity: int, stream: int) -> tuple:
    """``published`` int64 [5, >= num_tokens] and ``published_seeds`` int64 [2, >= capacity] kernel
    arrays of a write that publishes its own chain: launch scratch of this device and stream
    (``fast/scratch.py``), one array per power-of-two size class, never freed (a replayed
    call or a captured graph keeps its pointers)."""
    width, seeds = 1 << (int(num_tokens) - 1).bit_length(), 1 << (max(int(capacity), 1) - 1).bit_length()
    return (
        STREAM_SCRATCH.zeros("published", (ENTRY_ROWS, width), np.int64, stream),
        STREAM_SCRATCH.zeros("published_seeds", (SEED_ROWS, seeds), np.int64, stream),
    )


def long_step(num_tokens: int, requests: int) -> bool:
    """Whether a shared step of ``num_tokens`` tokens over ``requests`` requests takes the tiled path."""
    return num_tokens >= requests + TILED_MIN_EXTRA_TOKENS


def launch_chain_publish(args: tuple, capacity: int, stream: int) -> None:
    """``chain_publish`` over the write kernel's arguments ``args`` (with the chain arguments)."""
    from .kernels import chain as _kernels  # numba.cuda: the monitor imports this module on the CPU path too

    buf, offsets, seeds, nvr, tokens, positions, locs = args[:7]
    block = _kernels.PUBLISH_WARPS * WARP_SIZE
    grid = _common.persistent_grid(capacity, _kernels.PUBLISH_WARPS, blocks_per_sm=_common.THREADS_PER_SM // block)
    name = "chain_publish"
    _common.launch(
        _kernels.KERNELS[name],
        _kernels.SIGNATURES[name][0],
        grid,
        block,
        (buf, offsets, seeds, nvr, tokens, positions, locs, args[-2], args[-1]),
        stream,
    )
