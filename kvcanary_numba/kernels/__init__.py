"""Numba-CUDA kernels: ``@cuda.jit`` kernels and device functions only.

One family per operation (``verify``; ``write`` with its device helpers in
``write_chunk`` and ``widen``, the int32 inputs it accepts copied into int64; ``fingerprint``;
``plan`` with ``lookback``; ``scatter``; ``budget``) plus ``hashing`` (device splitmix64 /
mix3 / slot hash). Host code never lives here:
argument checks are in the operation modules (``kvcanary_numba/<op>.py``), grids and
argument views in ``kvcanary_numba/launch/<op>.py``. These modules import only Numba,
NumPy, llvmlite, ``constants``, ``hashing`` and each other (``tests/test_kernels_layers.py``):
the fast wing's kernels (``kvcanary_numba/fast/kernels/``) build on them, never the reverse.

Conventions every kernels module follows
----------------------------------------
Kernels are defined once, at module scope. Compile-time variants (e.g. "check
the expected token or not", "fold N real-KV sources") are made by a factory
function called at import time: the flags are closure constants, so the
compiled code of each variant carries no dead branches.

Every module that defines a kernel declares:

``KERNELS : dict[str, kernel]``
    Every kernel of the module (device functions excluded), by a unique name;
    variants get one name each, e.g. ``"verify_tok1_src2"``. A kernel bound to
    a module-level name must also appear here.
``SIGNATURES : dict[str, tuple[str, ...]]``
    Same keys as ``KERNELS``: the Numba signature strings each kernel is
    compiled for, e.g. ``"void(int64[:, ::1], int64[::1], int32[::1], int64)"``.
    Array arguments are declared C-contiguous (``[::1]``, ``[:, ::1]``) with the
    dtype the launch glue passes (it may pass a reinterpreting view, e.g. the
    uint8 canary buffer as ``int64[:, ::1]``); Python ints are ``int64``.

The launch glue compiles exactly these signatures (``launch._device.compile_kernel``)
and checks launch arguments against them (every launch under the simulator,
the first one of each kernel on a GPU), so a type drift fails in CPU tests
instead of passing a mistyped argument to a compiled kernel.
``tests/test_ptx.py`` compiles every declared signature for sm_90 (without the
simulator), here and in ``fast/kernels/``, and fails on any kernel without one.

Simulator differences (``ON_SIMULATOR``): the simulator lacks warp shuffles /
votes and inline PTX, so modules pick a shared-memory or plain-Python fallback
at import time; shared-array sizes may be smaller (simulated threads are slow).
"""

from __future__ import annotations

from numba import config as _numba_config

__all__ = ["ON_SIMULATOR", "is_kernel"]

#: True when Numba's CUDA simulator is active (fixed at import, as Numba does).
ON_SIMULATOR: bool = bool(_numba_config.ENABLE_CUDASIM)


def is_kernel(obj) -> bool:
    """True for a ``@cuda.jit`` kernel (not a device function), real or simulated."""
    if hasattr(obj, "_device") and hasattr(obj, "fn"):  # simulator FakeCUDAKernel
        return not obj._device
    targetoptions = getattr(obj, "targetoptions", None)
    if isinstance(targetoptions, dict) and hasattr(obj, "py_func"):
        return not targetoptions.get("device", False)
    return False
