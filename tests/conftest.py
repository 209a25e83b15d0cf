"""Test configuration: picks the kernel tier before numba is imported.

Without a GPU the kernel tests run under Numba's CUDA simulator; with one, the
same tests run on the GPU (set NUMBA_ENABLE_CUDASIM yourself to override).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess


def _nvidia_gpu_present() -> bool:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        return subprocess.run([smi, "-L"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "0" if _nvidia_gpu_present() else "1")

# pytest imports numba before this file (to resolve the NumbaPerformanceWarning
# filter in pyproject), so numba's config has already read the environment:
# re-read it. numba.cuda itself is not imported yet, so the switch takes effect.
from numba.core import config as _numba_config  # noqa: E402

_numba_config.reload_config()

import numpy as np  # noqa: E402
import pytest  # noqa: E402


def _cupy_gpu() -> tuple[bool, str]:
    """Whether CuPy reaches a GPU, and if not, why (shown in every GPU test's skip reason)."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return False, "the CUDA simulator is on"
    try:
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - any failure means no usable GPU; its reason goes in the skip
        said = next((line.strip() for line in str(exc).splitlines() if any(c.isalpha() for c in line)), "")
        return False, f"{type(exc).__name__}: {said}"
    return count > 0, f"{count} CUDA devices"


HAS_GPU, _NO_GPU_REASON = _cupy_gpu()
SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason=f"needs a CUDA GPU with CuPy (not simulated): {_NO_GPU_REASON}")
    skip_kernels = pytest.mark.skip(reason=f"needs a GPU or NUMBA_ENABLE_CUDASIM=1: {_NO_GPU_REASON}")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(skip_gpu)
        if "simulator" in item.keywords and not (SIMULATOR or HAS_GPU):
            item.add_marker(skip_kernels)


@pytest.fixture(scope="session")
def vectors_dir() -> pathlib.Path:
    """Folder of SGLang's golden vectors: ``$KVCANARY_VECTORS`` if set, else ``tests/data/vectors``.

    The same folder ``tests/test_vectors.py`` parametrizes from (``vectors.vectors_folder``).
    Tests needing it skip when it is missing; ``test_vector_parametrization_is_the_folder_read``
    then fails (a ``KVCANARY_VECTORS`` naming a missing folder is a misconfigured run).
    """
    from vectors import ENV, vectors_folder

    path = vectors_folder()
    if not path.is_dir():
        pytest.skip(f"golden vectors not found at {path} (${ENV} names another folder)")
    return path


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)


@pytest.fixture(params=["serial", "tiled"])
def write_path(request, monkeypatch) -> str:
    """The public write's kernel path: ``serial`` (one warp per request, its own chain) or
    ``tiled`` (``chain_publish`` then ``write_tiled``), forced through the threshold of
    ``launch.chain.own_tiled`` whatever the write's length (part of the replay key, so a
    replayed call takes it too)."""
    from kvcanary_numba.fast import chain

    monkeypatch.setattr(chain, "OWN_TILED_MIN_TOKENS", 1 << 62 if request.param == "serial" else 0)
    return request.param
