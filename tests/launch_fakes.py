"""The fast wing's raw launches as on a GPU, on a CPU: one fake :class:`~kvcanary_numba.fast.driver.Driver`
(fake kernel handles, the declared signatures as argument types, device 0) whose ``cuLaunchKernel``
reads back the parameter buffer it is given (test_launch_*.py, test_prepared.py)."""

from __future__ import annotations

import ctypes
import pathlib
import sys

import numpy as np
import pytest

from kvcanary_numba.fast import driver as _driver, prepared
from kvcanary_numba.launch._launch import _declared_types

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


class CaiArray:
    """Just a ``__cuda_array_interface__`` and the ``shape`` it states (never dereferenced)."""

    def __init__(self, shape, typestr="<i8", ptr=0x1000, strides=None):
        self.shape = tuple(shape)
        self.__cuda_array_interface__ = {
            "shape": tuple(shape),
            "typestr": typestr,
            "data": (ptr, False),
            "strides": strides,
            "version": 3,
        }


class FakeHandle:
    """A CUkernel stand-in: converts to an int, like cuda-bindings' handle objects."""

    def __init__(self, value: int):
        self.value = value

    def __int__(self) -> int:
        return self.value


class FakeLibcuda:
    """libcuda's ``cuLaunchKernel``: checks its pointer arguments are ``c_void_p`` objects and
    decodes the ``kernelParams`` it is given with ``slot_types``."""

    def __init__(self, log: list):
        self.log, self.slot_types, self.buffers = log, {}, 0  # buffers: launches given in the one-buffer form

    def __call__(self, func, gx, gy, gz, bx, by, bz, shmem, stream, params, extra):
        func, stream = int(func), int(stream or 0)
        params = ctypes.c_void_p(params.value if isinstance(params, ctypes.c_void_p) else int(params or 0))
        types = self.slot_types[func]
        if extra is not None and extra.value:  # the one-buffer form; then kernelParams must be NULL
            assert not params.value, "kernelParams and extra both given"
            values = _decode_buffer(types, extra.value)
            self.log.append(("raw", func, gx, bx, stream, values))
            self.buffers += 1
            return 0
        pointers = (ctypes.c_void_p * len(types)).from_address(params.value)
        values = [t.from_address(p).value or 0 for t, p in zip(types, pointers)]
        self.log.append(("raw", func, gx, bx, stream, values))
        return 0


def natural_offsets(types: list) -> list[int]:
    """Offsets of parameters of ctypes ``types`` in a kernel's parameter block (each aligned to its size)."""
    offsets, end = [], 0
    for t in types:
        size = ctypes.sizeof(t)
        end = -(-end // size) * size
        offsets.append(end)
        end += size
    return offsets


def _decode_buffer(types: list, extra: int) -> list[int]:
    """The parameter values of a launch given as ``extra`` = {BUFFER_POINTER, block, BUFFER_SIZE, &size, END}."""
    key0, block, key1, size_at, end = (ctypes.c_void_p * 5).from_address(extra)
    assert (key0, key1, end) == (1, 2, None), "not a CU_LAUNCH_PARAM_BUFFER_POINTER / SIZE / END array"
    offsets = natural_offsets(types)
    size = ctypes.c_size_t.from_address(size_at).value
    assert size == offsets[-1] + ctypes.sizeof(types[-1]), f"buffer size {size}"
    return [t.from_address(block + o).value or 0 for t, o in zip(types, offsets)]


#: libcuda's ``cuLaunchKernel`` C signature, pointers as 64-bit integers (how ``_native`` calls it).
CU_LAUNCH_KERNEL = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_uint64, *[ctypes.c_uint] * 7, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64
)


class NativeLibcuda:
    """A C-callable ``cuLaunchKernel`` (ctypes callback) in front of :class:`FakeLibcuda`: what the
    compiled launch loop calls. ``fail`` maps a call number (0-based) to the CUresult it returns
    (nothing is logged for a failed call); ``calls`` counts the calls."""

    def __init__(self, lib: FakeLibcuda):
        self.lib, self.fail, self.calls = lib, {}, 0
        self.c_function = CU_LAUNCH_KERNEL(self._call)  # kept alive as long as this object
        self.address = ctypes.cast(self.c_function, ctypes.c_void_p).value

    def _call(self, func, gx, gy, gz, bx, by, bz, shmem, stream, params, extra):
        n, self.calls = self.calls, self.calls + 1
        if n in self.fail:
            return self.fail[n]
        if (gy, gz, by, bz, shmem) != (1, 1, 1, 1, 0):
            raise AssertionError(f"unexpected launch shape {(gy, gz, by, bz, shmem)}")
        return self.lib(
            func,
            gx,
            gy,
            gz,
            bx,
            by,
            bz,
            shmem,
            stream,
            ctypes.c_void_p(params),
            ctypes.c_void_p(extra) if extra else None,
        )


class FakeDriver(_driver.Driver):
    """The driver on a CPU: raw launches go to :class:`FakeLibcuda`, handles are :class:`FakeHandle`
    objects registered with their parameter types, argument types come from the declared
    signature, device 0. ``check_abi`` reports nothing (no one-buffer form) until
    :meth:`Gpu.report_offsets`."""

    def __init__(self, lib: FakeLibcuda):
        super().__init__(raw=True)
        self.lib, self.handles = lib, {}

    def function_handle(self, kernel, signature):
        key = (id(kernel), signature)
        if key not in self.handles:
            self.handles[key] = FakeHandle(0x100 + len(self.handles))
            self.lib.slot_types[int(self.handles[key])] = [
                s for t in _declared_types(signature) for s in prepared._slot_types(t)
            ]
        return self.handles[key]

    def argument_types(self, kernel, signature):
        return _declared_types(signature)

    def check_types(self, kernel, signature, args):
        return None

    def current_device(self):
        return 0

    def select(self, handle=None, load=None):
        self.ready = True

    def launch(self, func, grid, block, stream, params):
        err = self.lib(func, grid, 1, 1, block, 1, 1, 0, stream, params, None)
        if err:
            raise RuntimeError(f"cuLaunchKernel failed: {self.error_name(err)} (grid {grid}, block {block})")

    def check_abi(self, handle, sizes):
        return None


class Gpu:
    """What the ``gpu`` fixture set up: ``log`` of launches and the fake driver (swapped in for the
    process's one: every packed launch, replay and launch table uses it)."""

    def __init__(self, monkeypatch):
        self.log: list = []
        self.lib = FakeLibcuda(self.log)
        self.driver = FakeDriver(self.lib)
        self.monkeypatch = monkeypatch

    @property
    def handles(self) -> dict:
        return self.driver.handles

    def native(self) -> NativeLibcuda:
        """Give the driver a C ``cuLaunchKernel`` (a callback logging like :attr:`lib`): launch tables
        built from now on run the compiled loop."""
        self.c_lib = NativeLibcuda(self.lib)
        self.driver.native = self.c_lib.address
        return self.c_lib

    def report_offsets(self) -> None:
        """Let ``check_abi`` report the natural parameter offsets (as a driver does): launches
        prepared from now on get the one-buffer form."""
        self.driver.check_abi = lambda handle, sizes: natural_offsets(self.lib.slot_types[int(handle)])

    def handle(self, kernel, signature):
        return self.driver.function_handle(kernel, signature)


@pytest.fixture
def gpu(monkeypatch) -> Gpu:
    """The fast wing's raw launches as on a GPU (device 0; stream 0 unless a call names one)."""
    fake = Gpu(monkeypatch)
    monkeypatch.setattr(_driver, "driver", fake.driver)
    return fake


SIG = "void(int64[::1], int32, int64[:, ::1], UniTuple(int64, 2))"
KERNEL_A, KERNEL_B = type("KernelA", (), {})(), type("KernelB", (), {})()


def args_for(ptr: int, n: int = 5, scalar: int = -5) -> tuple:
    """Arguments of :data:`SIG`: two arrays at ``ptr`` and ``ptr + 0x1000``, a scalar, a tuple."""
    return (CaiArray((n,), "<i8", ptr), scalar, CaiArray((2, 3), "<i8", ptr + 0x1000, strides=(48, 8)), (11, 12))


def expected_values(args: tuple) -> list[int]:
    """The flattened parameters a launch of :data:`SIG` with ``args`` must carry."""
    _, _, _, slots, _ = prepared.pack_buffer(_declared_types(SIG), args)
    return [s.value or 0 for s in slots]


# --- raw launches run on the simulator, from their parameter slots ---------------------------------


def _decoded(ty, slots: list, i: int) -> tuple:
    """(the argument of Numba type ``ty`` whose flattened parameters start at ``slots[i]``, the
    next index): an array is rebuilt over the memory its packed pointer names (no copy)."""
    from numba.core import types
    from numba.np import numpy_support

    if isinstance(ty, types.Array):
        n = ty.ndim
        values = [s.value or 0 for s in slots[i : i + 5 + 2 * n]]
        nitems, itemsize, ptr = values[2], values[3], values[4]
        shape, strides = tuple(values[5 : 5 + n]), tuple(values[5 + n :])
        dtype = numpy_support.as_dtype(ty.dtype)
        if nitems == 0:
            return np.zeros(shape, dtype=dtype), i + 5 + 2 * n
        extent = sum((extent - 1) * stride for extent, stride in zip(shape, strides)) + itemsize
        memory = (ctypes.c_char * extent).from_address(ptr)
        return np.ndarray(shape, dtype=dtype, buffer=memory, strides=strides), i + 5 + 2 * n
    if isinstance(ty, types.BaseTuple):
        items = []
        for member in ty:
            item, i = _decoded(member, slots, i)
            items.append(item)
        return tuple(items), i
    return slots[i].value, i + 1


def run_packed(launch, stream=None) -> None:
    """A raw :class:`~kvcanary_numba.fast.prepared.PreparedLaunch`'s launch, run by Numba's
    simulator from what its parameter slots hold (pointers, shapes, scalars), as a GPU would
    run it: a stale pointer reads or writes the memory it names. ``launched`` lists
    (signature, array pointers) of each launch."""
    args, i = [], 0
    for ty in launch._types:
        value, i = _decoded(ty, launch._slots, i)
        args.append(value)
    launched.append((launch.signature, [a.ctypes.data for a in _arrays(args) if a.size]))
    launch.kernel[launch.grid, launch.block](*args)


def _arrays(args) -> list:
    out = []
    for a in args:
        out += _arrays(a) if isinstance(a, tuple) else [a] if isinstance(a, np.ndarray) else []
    return out


#: (signature, array pointers) of every launch :func:`run_packed` ran (tests clear it).
launched: list = []


__all__ = [
    "CaiArray",
    "Gpu",
    "NativeLibcuda",
    "natural_offsets",
    "KERNEL_A",
    "KERNEL_B",
    "SIG",
    "args_for",
    "expected_values",
    "gpu",
    "launched",
    "np",
    "run_packed",
]
