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
    Describe one launch (a :class:`~.spec.LaunchSpec`) and hand it to this
    thread's sink if one is active, else run it now (``run_spec``): on CuPy's
    current stream, no type dispatch, no low-occupancy warning. The arguments'
    Numba types are checked against ``signature`` (``RuntimeError`` on drift, a
    glue bug rather than bad input): every launch under the simulator, the first
    launch of each kernel and signature (per host thread) on a GPU.
``run_spec(spec)``
    Run a launch description now. On a GPU one packed launch
    (:class:`~.prepared.PreparedLaunch`) per kernel, signature, device and host
    thread is refilled from ``spec`` and launched by one ``cuLaunchKernel``.
``function_handle(kernel, signature)``
    The driver handle of a compiled kernel, or None when numba-cuda does not
    expose it as expected (logged once; launches then take Numba's launch).
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
    for ``stream=``; launch scratch, ``launch/scratch.py``, is keyed by it too).
``run_launches(entry, run, kwargs, handle)``
    How every validated public CUDA call runs (``_kernel_launch``): the glue
    (``run(**kwargs)``) the first time a snapshot is seen, packed the second
    time, replayed after that (below).

Launch descriptions and who consumes them
-----------------------------------------
Every launch the glue asks for is one immutable :class:`~.spec.LaunchSpec`
(kernel, signature, grid, block, arguments; in a recording also each array
argument's :class:`~.spec.Origin`: the caller array it views, how, and whether
the glue called it long-lived with ``persistent=True``). Four consumers:

1. eager: ``run_spec`` refills the per-thread packed launch of the kernel from
   the spec, every argument, and launches it;
2. memo replay: the second time a public call's argument snapshot comes back, its
   glue runs with a packing sink: each spec is packed, launched and kept (pointers
   only, no array kept alive) in the snapshot's ``_memo.Entry``; later calls
   with that snapshot replay the packed launches, no glue (``glue_memo`` does the
   same for the monitor's internal endpoint glue, keyed without validation);
3. recorded phases: :func:`~.recording.recording` collects the specs of
   launch-glue calls instead of running them; the monitor packs them into
   :class:`~kvcanary_numba.monitor.fastpath.PreparedPhase` objects and rebinds
   the per-step arguments by role every step;
4. graph capture: a CUDA graph captures the packed launches of a prepared phase
   (their parameters are copied into the graph at capture).

The rule that keeps packed pointers current: a packed launch records what it
packed for each argument (``PreparedLaunch.packed``: an array's pointer, shape,
strides and dtype; a scalar's value), and a consumer that launches it again
either re-packs it from a new spec (1), rebinds by role every argument viewed
from a per-call array (3: ``PreparedPhase`` refuses to build a phase in which
such an argument has no role, and ``Origin.persistent`` is the glue's word that
the rest is long-lived), replays a graph only while each role's array is the
captured object (4: ``CapturedStep.matches``, else the prepared path runs), or
replays only where nothing the glue read can differ (2): the snapshot holds
every pointer, shape, scalar and per-object token of the arguments, and
``entry.where`` the stream, the device and every glue state read besides the
arguments (``_kernel_launch.LAUNCH_STATE``: the shared write chain of
``chain.sharing``, registered by ``launch/chain.py``). Glue that starts reading
other state must register a reader there the same way. A tuple argument
(the per-endpoint contexts of ``launch/endpoints.py``) is packed whole and has
no origin, so no role can rebind a view inside it: tuples hold only persistent
views (a recording refuses a per-call view in one), and
``PreparedLaunch.packed`` keeps their items' layouts. ``_kernel_launch.VERIFY_REPLAYS = True`` re-derives every replay's specs
(the glue runs, recorded) and raises ``StaleLaunch`` on a difference (a GPU
test runs eager monitor steps with it; ``KVCANARY_VERIFY_REPLAYS=1`` turns it on
for a whole run).

Thread-local state, and why: the sink (one per host thread: a recording or the
packing of a public call), the view observer of a recording, the ``stream=``
override and the eager packed launches. The glue is plain functions called by
the public wrappers; passing a sink or a stream through every wrapper and glue
signature would change every launch module for what is, per thread, one
dynamic scope. A thread's recording must not capture another thread's launches,
and a packed launch's parameter buffer is rewritten in place, so both are per
thread. Under the simulator nothing is packed: the glue runs every call.

The builders live in :mod:`._array_views`, grids and compilation in :mod:`._compile`,
launch and replay in :mod:`._kernel_launch`, packing in :mod:`.prepared`, the driver
calls (and their single route switch, ``_driver.LAUNCH_ROUTE``) in :mod:`._driver`,
launches issued together (a replayed call, a prepared phase: one compiled loop for all
of them, ``_driver.DRIVER_CALLS``) in :mod:`.table` and :mod:`._native`.
The glue calls them through this module (``_common.kernel_array(...)``).
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
    function_handle,
    grid_for,
    persistent_grid,
    resident_grid,
    sim_shape,
    simulated_shapes,
    sm_count,
)
from ._compile import _declared_types  # noqa: F401  (prepared launches, tests)
from ._kernel_launch import current_stream, launch, run_spec
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
    "function_handle",
    "grid_for",
    "kernel_array",
    "launch",
    "persistent_grid",
    "persistent_views",
    "reinterpret",
    "resident_grid",
    "run_spec",
    "sim_shape",
    "simulated_shapes",
    "sm_count",
]


def persistent_views(*arrays) -> tuple:
    """``kernel_array(x, persistent=True)`` of each of ``arrays``."""
    return tuple(kernel_array(x, persistent=True) for x in arrays)
