"""Which backend runs a call: the kind and device of its arrays, the ``backend`` argument, the
packages installed.

``backend="cuda"`` runs the ``@cuda.jit`` kernels, which need the numba-cuda package: without
it ``numba.cuda`` is numba's own deprecated CUDA target, whose simulator swaps the module
under running simulated threads (a thread leaving a device function restores the real module
for every other thread of the block) and which this package was never tested on.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import TYPE_CHECKING, Iterable, Literal

import numpy as np

from .errors import error

if TYPE_CHECKING:
    from ._arrays import ArrayInfo

__all__ = ["BACKEND_NAMES", "DEVICE_NAMES", "array_module", "gpu_available", "kernels_available",
           "resolve_backend", "simulator_enabled"]  # fmt: skip

Backend = Literal["numpy", "cuda"]
BACKEND_NAMES = ("auto", "numpy", "cuda")
DEVICE_NAMES = ("cpu", "cuda")

#: Why the kernels cannot run without numba-cuda (KVC-C008's reason).
NO_NUMBA_CUDA = ("the kernels need the numba-cuda package (pip install 'kvcanary_numba[gpu]'); numba's own "
                 "numba.cuda target is not supported")  # fmt: skip


@functools.cache
def kernels_available() -> bool:
    """True when the numba-cuda package is installed (it provides ``numba.cuda`` for the kernels)."""
    try:
        return importlib.util.find_spec("numba_cuda") is not None
    except ImportError:  # a finder that refuses the name outright
        return False


def simulator_enabled() -> bool:
    """True when Numba's CUDA simulator is switched on for this process."""
    from numba import config

    return bool(config.ENABLE_CUDASIM) or os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


def resolve_backend(
    function: str, backend: str, arrays: Iterable[tuple[str, ArrayInfo]]
) -> Backend:
    """Pick the backend of one call from its arrays and the ``backend`` argument.

    All arrays must be of one kind (and, for CUDA, one device): KVC-C007.
    ``backend`` is ``"auto"`` (follow the arrays), ``"numpy"`` (NumPy
    references) or ``"cuda"`` (Numba-CUDA kernels; NumPy arrays only under the
    simulator): KVC-C009 / KVC-C008. The kernels need numba-cuda (KVC-C008).
    """
    if backend not in BACKEND_NAMES:
        raise error("KVC-C009", function=function, argument="backend", expected=BACKEND_NAMES, got=backend)
    first_name, first, device_name, device = None, None, None, None
    for name, info in arrays:
        if first is None:
            first_name, first = name, info
        elif info.kind != first.kind:
            raise error("KVC-C007", function=function, argument=name, got=_where(info), reference=first_name,
                        expected=_where(first))  # fmt: skip
        if info.device is None:  # NumPy, or a CUDA array whose device is unknown (empty): fits any
            continue
        if device is None:
            device_name, device = name, info
        elif info.device != device.device:
            raise error("KVC-C007", function=function, argument=name, got=_where(info), reference=device_name,
                        expected=_where(device))  # fmt: skip
    kind: Backend = "numpy" if first is None else first.kind
    if backend == "numpy" and kind == "cuda":
        raise error("KVC-C008", function=function, argument="backend", got=backend, reason="the arrays are CUDA arrays")
    if backend == "cuda" and kind == "numpy" and not simulator_enabled():
        reason = "NumPy arrays run the kernels only under NUMBA_ENABLE_CUDASIM=1"
        raise error("KVC-C008", function=function, argument="backend", got=backend, reason=reason)
    chosen: Backend = kind if backend == "auto" else backend  # type: ignore[assignment]
    if chosen == "cuda" and not kernels_available():
        raise error("KVC-C008", function=function, argument="backend", got=backend, reason=NO_NUMBA_CUDA)
    return chosen


def _where(info: ArrayInfo) -> str:
    return info.kind if info.device is None else f"{info.kind}:{info.device}"


def array_module(function: str, device: str):
    """NumPy for ``device="cpu"``, CuPy for ``device="cuda"`` (KVC-C009 / KVC-C008)."""
    if device not in DEVICE_NAMES:
        raise error("KVC-C009", function=function, argument="device", expected=DEVICE_NAMES, got=device)
    if device == "cpu":
        return np
    try:
        import cupy
    except ImportError as exc:
        raise error(
            "KVC-C008", function=function, argument="device", got=device, reason=f"CuPy is not installed ({exc})"
        ) from None
    if not gpu_available():
        raise error("KVC-C008", function=function, argument="device", got=device, reason="no CUDA GPU is visible")
    if not kernels_available():  # CUDA buffers are only ever used by the kernels
        raise error("KVC-C008", function=function, argument="device", got=device, reason=NO_NUMBA_CUDA)
    return cupy


def gpu_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - any failure means "no usable GPU"
        return False
