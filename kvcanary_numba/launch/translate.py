"""CUDA launch glue of the slot translation (kernel: :mod:`kvcanary_numba.kernels.translate`).

Called by the monitor (``monitor/launches.py``) for each SWA group, with arrays its
batch checks already validated: the LUT (long-lived: a persistent view), the
step's FULL slots and the group's scratch view of as many entries (per-step
roles when the launch is recorded into the prepared HEAD phase). One launch
instead of :func:`~kvcanary_numba.monitor.groups.translate_slots`'s six CuPy operations.
"""

from __future__ import annotations

from ..kernels import translate as kernels
from . import _common as common

__all__ = ["TRANSLATE_BLOCK", "translate_slots"]

#: Threads per block on a GPU.
TRANSLATE_BLOCK = 256

_SIG = kernels.SIGNATURES["translate"][0]


def translate_slots(*, lut, index, out) -> None:
    """``out[i]`` = ``index[i]`` translated through ``lut`` (the kernel module's rules); int64 arrays,
    ``out`` as long as ``index``. Nothing is launched for an empty ``index``."""
    n = int(index.shape[0])
    if n == 0:
        return
    block = common.block_size(TRANSLATE_BLOCK)
    grid = common.persistent_grid(n, block)
    common.launch(kernels.translate_kernel, _SIG, grid, block,
                  (common.kernel_array(lut, persistent=True), common.kernel_array(index), common.kernel_array(out)))
