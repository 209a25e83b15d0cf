"""Launch glue of the standalone fingerprint kernel (:mod:`kvcanary_numba.kernels.fingerprint`)."""

from __future__ import annotations

import numpy as np

from ..kernels import fingerprint as kernels
from . import _launch as common
from .context import source_args

__all__ = ["compute_real_kv_hash"]

_GPU_BLOCK = 256


def compute_real_kv_hash(*, real_kv_sources, real_kv_hash_mode, slot_indices, out, stream: int | None = None) -> None:
    """Fingerprint ``slot_indices`` into ``out`` on the GPU (or the simulator).

    Parameters
    ----------
    real_kv_sources : tuple of RealKvSource
        Up to 4 validated sources, in fold order.
    real_kv_hash_mode : RealKvHashMode
        NONE writes 0 everywhere without reading any source.
    slot_indices : int64 [n]
        Slots to fingerprint; a slot outside ``[0, min(rows * page_size))``
        gets 0 (nothing is read for it).
    out : int64 [n]
        Receives the ``real_kv_hash`` of each slot (uint64 bits as int64).
    """
    slots = common.kernel_array(slot_indices)
    dest = common.kernel_array(out)
    fallback = common.reinterpret(slot_indices, np.uint64)
    nsrc, spans, params, limit = source_args(real_kv_sources, real_kv_hash_mode, fallback)
    name = f"fingerprint_src{nsrc}"
    n = int(slot_indices.shape[0])
    if n == 0:
        return
    block = common.block_size(_GPU_BLOCK)
    kernel, signature = kernels.KERNELS[name], kernels.SIGNATURES[name][0]
    grid = common.resident_grid(kernel, signature, n, block)
    common.launch(kernel, signature, grid, block, (slots, dest, limit, *spans, params), stream)
