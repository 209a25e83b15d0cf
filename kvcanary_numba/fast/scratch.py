"""Launch scratch: device arrays the fast wing owns, cached per (device, lane), never freed or moved.

Users of it: the plan's look-back state and verify offsets (``launch/plan.py`` takes a
``scratch`` object; the core's default allocates per call, the fast wing passes
:data:`STREAM_SCRATCH`), and the chain a long public write publishes for its own tiled
stamp (``fast/chain.py``, sized by power-of-two classes of the call's token count and
plan capacity). Sizes never depend on a value read from the device.

Why never freed: a memoised public call replays packed launches, and a captured CUDA
graph holds the pointers it was captured with; both may name a scratch array long after
the call that allocated it. Why per device: the memory must be on the device that runs
the launch (one process may drive several GPUs). Why per lane: launches on one stream
use a scratch array in stream order, so concurrent streams must not share one; the lane
is the call's stream, or the owner a caller names with :func:`owned_by`. A monitor's
hooks name the monitor: its prepared steps keep the scratch pointers they were recorded
with and replay them on whatever stream the engine steps on, so two monitors that
recorded on one stream and then step concurrently on two must still not share scratch.
Nothing is allocated when the array already exists, so a call can be captured into a
CUDA graph after one eager call with the same sizes on the same stream (allocation is
not allowed during capture). A first allocation while the stream captures is refused
with KVC-C015 before the driver is asked (its own error would also invalidate the capture).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import threading

import numpy as np

from ..errors import error
from ..launch._launch import ON_SIMULATOR
from . import driver as _driver, replay
from .driver import libcuda_function

__all__ = [
    "CAPTURE_FUNCTION",
    "OWNER",
    "STREAM_SCRATCH",
    "StreamScratch",
    "owned_by",
    "owner",
    "stream_capturing",
    "swap_owner",
]

#: The ``function`` of KVC-C015 raised here; a public call's dispatch names itself instead.
CAPTURE_FUNCTION = "launch scratch"
_CAPTURE_REASON = (
    "the call's stream is capturing a CUDA graph, where no memory can be allocated; run the call once "
    "with the same sizes on this stream before the capture"
)
#: CUresult codes 900-908: the stream (or another in global mode) is capturing, or a capture broke.
_CAPTURE_ERRORS = range(900, 909)


class StreamScratch:
    """Zeroed arrays by (device, lane, name, shape, dtype), allocated on first use, never freed.

    The device is the driver's current one (:meth:`.driver.Driver.current_device`); the lane
    is the owner named by :func:`owned_by`, else the call's stream. Under the simulator (no
    raw launches) every call shares one lane and the arrays are NumPy, so simulated tests see
    state carried from launch to launch (e.g. the plan's look-back).
    """

    def __init__(self):
        #: (device id, lane) -> {(name, shape, dtype): zeroed array}; never shrinks.
        self._arrays: dict[tuple, dict[tuple, object]] = {}

    def key(self, stream: int) -> tuple:
        """(device, lane) of a launch on ``stream`` now: ``("owner", token)`` inside
        :func:`owned_by`, else the stream handle; (-1, 0) under the simulator."""
        driver = _driver.driver
        if not driver.raw:
            return (-1, 0)
        token = OWNER.token
        return driver.current_device(), int(stream) if token is None else ("owner", token)

    def arrays(self, stream: int) -> dict[tuple, object]:
        """The scratch arrays of the current device and lane (see :meth:`key`)."""
        return self._arrays.setdefault(self.key(stream), {})

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


class _Owner(threading.local):
    token = None  # every thread starts with scratch per stream


#: This thread's scratch owner, ``OWNER.token`` (any hashable; None: per stream). The monitor's hook
#: wrapper swaps it in line (no call: it runs at every hook); everything else uses :func:`owned_by`.
OWNER = _Owner()


def swap_owner(token):
    """Make ``token`` (any hashable, or None: per stream) this thread's scratch owner; returns the
    previous one (what a caller restores: owners nest)."""
    previous, OWNER.token = OWNER.token, token
    return previous


@contextlib.contextmanager
def owned_by(token):
    """Launch scratch taken on this thread inside the block is ``token``'s (any hashable; a
    monitor's hooks pass the monitor's), whatever the stream; blocks nest."""
    previous = swap_owner(token)
    try:
        yield
    finally:
        swap_owner(previous)


def owner():
    """The scratch owner of this thread now (None: scratch is per stream)."""
    return OWNER.token


# Which scratch a glue call takes is state the glue reads besides its arguments: a launch
# packed for one owner replays only for that owner (replay.LAUNCH_STATE).
replay.LAUNCH_STATE.append(owner)


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
