"""The fingerprint operation: ``compute_real_kv_hash``, the real-KV hash of given slots as write stores it.

:func:`validate` checks (the source checks every launch shares are
:func:`kvcanary_numba.context.check_real_kv_sources`), :func:`run` dispatches with one
explicit ``if`` to the NumPy specification (:mod:`kvcanary_numba.reference.fingerprint`) or
the launch glue (:mod:`kvcanary_numba.launch.fingerprint`); the package's top level exports
the same function wrapped by the fast wing (``kvcanary_numba/fast/calls.py``).
"""

from __future__ import annotations

import numpy as np

from . import _overlap
from ._runtime import CUDA_IMPORTS
from ._validate import as_native, check_array, resolve_backend, stream_handle
from .constants import RealKvHashMode
from .context import check_real_kv_sources
from .reference import fingerprint as reference

__all__ = ["compute_real_kv_hash", "run", "validate"]

FUNCTION = "compute_real_kv_hash"


def validate(*, real_kv_sources, real_kv_hash_mode, slot_indices, out, backend: str = "auto") -> tuple[str, list]:
    """Every check of a fingerprint call; returns (backend, every array as (name, ArrayInfo))."""
    _, arrays = check_real_kv_sources(FUNCTION, real_kv_sources, real_kv_hash_mode)
    slots = check_array(FUNCTION, "slot_indices", slot_indices, dtype=np.int64, ndim=1)
    out_info = check_array(FUNCTION, "out", out, dtype=np.int64, ndim=1, shape=slots.shape, writeable=True)
    arrays = [("slot_indices", slots), ("out", out_info), *arrays]
    chosen = resolve_backend(FUNCTION, backend, arrays)
    _overlap.check(FUNCTION, arrays)
    return chosen, arrays


def run(backend: str, *, real_kv_sources, real_kv_hash_mode, slot_indices, out, stream=None) -> None:
    """Run a validated fingerprint call on ``backend``; ``stream`` is a CUDA stream handle or None."""
    mode = RealKvHashMode(int(real_kv_hash_mode))
    if backend == "numpy":
        reference.compute_real_kv_hash(
            real_kv_sources=real_kv_sources, real_kv_hash_mode=mode, slot_indices=slot_indices, out=out
        )
    else:
        with CUDA_IMPORTS:  # needs numba-cuda: imported on the kernel path only, one thread at a time
            from .launch import fingerprint as glue

        glue.compute_real_kv_hash(
            real_kv_sources=real_kv_sources, real_kv_hash_mode=mode, slot_indices=slot_indices, out=out, stream=stream
        )


def compute_real_kv_hash(
    *, real_kv_sources, real_kv_hash_mode, slot_indices, out, backend: str = "auto", stream=None
) -> None:
    """Fingerprint the live KV bytes of some slots, as the write kernel stores them.

    For slot ``s`` each source contributes the fold of its bytes at row
    ``s // page_size``, column ``(s % page_size) * num_bytes_per_token``
    (16 bytes in PARTIAL mode, ``read_bytes`` in ALL mode) as little-endian
    u64 words ``w``, ``acc = splitmix64(acc ^ w)`` from 0; the sources are
    folded the same way in order. NONE mode or no source gives 0 and reads
    nothing.

    Parameters
    ----------
    real_kv_sources : tuple of RealKvSource
        At most 4 sources, on the same backend and device as ``out``.
    real_kv_hash_mode : RealKvHashMode
        NONE, PARTIAL or ALL.
    slot_indices : int64 [n]
        Slots to fingerprint. Values are device data and are not checked on
        the host: a negative slot, or one past ``min(rows * page_size)`` of
        the sources, reads nothing and gives 0.
    out : int64 [n]
        Receives the hashes (uint64 bits stored as int64), written in place.
    backend : {"auto", "numpy", "cuda"}
        ``"auto"`` follows the arrays.
    stream : CUDA stream, int handle or None
        Where the kernel is queued (None: CuPy's current stream).

    Raises
    ------
    KvCanaryError
        KVC-C001 … KVC-C009, KVC-C011, KVC-C013, KVC-C016, KVC-R008, KVC-R009; KVC-C017 (``out``
        sharing memory with ``slot_indices`` or a source).
    """
    handle = stream_handle(FUNCTION, stream)
    kwargs = as_native(
        FUNCTION,
        dict(real_kv_sources=real_kv_sources, real_kv_hash_mode=real_kv_hash_mode, slot_indices=slot_indices, out=out),
    )
    chosen, _ = validate(**kwargs, backend=backend)
    run(chosen, **kwargs, stream=handle)
