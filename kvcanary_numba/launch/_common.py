"""Launch utilities shared by every ``launch/<op>.py`` module.

The glue receives arrays already validated by the public wrapper: CUDA arrays
(CuPy or any ``__cuda_array_interface__`` object) on a GPU, NumPy arrays under
Numba's CUDA simulator. It never reads device values on the host.

API
---
``ON_SIMULATOR``
    True under ``NUMBA_ENABLE_CUDASIM=1`` (NumPy arrays, slow simulated threads).
``array_layout(x)``
    (pointer, shape, byte strides, dtype) of a NumPy, CuPy or CAI array, cheaply.
``kernel_array(x, *, persistent=False)``
    ``x`` as a kernel argument, same dtype and shape: NumPy as is; a CUDA array
    as a Numba device-array view (no copy, no stream sync).
``reinterpret(x, dtype, shape=None, *, persistent=False)``
    View the bytes of a C-contiguous ``x`` as ``dtype`` (and ``shape``), e.g. the
    uint8 canary buffer ``[num_slots, stride]`` as int64 ``[num_slots, stride // 8]``.
``byte_span(x, dtype, *, persistent=False)``
    1-D ``dtype`` array over the bytes of a 2-D ``x`` whose rows are contiguous
    but may be strided (a layer of a KV pool): from the first byte of row 0 to
    the end of the last row, whole items only. Row r starts at item
    ``r * x.strides[0] // itemsize``.

    For these three builders ``persistent=True`` caches the view of a
    long-lived array (canary buffer, ring, counters, plans, KV sources): later
    calls with the same array object skip building it. The cache holds a
    reference to at most ``CACHE_SIZE`` arrays; do not mark per-step
    temporaries persistent.
``block_size(gpu_block)``, ``grid_for(n, block)``, ``persistent_grid(n, block)``, ``resident_grid(kernel, sig, n, block)``
    Threads per block (``SIM_BLOCK`` under the simulator), blocks covering
    ``n`` items, and a grid-stride grid capped at what the GPU keeps resident
    (``SIM_MAX_BLOCKS`` under the simulator, so simulated launches stay small).
``simulated_shapes(**shapes)``, ``sim_shape(name, default)``
    Tests run simulated launches with other launch shapes (several warps per
    block, several requests per thread) inside ``with simulated_shapes(...)``;
    launch modules read them with ``sim_shape`` (see ``_compile``).
``compile_kernel(kernel, signature)``
    The kernel compiled for one declared signature (cached; see
    :mod:`kvcanary_numba.kernels` for the ``KERNELS`` / ``SIGNATURES`` convention).
``compile_eagerly(module, names=None)``
    Compile every declared signature of a kernels module (or some kernels) and
    load it into the current context, e.g. before capturing a CUDA graph (a
    first launch inside a capture would have to load the module). No-op under
    the simulator.
``launch(kernel, signature, grid, block, args)``
    Launch on CuPy's current stream (no type dispatch, no low-occupancy
    warning). On a GPU one :class:`~.prepared.PreparedLaunch` per kernel,
    signature, device and host thread is refilled with the call's arguments and
    launched by one ``cuLaunchKernel``. The arguments' Numba types are checked
    against ``signature`` (``RuntimeError`` on drift, a glue bug rather than bad
    input): every launch under the simulator, the first launch of each kernel
    and signature (per host thread) on a GPU.
``persistent_views(*arrays)``
    ``kernel_array(x, persistent=True)`` of each array, as a tuple (plans,
    ring, counters and flags: the long-lived arguments of a launch).
``check_signature(signature, args, kernel=None)``
    The check ``launch`` makes, callable on its own.
``current_stream()``
    Numba stream of the call's stream: the public ``stream=`` argument when one
    was given (``on_stream``), else CuPy's current stream (``0``: legacy default
    stream, and always under the simulator).
``on_stream(handle)``
    ``with on_stream(handle):`` every launch of this host thread in the block goes
    to CUDA stream ``handle`` (what :func:`kvcanary_numba._interop.dispatch` does
    for ``stream=``; plan scratch is keyed by it too).
``run_launches(entry, run, kwargs, handle)``
    How every validated public CUDA call runs (``_kernel_launch``). ``entry`` is
    the call's :class:`kvcanary_numba._memo.Entry`: one per argument snapshot,
    and a snapshot holds every CUDA pointer, shape, dtype, scalar and per-object
    token the glue reads. First sight: ``run(**kwargs)`` (this glue). Second
    sight: the glue runs with a thread-local sink set, so each ``launch`` builds
    its own :class:`~.prepared.PreparedLaunch` (the explicit launch description:
    kernel, signature, grid, block, packed parameters; pointers only, no array
    kept alive), launches it and appends it to the entry. Later sights on the
    same (stream, device): the packed launches are replayed, one
    ``cuLaunchKernel`` each, no glue. A changed pointer is another snapshot, so
    a replay cannot use stale memory. Bypassed under the simulator and while
    :func:`~kvcanary_numba.launch.recording.recording` is active (the
    monitor records its phases through the public calls).

The builders live in :mod:`._array_views`, grids and compilation in :mod:`._compile`,
launch and replay in :mod:`._kernel_launch`. The glue calls them through this module
(``_common.kernel_array(...)``). :func:`~kvcanary_numba.launch.recording.recording`
swaps nothing: the builders report to a thread-local observer and ``launch`` to
a thread-local sink while a recording of the calling thread is active.
"""

from __future__ import annotations

from ..kernels import ON_SIMULATOR
from ._array_views import CACHE_SIZE, array_layout, byte_span, kernel_array, reinterpret
from ._array_views import _views  # noqa: F401  (benchmarks clear the view cache)
from ._compile import (
    SIM_BLOCK,
    SIM_MAX_BLOCKS,
    THREADS_PER_SM,
    block_size,
    check_signature,
    compile_eagerly,
    compile_kernel,
    grid_for,
    persistent_grid,
    resident_grid,
    sim_shape,
    simulated_shapes,
    sm_count,
)
from ._compile import _declared_types  # noqa: F401  (prepared launches, tests)
from ._kernel_launch import current_stream, launch
from ._kernel_launch import _current_stream_ptr  # noqa: F401  (prepared launches, tests)

__all__ = [
    "CACHE_SIZE",
    "array_layout",
    "ON_SIMULATOR",
    "SIM_BLOCK",
    "SIM_MAX_BLOCKS",
    "THREADS_PER_SM",
    "block_size",
    "byte_span",
    "check_signature",
    "compile_eagerly",
    "compile_kernel",
    "current_stream",
    "grid_for",
    "kernel_array",
    "launch",
    "persistent_grid",
    "persistent_views",
    "reinterpret",
    "resident_grid",
    "sim_shape",
    "simulated_shapes",
    "sm_count",
]


def persistent_views(*arrays) -> tuple:
    """``kernel_array(x, persistent=True)`` of each of ``arrays``."""
    return tuple(kernel_array(x, persistent=True) for x in arrays)
