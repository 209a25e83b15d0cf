"""Timing helpers: CUDA-event device times, host times, the copy roofline, a deadline.

Device time of one call is measured between two CUDA events recorded around
it. So that the events time the GPU and not the host's launch rate, every
timed batch starts behind a spin kernel that keeps the GPU busy while the host
enqueues all iterations; the GPU then runs them back to back (a batch whose spin ran
out first, on a slow host, is timed again behind a longer one). Statistics are
medians over the iterations (plus min and p90), after warm-up calls that are
not timed. Callers rotate between several input sets (``fn(i)`` gets the
iteration number) so that small cases do not run from a warm L2 cache.

Host time is ``time.perf_counter`` around the call, with the device idle
before each call (synchronised, untimed), so a slow device cannot push the
host into a full launch queue.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np

__all__ = ["Deadline", "copy_bandwidth", "device_times", "host_times", "stats", "synchronize"]

_SPIN = None


def stats(samples_us: list[float]) -> dict:
    """median / min / p90 (µs) and the number of samples."""
    ordered = sorted(samples_us)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return {
        "median_us": round(statistics.median(ordered), 3),
        "min_us": round(ordered[0], 3),
        "p90_us": round(p90, 3),
        "iters": len(ordered),
    }


class Deadline:
    """Wall-clock budget of a run: sections ask before each case whether time is left."""

    def __init__(self, seconds: float):
        self.start, self.seconds = time.monotonic(), float(seconds)

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.start)

    def allows(self, reserve: float = 0.0) -> bool:
        return self.left() > reserve


def synchronize() -> None:
    import cupy

    cupy.cuda.get_current_stream().synchronize()


def _spin_kernel():
    global _SPIN
    if _SPIN is None:
        from numba import cuda

        @cuda.jit("void(int64)")
        def spin(rounds):
            # Keeps one thread busy ~rounds microseconds (nanosleep is approximate; the
            # spin only has to outlast the host's enqueueing).
            for _ in range(rounds):
                cuda.nanosleep(1000)

        _SPIN = spin
    return _SPIN


def _spin(microseconds: int) -> None:
    from kvcanary_numba.launch import _launch

    if _launch.ON_SIMULATOR:  # no nanosleep there, and nothing to time
        return
    # The core's launch (numba-cuda's dispatcher) on CuPy's current stream: not timed itself.
    _launch.launch(_spin_kernel(), "void(int64)", 1, 1, (int(microseconds),))


#: Longer spins tried (each 4x the last) when the spin ran out before the host had queued every call.
RESPINS = 2


def device_times(fn: Callable[[int], None], *, iters: int, warmup: int = 3, host_us: float = 60.0) -> dict:
    """CUDA-event time of ``fn(i)`` for ``i`` in ``range(iters)``, queued behind a spin kernel.

    ``host_us`` is a floor for the host time per call, which sizes the spin. The
    warm-up calls (but the first, which may compile) are timed on the host too and
    the spin covers three times the slowest of them: a call that enqueues several
    launches is then never timed with the GPU waiting for the host between them.
    Where the spin still ran out before the host had queued the last call (a slow or
    busy host), the events may have timed the host: the batch is timed again behind
    a spin 4x as long, up to ``RESPINS`` times. ``spin_us`` is the spin of the batch
    kept; ``host_bound`` is true when even that one ran out first.
    """
    host = []
    for i in range(warmup):
        t0 = time.perf_counter()
        fn(i)
        host.append((time.perf_counter() - t0) * 1e6)
        synchronize()
    slowest = min(max(host[1:] or host), 5000.0)  # the first call may compile
    spin_us = int(2000 + iters * (max(host_us, 3 * slowest) + 30))
    for attempt in range(RESPINS + 1):
        samples, host_bound = _timed_batch(fn, iters, spin_us)
        if not host_bound or attempt == RESPINS:
            break
        spin_us *= 4
    return {**stats(samples), "spin_us": spin_us, "host_bound": host_bound}


def _timed_batch(fn: Callable[[int], None], iters: int, spin_us: int) -> tuple[list[float], bool]:
    """One batch behind a spin of ``spin_us``: each call's event time (µs), and whether the spin
    had ended by the time the host had queued the last call."""
    import cupy

    stream = cupy.cuda.get_current_stream()
    events = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(iters)]
    spun = cupy.cuda.Event()
    _spin(spin_us)
    spun.record(stream)
    for i, (start, end) in enumerate(events):
        start.record(stream)
        fn(i)
        end.record(stream)
    host_bound = spun.done  # the GPU may have waited for the host since
    events[-1][1].synchronize()
    return [cupy.cuda.get_elapsed_time(s, e) * 1e3 for s, e in events], host_bound


def host_times(
    fn: Callable[[int], None],
    *,
    iters: int,
    warmup: int = 3,
    sync: Callable[[], None] | None = None,
    after: Callable[[int], None] | None = None,
) -> dict:
    """Host time of ``fn(i)``; ``sync`` runs untimed before each call, ``after(i)`` untimed after it."""
    samples = []
    for i in range(warmup + iters):
        if sync is not None:
            sync()
        t0 = time.perf_counter()
        fn(i)
        t1 = time.perf_counter()
        if after is not None:
            after(i)
        if i >= warmup:
            samples.append((t1 - t0) * 1e6)
    return stats(samples)


def copy_bandwidth(nbytes: int = 1 << 30, iters: int = 10) -> dict:
    """Device-to-device ``cudaMemcpyAsync`` of ``nbytes``: bytes moved (read + write) per second."""
    import cupy

    src = cupy.ones(nbytes // 8, dtype=np.int64)
    dst = cupy.empty_like(src)
    stream = cupy.cuda.get_current_stream()

    def copy(_):
        cupy.cuda.runtime.memcpyAsync(
            dst.data.ptr, src.data.ptr, src.nbytes, cupy.cuda.runtime.memcpyDeviceToDevice, stream.ptr
        )

    result = device_times(copy, iters=iters, warmup=2)
    result["bytes_moved"] = 2 * src.nbytes
    result["gbps"] = round(2 * src.nbytes / (result["median_us"] * 1e-6) / 1e9, 1)
    return result
