"""Launch scratch: device arrays the glue owns, cached per (device, stream), never freed or moved.

Users of it: the plan's look-back state and verify offsets (``launch/plan.py``, sized
by the plan's capacity) and the chain a long public write publishes for its own tiled
stamp (``launch/chain.py``, sized by power-of-two classes of the call's token count and
plan capacity). Sizes never depend on a value read from the device.

Why never freed: a memoised public call replays packed launches, and a captured CUDA
graph holds the pointers it was captured with; both may name a scratch array long after
the call that allocated it. Why per stream: launches on one stream use a scratch array
in stream order, so concurrent streams must not share one. Nothing is allocated when
the array already exists, so a call can be captured into a CUDA graph after one eager
call with the same sizes on the same stream (allocation is not allowed during capture).
"""

from __future__ import annotations

import numpy as np

from . import _common as common

__all__ = ["scratch_arrays", "zeros"]

#: (device id, stream handle) -> {(name, shape, dtype): zeroed array}; never shrinks.
_scratch: dict[tuple[int, int], dict[tuple, object]] = {}


def scratch_arrays() -> dict[tuple, object]:
    """Scratch of the current device and stream (NumPy under the simulator, cached all the same,
    so simulated tests see state carried from launch to launch, e.g. the plan's look-back)."""
    if common.ON_SIMULATOR:
        key = (-1, 0)
    else:
        from numba import cuda

        stream = common.current_stream()
        key = (cuda.get_current_device().id, int(getattr(stream, "handle", 0) or 0))
    return _scratch.setdefault(key, {})


def zeros(scratch: dict, name: str, shape: tuple[int, ...], dtype):
    """The zeroed array ``name`` of ``scratch`` (see :func:`scratch_arrays`), allocated on first use."""
    key = (name, shape, np.dtype(dtype).str)
    hit = scratch.get(key)
    if hit is None:
        hit = np.zeros(shape, dtype=dtype)
        if not common.ON_SIMULATOR:
            from numba import cuda

            hit = cuda.to_device(hit)
        # Two threads on one stream may both get here: both must use the array that is kept
        # (a replayed call or a captured graph may name it later).
        hit = scratch.setdefault(key, hit)
    return hit
