"""Status publish kernel: the monitor's status block written into mapped host memory.

The mapped readback (:mod:`kvcanary_numba.monitor.mapped`) launches this kernel once per
step, after the step's launches on the engine's stream, instead of an event, a side
stream's wait, a copy and a second event: one launch, and the host reads the copy
without a driver call. The copy is guarded like a sequence lock:

``out[0]``      the publish's sequence number ``seq`` (1, 2, ...), negative while the
                words are being written
``out[1:]``     the status words as of the publish

``published[0]`` (device memory) counts publishes, so the kernel needs no per-step
argument and its launch stays packed (or captured) as it is. One thread does it all: the
block is a few hundred bytes and the order of its writes is the point.
"""

from __future__ import annotations

from numba import cuda, int64

from . import ON_SIMULATOR

#: Explicit signatures (eager compilation and the sm_90 PTX test).
SIGNATURES = {"publish_status": ("void(int64[::1], int64[::1], int64[::1])",)}

if ON_SIMULATOR:

    @cuda.jit(device=True)
    def _fence_system():
        """Simulated threads write host memory directly: there is nothing to order."""

else:

    @cuda.jit(device=True)
    def _fence_system():
        """Writes before this point reach every observer, the host included, before writes after it."""
        cuda.threadfence_system()


@cuda.jit
def publish_status(words, out, published):
    """Thread 0 copies ``words`` into ``out[1:]`` between the busy mark and the sequence number.

    ``out`` is int64[len(words) + 1] in mapped host memory, ``published`` int64[1] on the device.
    """
    if cuda.grid(1) != 0:
        return
    seq = published[0] + int64(1)
    published[0] = seq
    out[0] = -seq  # busy: a reader that sees it (or a different seq afterwards) drops its copy
    _fence_system()
    for w in range(int64(words.shape[0])):
        out[w + int64(1)] = words[w]
    _fence_system()
    out[0] = seq


KERNELS = {"publish_status": publish_status}
