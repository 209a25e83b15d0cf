"""Status publish kernel: the monitor's status block written into mapped host memory.

The mapped readback (:mod:`kvcanary_numba.monitor.mapped`) launches this kernel once per
step, after the step's launches on the engine's stream, instead of an event, a side
stream's wait, a copy and a second event: one launch, and the host reads the copy
without a driver call. The copy is guarded like a sequence lock:

``out[0]``      the publish's sequence number ``seq`` (1, 2, ...), negative while the
                words are being written
``out[1:]``     the status words as of the publish

``published[0]`` (device memory) counts publishes, so the kernel needs no per-step
argument and its launch stays packed (or captured) as it is. One block of
:data:`PUBLISH_THREADS` copies the words in parallel: from one thread, each word's load
waited for the previous word's store to host memory (the arrays may alias), which cost
about 7 us of device time per step in session 15's first run.
"""

from __future__ import annotations

from numba import cuda, int64

from . import ON_SIMULATOR

#: Threads of the one block a publish runs in (one warp: a status block has a few dozen words).
PUBLISH_THREADS = 32

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
    """Copy ``words`` into ``out[1:]`` between the busy mark and the sequence number.

    Launched as one block of :data:`PUBLISH_THREADS`. ``out`` is int64[len(words) + 1] in
    mapped host memory, ``published`` int64[1] on the device.
    """
    thread = cuda.threadIdx.x
    if thread == 0:
        published[0] += int64(1)
        out[0] = -published[0]  # busy: a reader that sees it (or a different seq afterwards) drops its copy
        _fence_system()  # the busy mark has reached the host before the barrier lets any word store start
    cuda.syncthreads()
    for w in range(thread, int64(words.shape[0]), cuda.blockDim.x):
        out[w + int64(1)] = words[w]
    _fence_system()  # each thread's words have reached the host before the barrier lets the number out
    cuda.syncthreads()
    if thread == 0:
        out[0] = published[0]


KERNELS = {"publish_status": publish_status}
