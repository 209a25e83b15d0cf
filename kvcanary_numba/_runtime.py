"""What this process can run on, and where the package's buffers come from.

Whether the kernels can run (numba-cuda installed, Numba's CUDA simulator on), the array
module of a device, documented upper bounds of sizes, and allocation that fails with a
coded error. The kernels need the numba-cuda package: without it ``numba.cuda`` is numba's
own deprecated CUDA target, whose simulator swaps the module under running simulated
threads, and which this package is not tested on (KVC-C008).

Counters and plan lengths are int32 on the device (as in SGLang), so every
capacity is at most ``INT32_MAX``; slots are int32 in ``req_to_token``, so a
pool holds at most ``INT32_MAX`` slots. A size inside its bound may still not
fit in memory: :func:`coded_allocation` turns the array library's
``MemoryError`` (CuPy's ``OutOfMemoryError`` is one) into KVC-C015.

Modules that need numba-cuda or CuPy are imported on first use, under :data:`CUDA_IMPORTS`.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import importlib.util
import os
import sys
import threading
from collections.abc import Iterator
from types import ModuleType

import numpy as np

from .errors import error

__all__ = [
    "CUDA_IMPORTS",
    "DEVICE_NAMES",
    "INT32_MAX",
    "MAX_SLOT_STRIDE_BYTES",
    "NO_NUMBA_CUDA",
    "array_module",
    "coded_allocation",
    "gpu_available",
    "imported",
    "kernels_available",
    "kernels_unavailable",
    "simulator_enabled",
]

#: Held while the package imports, on first use, a module that may be the process's first import of
#: numba-cuda or CuPy: the launch glue and kernels, CuPy itself. Both packages import in cycles, and
#: when two threads' imports wait on each other Python hands one of them a partially initialised
#: module instead of deadlocking; so these imports take turns. The package's own modules import in
#: no cycle (tests/test_layers.py), so imports reached only after one of these are safe without it.
CUDA_IMPORTS = threading.RLock()


def imported(name: str) -> ModuleType | None:
    """``sys.modules[name]`` once its import has finished, else None: a module another thread is
    still importing lacks what it defines further down."""
    module = sys.modules.get(name)
    if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
        return None
    return module


#: Why the kernels cannot run without numba-cuda (KVC-C008's reason).
NO_NUMBA_CUDA = (
    "the kernels need the numba-cuda package (pip install 'kvcanary_numba[gpu]'); numba's own "
    "numba.cuda target is not supported"
)

DEVICE_NAMES = ("cpu", "cuda")

#: Largest capacity, slot count or slot index (int32 device counters and tables).
INT32_MAX = 2**31 - 1
#: Largest canary record stride (a record uses 32 bytes; the rest is padding).
MAX_SLOT_STRIDE_BYTES = 4096


@contextlib.contextmanager
def coded_allocation(function: str, argument: str, got: int, *, what: str, nbytes: int) -> Iterator[None]:
    """Run the allocations of ``argument``'s buffers; ``MemoryError`` becomes KVC-C015.

    Parameters
    ----------
    function, argument : str
        Named in the message.
    got : int
        The size asked for.
    what : str
        What is allocated ("verify plan", "violation ring", ...).
    nbytes : int
        Bytes the allocation needs (for the message).
    """
    try:
        yield
    except MemoryError as exc:
        reason = type(exc).__name__ if not str(exc) else f"{type(exc).__name__}: {str(exc)[:80]}"
        raise error(
            "KVC-C015", function=function, argument=argument, got=got, what=what, nbytes=nbytes, reason=reason
        ) from None


def array_module(function: str, device: str):
    """NumPy for ``device="cpu"``, CuPy for ``device="cuda"`` (KVC-C009 / KVC-C008)."""
    if device not in DEVICE_NAMES:
        raise error("KVC-C009", function=function, argument="device", expected=DEVICE_NAMES, got=device)
    if device == "cpu":
        return np
    try:
        with CUDA_IMPORTS:
            import cupy
    except ImportError as exc:
        raise error(
            "KVC-C008", function=function, argument="device", got=device, reason=f"CuPy is not installed ({exc})"
        ) from None
    if not gpu_available():
        raise error("KVC-C008", function=function, argument="device", got=device, reason="no CUDA GPU is visible")
    reason = kernels_unavailable()
    if reason is not None:  # CUDA buffers are only ever used by the kernels
        raise error("KVC-C008", function=function, argument="device", got=device, reason=reason)
    return cupy


def gpu_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        with CUDA_IMPORTS:
            import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - any failure means "no usable GPU"
        return False


#: The first NumPy release numba-cuda 0.30 does not run on: NumPy 2.5 removed ``np.row_stack``,
#: which numba-cuda's array overloads name when the first kernel compiles.
NUMBA_CUDA_NUMPY_LIMIT = (2, 5)


@functools.cache
def kernels_unavailable() -> str | None:
    """Why the kernels cannot run in this process (KVC-C008's reason), or None when they can:
    numba-cuda must be installed (it provides ``numba.cuda``), on a NumPy it runs on."""
    try:
        if importlib.util.find_spec("numba_cuda") is None:
            return NO_NUMBA_CUDA
    except ImportError:  # a finder that refuses the name outright
        return NO_NUMBA_CUDA
    numpy_version = tuple(int(part) for part in np.__version__.split(".")[:2])
    if numpy_version >= NUMBA_CUDA_NUMPY_LIMIT and importlib.metadata.version("numba-cuda").startswith("0.30."):
        return (
            f"numba-cuda 0.30 does not run on NumPy {np.__version__} (np.row_stack is gone); the gpu extras "
            "pin numpy<2.5"
        )
    return None


def kernels_available() -> bool:
    """True when the kernels can run in this process (:func:`kernels_unavailable` has no reason)."""
    return kernels_unavailable() is None


def simulator_enabled() -> bool:
    """True when Numba's CUDA simulator is switched on for this process."""
    from numba import config

    return bool(config.ENABLE_CUDASIM) or os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
