"""Launch scratch: device arrays the fast wing owns, cached per (device, stream), never freed or moved.

Users of it: the plan's look-back state and verify offsets (``launch/plan.py`` takes a
``scratch`` object; the core's default allocates per call, the fast wing passes
:data:`STREAM_SCRATCH`), and the chain a long public write publishes for its own tiled
stamp (``fast/chain.py``, sized by power-of-two classes of the call's token count and
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
from ..launch._launch import ON_SIMULATOR
from .driver import libcuda_function

__all__ = ["CAPTURE_FUNCTION", "STREAM_SCRATCH", "StreamScratch", "stream_capturing"]

#: The ``function`` of KVC-C015 raised here; a public call's dispatch names itself instead.
CAPTURE_FUNCTION = "launch scratch"
_CAPTURE_REASON = (
    "the call's stream is capturing a CUDA graph, where no memory can be allocated; run the call once "
    "with the same sizes on this stream before the capture"
)
#: CUresult codes 900-908: the stream (or another in global mode) is capturing, or a capture broke.
_CAPTURE_ERRORS = range(900, 909)


class StreamScratch:
    """Zeroed arrays by (device, stream, name, shape, dtype), allocated on first use, never freed.

    Under the simulator the arrays are NumPy, cached all the same, so simulated tests see state
    carried from launch to launch (e.g. the plan's look-back).
    """

    def __init__(self):
        #: (device id, stream handle) -> {(name, shape, dtype): zeroed array}; never shrinks.
        self._arrays: dict[tuple[int, int], dict[tuple, object]] = {}

    def arrays(self, stream: int) -> dict[tuple, object]:
        """The scratch arrays of the current device and ``stream``."""
        if ON_SIMULATOR:
            key = (-1, 0)
        else:
            from numba import cuda

            key = (cuda.get_current_device().id, int(stream))
        return self._arrays.setdefault(key, {})

    def zeros(self, name: str, shape: tuple[int, ...], dtype, stream: int):
        """The zeroed array ``name`` of the current device and ``stream``, allocated on first use."""
        scratch = self.arrays(stream)
        key = (name, shape, np.dtype(dtype).str)
        hit = scratch.get(key)
        if hit is None:
            if stream_capturing(stream):
                nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
                raise error(
                    "KVC-C015",
                    function=CAPTURE_FUNCTION,
                    argument=name,
                    got=shape,
                    what="launch scratch array",
                    nbytes=nbytes,
                    reason=_CAPTURE_REASON,
                )
            hit = np.zeros(shape, dtype=dtype)
            if not ON_SIMULATOR:
                from numba import cuda

                hit = cuda.to_device(hit)
            # Two threads on one stream may both get here: both must use the array that is kept
            # (a replayed call or a captured graph may name it later).
            hit = scratch.setdefault(key, hit)
        return hit


#: The scratch of every fast public call and monitor step of this process.
STREAM_SCRATCH = StreamScratch()


def stream_capturing(stream: int) -> bool:
    """Whether CUDA stream ``stream`` is capturing a CUDA graph (libcuda's ``cuStreamIsCapturing``).

    False under the simulator and where libcuda cannot be asked (the allocation then meets the
    driver's own error). Only asked before an allocation, so its cost is off the hot path.
    """
    if ON_SIMULATOR:
        return False
    is_capturing = _is_capturing_function()
    if is_capturing is None:
        return False
    status = ctypes.c_int(0)
    result = is_capturing(ctypes.c_void_p(int(stream)), ctypes.byref(status))
    return result in _CAPTURE_ERRORS or (result == 0 and status.value != 0)


@functools.cache
def _is_capturing_function():
    """libcuda's ``cuStreamIsCapturing`` (looked up once), or None where libcuda cannot be loaded."""
    return libcuda_function("cuStreamIsCapturing")
