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
``block_size(gpu_block)``, ``grid_for(n, block)``, ``persistent_grid(n, block)``
    Threads per block (``SIM_BLOCK`` under the simulator), blocks covering
    ``n`` items, and a grid-stride grid capped at what the GPU keeps resident
    (``SIM_MAX_BLOCKS`` under the simulator, so simulated launches stay small).
``compile_kernel(kernel, signature)``
    The kernel compiled for one declared signature (cached; see
    :mod:`kvcanary_numba.kernels` for the ``KERNELS`` / ``SIGNATURES`` convention).
``compile_eagerly(module, names=None)``
    Compile every declared signature of a kernels module (or some kernels) and
    load it into the current context, e.g. before capturing a CUDA graph (a
    first launch inside a capture would have to load the module). No-op under
    the simulator.
``launch(kernel, signature, grid, block, args)``
    Launch on CuPy's current stream through the compiled kernel (no type
    dispatch, no low-occupancy warning). The arguments' Numba types are checked
    against ``signature`` (``RuntimeError`` on drift, a glue bug rather than bad
    input): every launch under the simulator, the first launch of each kernel
    and signature on a GPU.
``check_signature(signature, args, kernel=None)``
    The check ``launch`` makes, callable on its own.
``current_stream()``
    Numba stream of CuPy's current stream (``0``: legacy default stream, and
    always under the simulator).
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

from ..kernels import ON_SIMULATOR

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
    "reinterpret",
    "sm_count",
]

#: Threads per block under the simulator (one warp: each simulated thread costs ~0.2 ms).
SIM_BLOCK = 32
#: Largest grid-stride grid under the simulator (two blocks still exercise the stride).
SIM_MAX_BLOCKS = 2
#: Resident threads per SM aimed at by persistent grids (H100/H200: 2048).
THREADS_PER_SM = 2048
#: Persistent device-array views kept (see ``persistent=True``).
CACHE_SIZE = 256

_views: OrderedDict[tuple, tuple[Any, Any]] = OrderedDict()


# --- arrays -------------------------------------------------------------------


def _cai_view(x: Any, ptr: int, dtype: np.dtype, shape: tuple, strides: tuple | None):
    from numba import cuda

    desc = {"shape": shape, "strides": strides, "typestr": dtype.str, "data": (ptr, False), "version": 3}
    # sync=False: the producer's stream order is the caller's business, and a
    # synchronize would be illegal inside CUDA-graph capture.
    return cuda.from_cuda_array_interface(desc, owner=x, sync=False)


def array_layout(x: Any) -> tuple[int, tuple, tuple, np.dtype]:
    """(data pointer, shape, strides in bytes, dtype) of a NumPy or CUDA array.

    CuPy arrays are read through attributes (far cheaper than building their
    ``__cuda_array_interface__`` dict); other CUDA arrays through that dict.
    """
    ptr = getattr(getattr(x, "data", None), "ptr", None)  # CuPy: MemoryPointer.ptr
    if ptr is not None:
        return int(ptr), tuple(x.shape), tuple(x.strides), x.dtype
    if isinstance(x, np.ndarray):
        return int(x.ctypes.data), x.shape, x.strides, x.dtype
    cai = x.__cuda_array_interface__
    shape, dtype = tuple(int(n) for n in cai["shape"]), np.dtype(cai["typestr"])
    strides = cai.get("strides")
    if strides is None:
        strides, step = [], dtype.itemsize
        for extent in reversed(shape):
            strides.append(step)
            step *= max(extent, 1)
        strides = reversed(strides)
    return int(cai["data"][0] or 0), shape, tuple(int(n) for n in strides), dtype


def _cached(x: Any, key: tuple, persistent: bool, build):
    if not persistent:
        return build()
    # id(x) is stable while the entry holds x, and the layout catches views
    # rebuilt in place with other memory.
    full = (id(x), *array_layout(x), *key)
    hit = _views.get(full)
    if hit is not None:
        _views.move_to_end(full)
        return hit[1]
    view = build()
    _views[full] = (x, view)
    if len(_views) > CACHE_SIZE:
        _views.popitem(last=False)
    return view


def kernel_array(x: Any, *, persistent: bool = False):
    """``x`` as a kernel argument (NumPy as is, CUDA arrays as Numba views)."""
    if isinstance(x, np.ndarray):
        return x

    def build():
        ptr, shape, strides, dtype = array_layout(x)
        return _cai_view(x, ptr, dtype, shape, strides)

    return _cached(x, ("same",), persistent, build)


def reinterpret(x: Any, dtype, shape: Sequence[int] | None = None, *, persistent: bool = False):
    """The bytes of C-contiguous ``x`` viewed as ``dtype`` with ``shape`` (default: 1-D)."""
    dtype = np.dtype(dtype)
    if isinstance(x, np.ndarray):
        flat = x.reshape(-1).view(np.uint8).view(dtype)
        return flat if shape is None else flat.reshape(tuple(shape))

    def build():
        ptr, in_shape, _, in_dtype = array_layout(x)
        nbytes = int(np.prod(in_shape, dtype=np.int64)) * in_dtype.itemsize
        out_shape = (nbytes // dtype.itemsize,) if shape is None else tuple(int(n) for n in shape)
        return _cai_view(x, ptr, dtype, out_shape, None)

    return _cached(x, ("reinterpret", dtype.str, None if shape is None else tuple(shape)), persistent, build)


def _span_items(shape: tuple, strides: tuple, itemsize_in: int, itemsize_out: int) -> int:
    rows, cols = shape
    if rows == 0 or cols == 0:
        return 0
    return ((rows - 1) * strides[0] + cols * itemsize_in) // itemsize_out


def byte_span(x: Any, dtype, *, persistent: bool = False):
    """1-D ``dtype`` view over all rows of 2-D ``x`` (rows contiguous, any row stride)."""
    dtype = np.dtype(dtype)
    if isinstance(x, np.ndarray):
        n = _span_items(x.shape, x.strides, x.itemsize, dtype.itemsize)
        if n == 0:
            return np.zeros(0, dtype=dtype)
        raw = np.lib.stride_tricks.as_strided(x, shape=(1,), strides=(1,))  # first element, same base
        u8 = np.lib.stride_tricks.as_strided(raw.view(np.uint8), shape=(n * dtype.itemsize,), strides=(1,))
        return u8.view(dtype)

    def build():
        ptr, shape, strides, in_dtype = array_layout(x)
        return _cai_view(x, ptr, dtype, (_span_items(shape, strides, in_dtype.itemsize, dtype.itemsize),), None)

    return _cached(x, ("span", dtype.str), persistent, build)


# --- grids --------------------------------------------------------------------


@lru_cache(maxsize=None)
def sm_count() -> int:
    """Multiprocessors of the current device (1 under the simulator)."""
    if ON_SIMULATOR:
        return 1
    from numba import cuda

    return int(cuda.get_current_device().MULTIPROCESSOR_COUNT)


def block_size(gpu_block: int) -> int:
    """Threads per block: ``gpu_block`` on a GPU, ``SIM_BLOCK`` under the simulator."""
    return SIM_BLOCK if ON_SIMULATOR else int(gpu_block)


def grid_for(n_items: int, block: int) -> int:
    """Blocks of ``block`` threads covering ``n_items`` (at least 1)."""
    return max(1, -(-int(n_items) // int(block)))


def persistent_grid(n_items: int, block: int, *, blocks_per_sm: int | None = None) -> int:
    """Blocks for a grid-stride loop over ``n_items``: no more than stay resident."""
    if ON_SIMULATOR:
        return min(grid_for(n_items, block), SIM_MAX_BLOCKS)
    per_sm = blocks_per_sm if blocks_per_sm is not None else max(1, THREADS_PER_SM // int(block))
    return min(grid_for(n_items, block), sm_count() * per_sm)


# --- compilation and launch ---------------------------------------------------

_compiled: dict[tuple[int, str], Any] = {}


def compile_kernel(kernel, signature: str):
    """``kernel`` compiled for ``signature`` (cached); the kernel itself under the simulator."""
    if ON_SIMULATOR:
        return kernel
    key = (id(kernel), signature)
    hit = _compiled.get(key)
    if hit is None:
        hit = kernel.compile(signature)
        hit.bind()  # load the module now: not allowed later inside CUDA-graph capture
        _compiled[key] = hit
    return hit


def compile_eagerly(module, names: Sequence[str] | None = None) -> int:
    """Compile the declared signatures of ``module``'s kernels; returns how many."""
    count = 0
    for name in module.KERNELS if names is None else names:
        for signature in module.SIGNATURES[name]:
            compile_kernel(module.KERNELS[name], signature)
            count += 1
    return count


@lru_cache(maxsize=None)
def _declared_types(signature: str):
    from numba.core import sigutils

    return sigutils.normalize_signature(signature)[0]


def _same_type(declared, actual) -> bool:
    if hasattr(declared, "ndim"):  # array: ignore mutability / alignment flags
        return (
            hasattr(actual, "ndim")
            and (declared.dtype, declared.ndim, declared.layout) == (actual.dtype, actual.ndim, actual.layout)
        )
    return declared == actual


def check_signature(signature: str, args: Sequence[Any], kernel=None) -> None:
    """Raise ``RuntimeError`` if ``args`` do not have the Numba types of ``signature``.

    Under the simulator the types come from ``numba.typeof``; on a GPU pass the
    ``kernel``, whose compiled argument types and argument typing are used.
    """
    if kernel is None or ON_SIMULATOR:
        from numba import typeof

        declared = _declared_types(signature)
    else:
        declared, typeof = compile_kernel(kernel, signature).argument_types, kernel.typeof_pyval
    if len(declared) != len(args):
        raise RuntimeError(f"kernel launch: {len(args)} arguments for signature {signature}")
    for i, (want, arg) in enumerate(zip(declared, args)):
        got = typeof(arg)
        if not _same_type(want, got):
            raise RuntimeError(f"kernel launch: argument {i} is {got}, signature {signature} declares {want}")


#: (kernel, signature) pairs whose first GPU launch had its argument types checked.
_checked: set[tuple[int, str]] = set()


_streams: dict[int, tuple[Any, Any]] = {}


def _stream_pair(ptr: int):
    # (Numba stream, cuda.core stream) of one CUDA stream handle, built once.
    pair = _streams.get(ptr)
    if pair is None:
        from numba import cuda
        from numba.cuda.cudadrv import driver

        numba_stream = cuda.external_stream(ptr) if ptr else 0
        pair = _streams[ptr] = (numba_stream, driver._to_core_stream(numba_stream))
    return pair


def _current_stream_ptr() -> int:
    cupy = sys.modules.get("cupy")  # only if the caller already uses CuPy
    return int(cupy.cuda.get_current_stream().ptr) if cupy is not None else 0


def current_stream():
    """Numba stream wrapping CuPy's current stream; ``0`` for the legacy default stream."""
    if ON_SIMULATOR:
        return 0
    return _stream_pair(_current_stream_ptr())[0]


def launch(kernel, signature: str, grid: int, block: int, args: Sequence[Any]) -> None:
    """Launch ``kernel`` (compiled for ``signature``) on ``grid`` x ``block`` threads."""
    if ON_SIMULATOR:
        check_signature(signature, args)
        kernel[int(grid), int(block)](*args)
        return
    compiled = compile_kernel(kernel, signature)
    key = (id(kernel), signature)
    if key not in _checked:
        # The compiled launch trusts its arguments; check the glue once per kernel.
        check_signature(signature, args, kernel)
        _checked.add(key)
    compiled.launch(tuple(args), (int(grid), 1, 1), (int(block), 1, 1), _stream_pair(_current_stream_ptr())[1], 0)
