"""``kvcanary doctor``: which backends work here, and why a GPU path does not.

:func:`probe_cuda` asks the installed packages and the CUDA driver (through libcuda
alone: nothing is initialised on a machine without one); :func:`gpu_path_reasons`
turns the answers into the reasons the GPU path is unavailable, each with what to
install; :func:`report` prints both as the doctor's table.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import platform
import re
import sys
from importlib import metadata

from . import __version__
from ._runtime import NUMBA_CUDA_NUMPY_LIMIT as _NUMBA_CUDA_NUMPY_LIMIT, gpu_available

__all__ = [
    "NUMBA_CUDA_NUMPY_LIMIT",
    "REASON_KINDS",
    "CudaProbe",
    "Reason",
    "gpu_path_reasons",
    "probe_cuda",
    "report",
    "suggested_extra",
]

#: First NumPy release numba-cuda 0.30 does not import on (``_runtime.NUMBA_CUDA_NUMPY_LIMIT``).
#: Doctor imports numba-cuda's NumPy array overloads (``numba.cuda.np.arrayobj``: loaded by the
#: first kernel compile, not by ``import numba.cuda``, and the module that fails there) to find out.
NUMBA_CUDA_NUMPY_LIMIT = _NUMBA_CUDA_NUMPY_LIMIT

#: Kinds of reason the GPU path is unavailable, in the order doctor reports them.
REASON_KINDS = (
    "no-numba-cuda",
    "numpy-too-new",
    "numba-cuda-broken",
    "no-cupy",
    "cupy-broken",
    "no-driver",
    "driver-error",
    "no-gpu",
    "driver-too-old",
    "runtime-mismatch",
    "no-runtime",
    "simulator",
)

#: ``cuInit``'s result on a machine whose driver sees no CUDA device (CUDA_ERROR_NO_DEVICE).
_CUDA_ERROR_NO_DEVICE = 100


@dataclasses.dataclass(frozen=True)
class CudaProbe:
    """What ``kvcanary doctor`` found, as plain values (``probe_cuda`` reads them; tests build their own).

    Versions are strings as the packages report them; ``None`` means not installed (or, for
    ``driver``, no driver library). ``runtimes`` holds one ``(source, "major.minor")`` pair per
    package that reported a CUDA runtime version.
    """

    numpy: str
    numba_cuda: str | None = None  #: numba-cuda's version, when the package is installed
    numba_cuda_error: str | None = None  #: why ``import numba.cuda`` failed, when it did
    cupy: str | None = None  #: CuPy's version (cupy-cuda13x, cupy-cuda12x or cupy)
    cupy_error: str | None = None  #: why ``import cupy`` failed, when it did
    runtimes: tuple[tuple[str, str], ...] = ()
    driver: str | None = None  #: CUDA version the driver supports, "major.minor"
    driver_error: str | None = None  #: why the driver could not be asked (or answered an error)
    devices: tuple[str, ...] = ()  #: one description per CUDA device the driver sees
    simulator: bool = False


@dataclasses.dataclass(frozen=True)
class Reason:
    """Why the GPU path is unavailable: a stable ``kind`` (one of ``REASON_KINDS``) and the text shown."""

    kind: str
    text: str


def _release(version: str) -> tuple[int, int]:
    """``"2.5.0rc1"`` -> ``(2, 5)``; ``(0, 0)`` when it does not start with two numbers."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def _cuda_version(encoded: int) -> str:
    """CUDA's version integer (``13050``) as ``"13.5"``."""
    return f"{encoded // 1000}.{encoded % 1000 // 10}"


def suggested_extra(probe: CudaProbe) -> str:
    """The extra to install: ``gpu-cu12`` for a CUDA 12 driver, or where every runtime found is CUDA 12
    (the missing part joins the CUDA 12 stack already there, which newer drivers also run); else ``gpu``."""
    if probe.driver is not None and _release(probe.driver)[0] == 12:
        return "gpu-cu12"
    majors = {_release(version)[0] for _, version in probe.runtimes}
    return "gpu-cu12" if majors == {12} else "gpu"


def gpu_path_reasons(probe: CudaProbe) -> list[Reason]:
    """Every reason the Numba-CUDA kernels cannot run on CuPy arrays here; empty when they can.

    Pure host logic over ``probe``: what is installed, what imported, what the driver said.
    """
    from ._runtime import NO_NUMBA_CUDA

    extra = suggested_extra(probe)
    install = f"pip install 'kvcanary_numba[{extra}]'"
    reasons: list[Reason] = []
    if probe.numba_cuda is None:
        cu12 = f"; this driver runs CUDA {probe.driver}: {install}" if extra == "gpu-cu12" else ""
        reasons.append(Reason("no-numba-cuda", NO_NUMBA_CUDA + cu12))
    elif probe.numba_cuda_error is not None:
        if _release(probe.numpy) >= NUMBA_CUDA_NUMPY_LIMIT:
            text = (
                f"numba-cuda {probe.numba_cuda} does not import on NumPy {probe.numpy} ({probe.numba_cuda_error}):"
                f" the kernels need numpy<2.5, which the gpu extras pin ({install})"
            )
            reasons.append(Reason("numpy-too-new", text))
        else:
            reasons.append(
                Reason("numba-cuda-broken", f"numba-cuda {probe.numba_cuda} fails to import: {probe.numba_cuda_error}")
            )
    if probe.cupy is None:
        reasons.append(Reason("no-cupy", f"CuPy is not installed (the GPU path allocates with it): {install}"))
    elif probe.cupy_error is not None:
        reasons.append(Reason("cupy-broken", f"CuPy {probe.cupy} fails to import: {probe.cupy_error}"))
    if probe.driver is None:
        reasons.append(Reason("no-driver", probe.driver_error or "no NVIDIA driver found"))
    elif probe.driver_error is not None:
        reasons.append(Reason("driver-error", probe.driver_error))
    elif not probe.devices:
        reasons.append(Reason("no-gpu", f"the driver (CUDA {probe.driver}) sees no CUDA device"))
    if probe.driver is not None:
        driver_major = _release(probe.driver)[0]
        newer = [(source, version) for source, version in probe.runtimes if _release(version)[0] > driver_major]
        if newer:
            found = ", ".join(f"CUDA {version} from {source}" for source, version in newer)
            fix = f"update the driver or {install}" if extra == "gpu-cu12" else "update the driver"
            reasons.append(
                Reason("driver-too-old", f"the driver supports CUDA {probe.driver}, older than {found}: {fix}")
            )
    if len({_release(version)[0] for _, version in probe.runtimes}) > 1:
        found = ", ".join(f"CUDA {version} from {source}" for source, version in probe.runtimes)
        reasons.append(
            Reason(
                "runtime-mismatch",
                f"two CUDA major versions are installed ({found}): keep one extra, gpu (CUDA 13) or gpu-cu12 (CUDA 12)",
            )
        )
    if probe.numba_cuda is not None and probe.numba_cuda_error is None and not probe.runtimes and not probe.simulator:
        reasons.append(Reason("no-runtime", "no CUDA runtime answered (cuda-bindings, numba-cuda, CuPy)"))
    if probe.simulator:
        reasons.append(
            Reason(
                "simulator",
                "NUMBA_ENABLE_CUDASIM=1: numba.cuda is the CUDA simulator in this "
                "process (the kernels run on NumPy arrays)",
            )
        )
    return reasons


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _failure(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


def _probe_driver() -> tuple[str | None, str | None, tuple[str, ...]]:
    """(CUDA version the driver supports, why it could not be asked, devices) through libcuda alone.

    Loads the driver library with ctypes: no CUDA package, no context, nothing initialised on a
    machine without a driver; ``cuInit`` only runs once the driver answered its version.
    """
    import ctypes

    names = ("nvcuda.dll",) if sys.platform == "win32" else ("libcuda.so.1", "libcuda.so")
    lib = None
    for name in names:
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    if lib is None:
        return None, f"no NVIDIA driver: {names[0]} is not on the library path", ()
    value = ctypes.c_int(0)
    if (rc := lib.cuDriverGetVersion(ctypes.byref(value))) != 0:
        return None, f"the NVIDIA driver library did not report its version (CUresult {rc})", ()
    driver = _cuda_version(value.value)
    if (rc := lib.cuInit(0)) == _CUDA_ERROR_NO_DEVICE:
        return driver, None, ()
    if rc != 0:
        return driver, f"the driver (CUDA {driver}) failed to initialise: cuInit returned CUresult {rc}", ()
    count = ctypes.c_int(0)
    if (rc := lib.cuDeviceGetCount(ctypes.byref(count))) != 0:
        return driver, f"the driver (CUDA {driver}) failed to count devices: CUresult {rc}", ()
    devices = []
    for index in range(count.value):
        device, major, minor = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0)
        name = ctypes.create_string_buffer(256)
        lib.cuDeviceGet(ctypes.byref(device), index)
        lib.cuDeviceGetName(name, len(name), device)
        lib.cuDeviceGetAttribute(ctypes.byref(major), 75, device)  # COMPUTE_CAPABILITY_MAJOR
        lib.cuDeviceGetAttribute(ctypes.byref(minor), 76, device)  # COMPUTE_CAPABILITY_MINOR
        devices.append(f"{name.value.decode(errors='replace')} (compute capability {major.value}.{minor.value})")
    return driver, None, tuple(devices)


def probe_cuda() -> CudaProbe:
    """Read what ``gpu_path_reasons`` needs from this process's packages and driver.

    Imports numba.cuda only when numba-cuda is installed (never numba's own CUDA target) and
    asks each CUDA package for the runtime version it carries, which needs no GPU.
    """
    from ._runtime import NO_NUMBA_CUDA, kernels_unavailable, simulator_enabled

    simulator = simulator_enabled()
    # Installed (the version), whatever NumPy it would run on: the import below tells the rest.
    numba_cuda = (_version("numba-cuda") or "unknown version") if kernels_unavailable() != NO_NUMBA_CUDA else None
    numba_cuda_error, runtimes = None, []
    with contextlib.suppress(Exception):  # not installed, or no runtime library: no answer from this source
        from cuda.bindings import runtime as cudart

        err, value = cudart.cudaRuntimeGetVersion()
        if int(err) == 0:
            runtimes.append((f"cuda-bindings {_version('cuda-bindings')}", _cuda_version(value)))
    if numba_cuda is not None:
        try:
            import numba.cuda.np.arrayobj  # noqa: F401 - what the first kernel compile loads (fails on NumPy 2.5)
            from numba import cuda

        except Exception as exc:  # noqa: BLE001 - e.g. numba-cuda 0.30 on NumPy 2.5
            numba_cuda_error = _failure(exc)
        else:
            if not simulator:  # the simulator's runtime is a stand-in
                with contextlib.suppress(Exception):
                    major, minor = cuda.runtime.get_version()
                    runtimes.append((f"numba-cuda {numba_cuda}", f"{major}.{minor}"))
    cupy_version = next((v for d in ("cupy-cuda13x", "cupy-cuda12x", "cupy") if (v := _version(d))), None)
    cupy_error = None
    if cupy_version is not None:
        try:
            import cupy
        except Exception as exc:  # noqa: BLE001 - e.g. its CUDA libraries are missing
            cupy_error = _failure(exc)
        else:
            with contextlib.suppress(Exception):
                runtimes.append((f"CuPy {cupy_version}", _cuda_version(cupy.cuda.runtime.runtimeGetVersion())))
    driver, driver_error, devices = _probe_driver()
    return CudaProbe(
        numpy=_version("numpy") or "unknown",
        numba_cuda=numba_cuda,
        numba_cuda_error=numba_cuda_error,
        cupy=cupy_version,
        cupy_error=cupy_error,
        runtimes=tuple(runtimes),
        driver=driver,
        driver_error=driver_error,
        devices=devices,
        simulator=simulator,
    )


def _runtime_row(probe: CudaProbe) -> str:
    if not probe.runtimes:
        return "none found (asked cuda-bindings, numba-cuda and CuPy: none importable)"
    by_version: dict[str, list[str]] = {}
    for source, version in probe.runtimes:
        by_version.setdefault(version, []).append(source)
    return "; ".join(f"{version} (from {', '.join(sources)})" for version, sources in by_version.items())


def _driver_row(probe: CudaProbe) -> str:
    if probe.driver is None:
        return f"none ({probe.driver_error})" if probe.driver_error else "none"
    return f"supports CUDA {probe.driver}" + (f"; {probe.driver_error}" if probe.driver_error else "")


def report() -> int:
    """Print doctor's table (``kvcanary doctor``); returns the exit status."""
    probe = probe_cuda()
    reasons = gpu_path_reasons(probe)
    gpu = f"{probe.devices[0]}, {len(probe.devices)} device(s)" if probe.devices else "none visible"
    rows = [
        ("kvcanary_numba", __version__),
        ("python", f"{platform.python_version()} ({sys.executable})"),
        ("numpy", probe.numpy),
        ("numba", _version("numba") or "not installed"),
        ("numba-cuda", probe.numba_cuda or "not installed (CPU path only; the kernels need a gpu extra)"),
        ("cupy", probe.cupy or "not installed"),
        ("CUDA runtime", _runtime_row(probe)),
        ("CUDA driver", _driver_row(probe)),
        ("GPU", gpu),
        (
            "CUDA simulator",
            (
                f"{'on' if probe.simulator else 'off'} "
                f"(NUMBA_ENABLE_CUDASIM={os.environ.get('NUMBA_ENABLE_CUDASIM', 'unset')})"
            ),
        ),
        ("CPU path", "NumPy references (device='cpu', backend='numpy')"),
        ("GPU path", f"unavailable: {reasons[0].text}" if reasons else "Numba-CUDA kernels on CuPy arrays"),
        *(("", f"and: {reason.text}") for reason in reasons[1:]),
        ("demo default", "cuda" if probe.devices and gpu_available() else "cpu"),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    return 0
