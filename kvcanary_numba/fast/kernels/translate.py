"""Slot translation kernel: FULL slot indices -> SWA slot indices through the group's LUT.

``out[i] = index[i]`` when it is negative (skipped entries stay skipped),
``OUT_OF_RANGE_SLOT`` when it is past the LUT (reported by the kernels that use the
slot, never read), else ``lut[index[i]]``: the rules of
:func:`kvcanary_numba.monitor.groups.translate_slots` (six CuPy operations per call,
which this one launch replaces in the monitor's prepared HEAD phase).
"""

from __future__ import annotations

from numba import cuda, int64

from ...constants import OUT_OF_RANGE_SLOT

#: Explicit signatures (eager compilation and the sm_90 PTX test).
SIGNATURES = {"translate": ("void(int64[::1], int64[::1], int64[::1])",)}

_OUT_OF_RANGE = int64(OUT_OF_RANGE_SLOT)


@cuda.jit
def translate_kernel(lut, index, out):
    """Grid-stride over the entries of ``index`` (``out`` has its length)."""
    entries = int64(index.shape[0])
    size = int64(lut.shape[0])
    for i in range(int64(cuda.grid(1)), entries, int64(cuda.gridsize(1))):
        slot = int64(index[i])
        if slot < 0:
            out[i] = slot
        elif slot >= size:
            out[i] = _OUT_OF_RANGE
        else:
            out[i] = lut[slot]


KERNELS = {"translate": translate_kernel}
