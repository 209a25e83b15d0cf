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
A first allocation while the stream captures is refused with KVC-C015 before the driver
is asked (its own error would also invalidate the capture).
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from ..errors import error
from . import _common as common
from . import _driver

__all__ = ["CAPTURE_FUNCTION", "scratch_arrays", "stream_capturing", "zeros"]

#: The ``function`` of KVC-C015 raised here; a public call's dispatch names itself instead.
CAPTURE_FUNCTION = "launch scratch"
_CAPTURE_REASON = (
    "the call's stream is capturing a CUDA graph, where no memory can be allocated; run the call once "
    "with the same sizes on this stream before the capture"
)
#: CUresult codes 900-908: the stream (or another in global mode) is capturing, or a capture broke.
_CAPTURE_ERRORS = range(900, 909)

#: (device id, stream handle) -> {(name, shape, dtype): zeroed array}; never shrinks.
_scratch: dict[tuple[int, int], dict[tuple, object]] = {}


def scratch_arrays() -> dict[tuple, object]:
    """Scratch of the current device and stream (NumPy under the simulator, cached all the same,
    so simulated tests see state carried from launch to launch, e.g. the plan's look-back)."""
    if common.ON_SIMULATOR:
        key = (-1, 0)
    else:
        from numba import cuda

        key = (cuda.get_current_device().id, _stream_handle())
    return _scratch.setdefault(key, {})


def zeros(scratch: dict, name: str, shape: tuple[int, ...], dtype):
    """The zeroed array ``name`` of ``scratch`` (see :func:`scratch_arrays`), allocated on first use."""
    key = (name, shape, np.dtype(dtype).str)
    hit = scratch.get(key)
    if hit is None:
        if stream_capturing():
            nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
            raise error("KVC-C015", function=CAPTURE_FUNCTION, argument=name, got=shape,
                        what="launch scratch array", nbytes=nbytes, reason=_CAPTURE_REASON)  # fmt: skip
        hit = np.zeros(shape, dtype=dtype)
        if not common.ON_SIMULATOR:
            from numba import cuda

            hit = cuda.to_device(hit)
        # Two threads on one stream may both get here: both must use the array that is kept
        # (a replayed call or a captured graph may name it later).
        hit = scratch.setdefault(key, hit)
    return hit


def stream_capturing() -> bool:
    """Whether the call's stream is capturing a CUDA graph (libcuda's ``cuStreamIsCapturing``).

    False under the simulator and where libcuda cannot be asked (the allocation then meets the
    driver's own error). Only asked before an allocation, so its cost is off the hot path.
    """
    if common.ON_SIMULATOR:
        return False
    is_capturing = _is_capturing_function()
    if is_capturing is None:
        return False
    status = ctypes.c_int(0)
    result = is_capturing(ctypes.c_void_p(_stream_handle()), ctypes.byref(status))
    return result in _CAPTURE_ERRORS or (result == 0 and status.value != 0)


@functools.cache
def _is_capturing_function():
    """libcuda's ``cuStreamIsCapturing`` (looked up once), or None where libcuda cannot be loaded."""
    return _driver.libcuda_function("cuStreamIsCapturing")


def _stream_handle() -> int:
    """CUDA handle of the call's stream (0: the legacy default stream)."""
    return int(getattr(common.current_stream(), "handle", 0) or 0)
