"""How the launch glue launches a kernel: argument views, grids, and one public-API launch.

Every ``launch/<op>.py`` module turns validated arguments into kernel arguments and calls
:func:`launch` once per kernel. The arguments it builds are :class:`View` descriptions
("this caller array, seen as int64 [n, 4]"), not device arrays: :func:`run` makes the
Numba views when it launches, through numba-cuda's public API::

    kernel[grid, block, stream](*args)

Under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) the same call runs the kernel on
NumPy arrays, one Python thread per CUDA thread.

The fast wing (``kvcanary_numba/fast/``) consumes the same descriptions another way: inside
``with sink(take):`` every :func:`launch` of this thread hands its :class:`LaunchSpec` to
``take`` instead of running it, and the fast wing packs it into a raw driver launch, records
it for a monitor step or captures it into a CUDA graph. Since a :class:`View` names the
caller array it was made from, a packed launch can be re-pointed at next step's array.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any, NamedTuple

import numpy as np

from .._runtime import imported
from .._validate import c_strides, is_c_contiguous
from ..kernels import ON_SIMULATOR
from ._device import SIM_SHAPES, compile_kernel, numba_stream, resident_blocks, simulated_shapes, sm_count

__all__ = [
    "LaunchSpec",
    "ON_SIMULATOR",
    "SIM_BLOCK",
    "SIM_MAX_BLOCKS",
    "THREADS_PER_SM",
    "View",
    "array_layout",
    "block_size",
    "byte_span",
    "check_signature",
    "compile_kernel",
    "current_stream",
    "grid_for",
    "kernel_array",
    "launch",
    "persistent_grid",
    "persistent_views",
    "reinterpret",
    "resident_grid",
    "run",
    "sim_shape",
    "simulated_shapes",
    "sink",
    "sink_active",
    "sm_count",
]

SIM_BLOCK = 32  # threads per block under the simulator (one warp: a simulated thread costs ~0.2 ms)
SIM_MAX_BLOCKS = 2  # largest grid-stride grid under the simulator (two blocks still exercise the stride)
#: Resident threads per SM aimed at by persistent grids (H100/H200: 2048).
THREADS_PER_SM = 2048


# --- kernel array arguments ------------------------------------------------------


def array_layout(x: Any) -> tuple[int, tuple, tuple, np.dtype]:
    """(data pointer, shape, strides in bytes, dtype) of a NumPy, CuPy, CUDA-interface array or :class:`View`."""
    if isinstance(x, View):
        return x.layout()
    ptr = getattr(getattr(x, "data", None), "ptr", None)  # CuPy: read attributes, not the interface dict
    if ptr is not None:
        return int(ptr), tuple(x.shape), tuple(x.strides), x.dtype
    if isinstance(x, np.ndarray):
        return int(x.ctypes.data), x.shape, x.strides, x.dtype
    cai = x.__cuda_array_interface__
    shape, dtype = tuple(int(n) for n in cai["shape"]), np.dtype(cai["typestr"])
    strides = cai.get("strides")
    strides = c_strides(shape, dtype.itemsize) if strides is None else tuple(int(n) for n in strides)
    return int(cai["data"][0] or 0), shape, strides, dtype


def _span_items(shape: tuple, strides: tuple, itemsize_in: int, itemsize_out: int) -> int:
    rows, cols = shape
    return 0 if rows == 0 or cols == 0 else ((rows - 1) * strides[0] + cols * itemsize_in) // itemsize_out


@dataclass(frozen=True, slots=True)
class View:
    """One kernel array argument: caller array ``source`` seen as the kernel needs it.

    ``builder`` is ``"array"`` (as it is), ``"reinterpret"`` (the bytes of a C-contiguous
    array as ``dtype``, 1-D or ``new_shape``) or ``"span"`` (the bytes of a 2-D array
    whose rows are contiguous but may be strided, from the first byte of row 0 to the end
    of the last row, as 1-D ``dtype``: a layer of a KV pool). ``persistent`` is the glue's
    word that ``source`` is long-lived (a context, plan or KV pool): a recorded launch may
    keep it, while a view of a per-call array must be re-pointed every step.
    """

    source: Any
    builder: str = "array"
    dtype: Any = None
    new_shape: tuple | None = None
    persistent: bool = False

    def on(self, source: Any) -> View:
        """The same view of another array (next step's array of the same role)."""
        return View(source, self.builder, self.dtype, self.new_shape, self.persistent)

    def layout(self) -> tuple[int, tuple, tuple, np.dtype]:
        """(pointer, shape, byte strides, dtype) of the view, computed from the source's layout."""
        ptr, shape, strides, dtype = array_layout(self.source)
        if self.builder == "array":
            shape, strides = tuple(shape), tuple(strides)
            if is_c_contiguous(shape, strides, dtype.itemsize):  # extent-1 axes: any stride is C
                strides = c_strides(shape, dtype.itemsize)
            return ptr, shape, strides, dtype
        out = np.dtype(self.dtype)
        if self.builder == "reinterpret":
            nbytes = dtype.itemsize
            for extent in shape:
                nbytes *= extent
            new = (nbytes // out.itemsize,) if self.new_shape is None else self.new_shape
            return ptr, new, c_strides(new, out.itemsize), out
        n = _span_items(tuple(shape), tuple(strides), dtype.itemsize, out.itemsize)
        return ptr, (n,), (out.itemsize,), out

    @property
    def shape(self) -> tuple:
        return self.layout()[1]  # the glue sizes grids from its arguments' shapes

    def materialize(self):
        """The view itself: a NumPy array under the simulator, else a Numba device array (no copy,
        no stream synchronisation: the caller orders its streams, and a sync would be illegal
        inside CUDA-graph capture)."""
        x = self.source
        if isinstance(x, np.ndarray):
            if self.builder == "array":
                return x
            out = np.dtype(self.dtype)
            if self.builder == "reinterpret":
                flat = x.reshape(-1).view(np.uint8).view(out)
                return flat if self.new_shape is None else flat.reshape(self.new_shape)
            n = _span_items(x.shape, x.strides, x.itemsize, out.itemsize)
            if n == 0:
                return np.zeros(0, dtype=out)
            first = np.lib.stride_tricks.as_strided(x, shape=(1,), strides=(1,))  # first element, same base
            raw = np.lib.stride_tricks.as_strided(first.view(np.uint8), shape=(n * out.itemsize,), strides=(1,))
            return raw.view(out)
        from numba import cuda

        ptr, shape, strides, dtype = self.layout()
        desc = {"shape": shape, "strides": strides, "typestr": dtype.str, "data": (ptr, False), "version": 3}
        return cuda.from_cuda_array_interface(desc, owner=x, sync=False)


def kernel_array(x: Any, *, persistent: bool = False) -> View:
    """``x`` as a kernel argument, same dtype and shape."""
    return View(x, "array", None, None, persistent)


def reinterpret(x: Any, dtype, shape: Sequence[int] | None = None, *, persistent: bool = False) -> View:
    """The bytes of C-contiguous ``x`` viewed as ``dtype`` with ``shape`` (default: 1-D), e.g. the
    uint8 canary buffer ``[num_slots, stride]`` as int64 ``[num_slots, stride // 8]``."""
    new = None if shape is None else tuple(int(n) for n in shape)
    return View(x, "reinterpret", np.dtype(dtype), new, persistent)


def byte_span(x: Any, dtype, *, persistent: bool = False) -> View:
    """1-D ``dtype`` view over all rows of 2-D ``x`` (rows contiguous, any row stride); row ``r``
    starts at item ``r * x.strides[0] // itemsize``."""
    return View(x, "span", np.dtype(dtype), None, persistent)


def persistent_views(*arrays) -> tuple:
    """``kernel_array(x, persistent=True)`` of each of ``arrays``."""
    return tuple(View(x, "array", None, None, True) for x in arrays)


def _materialize(arg: Any):
    if isinstance(arg, View):
        return arg.materialize()
    if isinstance(arg, tuple):
        return tuple(_materialize(item) for item in arg)
    return arg


# --- streams ----------------------------------------------------------------------


def current_stream() -> int:
    """CuPy's current stream handle when the caller uses CuPy, else 0 (the legacy default stream)."""
    if ON_SIMULATOR:
        return 0
    cupy = imported("cupy")  # only if the caller already uses CuPy (not while another thread imports it)
    return int(cupy.cuda.get_current_stream().ptr) if cupy is not None else 0


# --- launch descriptions and the one launch ------------------------------------------


class LaunchSpec(NamedTuple):
    """One kernel launch as the glue asked for it.

    Attributes
    ----------
    kernel, signature : numba.cuda dispatcher, str
        A module-level ``@cuda.jit`` kernel and the declared signature it runs with
        (``KERNELS`` and ``SIGNATURES`` of its module, :mod:`kvcanary_numba.kernels`).
    grid, block : int
        1-D launch shape.
    args : tuple
        Kernel arguments: :class:`View` descriptions, scalars, tuples of them, or device
        arrays the glue owns (launch scratch).
    stream : int
        CUDA stream handle (0: the legacy default stream).
    """

    kernel: Any
    signature: str
    grid: int
    block: int
    args: tuple
    stream: int = 0

    def transient_arguments(self) -> list[int]:
        """Indices of the array arguments viewed from a per-call array (``persistent=False``)."""
        return [i for i, a in enumerate(self.args) if isinstance(a, View) and not a.persistent]


#: Per host thread: ``take(spec)``, the consumer of this thread's launch descriptions (the fast wing).
_sink = threading.local()


@contextmanager
def sink(take: Callable[[LaunchSpec], None]) -> Iterator[None]:
    """``with sink(take):`` every :func:`launch` of this thread in the block calls ``take(spec)`` instead."""
    saved = getattr(_sink, "take", None)
    _sink.take = take
    try:
        yield
    finally:
        _sink.take = saved


def sink_active() -> bool:
    """Whether a :func:`sink` takes this thread's launches now."""
    return getattr(_sink, "take", None) is not None


def launch(kernel, signature: str, grid: int, block: int, args: Sequence[Any], stream: int | None = None) -> None:
    """Launch ``kernel`` (declared ``signature``) on ``grid`` x ``block`` threads on CUDA stream
    ``stream`` (None: :func:`current_stream`): the description goes to this thread's sink when
    one is active, else :func:`run` runs it now."""
    spec = LaunchSpec(
        kernel, signature, int(grid), int(block), tuple(args), current_stream() if stream is None else int(stream)
    )
    take = getattr(_sink, "take", None)
    if take is not None:
        take(spec)
    else:
        run(spec)


#: The simulator runs a kernel by swapping module state that every simulated kernel reads (its
#: ``cuda`` object, thread indices): launches from two host threads at once must take turns.
_SIMULATED_LAUNCH = threading.Lock()


def run(spec: LaunchSpec) -> None:
    """Run one launch description now: ``kernel[grid, block, stream](*args)``.

    Under the simulator the arguments' types are checked against the declared signature
    first (a type drift fails in CPU tests, not as a mistyped launch on a GPU), and
    read-only inputs go as copies: the simulator copies every array argument back after
    the kernel; simulated launches of several host threads run one at a time.
    """
    args = [_materialize(a) for a in spec.args]
    if ON_SIMULATOR:
        check_signature(spec.signature, args)
        args = [a.copy() if getattr(getattr(a, "flags", None), "writeable", True) is False else a for a in args]
        with _SIMULATED_LAUNCH:
            spec.kernel[spec.grid, spec.block](*args)
        return
    spec.kernel[spec.grid, spec.block, numba_stream(spec.stream)](*args)


# --- grids ---------------------------------------------------------------------------


def block_size(gpu_block: int) -> int:
    """Threads per block: ``gpu_block`` on a GPU, ``SIM_BLOCK`` (or the ``block`` shape) under the simulator."""
    return sim_shape("block", SIM_BLOCK) if ON_SIMULATOR else int(gpu_block)


def grid_for(n_items: int, block: int) -> int:
    """Blocks of ``block`` threads covering ``n_items`` (at least 1)."""
    return max(1, -(-int(n_items) // int(block)))


def persistent_grid(n_items: int, block: int, *, blocks_per_sm: int | None = None, parts: int = 1) -> int:
    """Blocks for a grid-stride loop over ``n_items``: no more than stay resident.

    ``parts``: the grid is one of that many equal parts of a launch (one per endpoint of a
    monitor step, in the fast wing), which share what stays resident.
    """
    if ON_SIMULATOR:
        return min(grid_for(n_items, block), SIM_MAX_BLOCKS)
    per_sm = blocks_per_sm if blocks_per_sm is not None else max(1, THREADS_PER_SM // int(block))
    return min(grid_for(n_items, block), max(1, sm_count() * per_sm // int(parts)))


def resident_grid(kernel, signature: str, n_items: int, block: int, *, parts: int = 1) -> int:
    """:func:`persistent_grid` sized by the compiled kernel's occupancy.

    A grid-stride kernel whose registers or shared memory keep fewer than
    ``THREADS_PER_SM`` threads resident would otherwise run its blocks in uneven
    waves; this asks how many blocks of ``block`` threads fit on the whole device at
    once (cached per kernel and block size).
    """
    if ON_SIMULATOR:
        return persistent_grid(n_items, block)
    return min(grid_for(n_items, block), max(1, resident_blocks(kernel, signature, int(block)) // int(parts)))


# --- argument types (checked under the simulator) ---------------------------------


@cache
def _declared_types(signature: str):
    from numba.core import sigutils  # public: numba's signature strings

    return sigutils.normalize_signature(signature)[0]


def same_type(declared, actual) -> bool:
    from numba.core.types import BaseTuple

    if hasattr(declared, "ndim"):  # array: ignore mutability / alignment flags
        return hasattr(actual, "ndim") and (declared.dtype, declared.ndim, declared.layout) == (
            actual.dtype,
            actual.ndim,
            actual.layout,
        )
    if isinstance(declared, BaseTuple):  # item by item (a read-only array makes a heterogeneous Tuple)
        return isinstance(actual, BaseTuple) and len(actual) == len(declared) and all(map(same_type, declared, actual))
    return declared == actual


def check_signature(signature: str, args: Sequence[Any]) -> None:
    """Raise ``RuntimeError`` if ``args`` (materialized) do not have the Numba types of ``signature``."""
    from numba import typeof

    declared = _declared_types(signature)
    if len(declared) != len(args):
        raise RuntimeError(f"kernel launch: {len(args)} arguments for signature {signature}")
    for i, (want, arg) in enumerate(zip(declared, args)):
        got = typeof(arg)
        if not same_type(want, got):
            raise RuntimeError(f"kernel launch: argument {i} is {got}, signature {signature} declares {want}")


# --- simulated launch shapes ----------------------------------------------------------


def sim_shape(name: str, default: int) -> int:
    """Launch shape ``name`` of a simulated launch: the :func:`simulated_shapes` value, else ``default``."""
    return int(SIM_SHAPES.get(name, default))
