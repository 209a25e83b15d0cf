"""CUDA launch glue of the status publish (kernel: :mod:`kvcanary_numba.kernels.publish`).

Used by the monitor's mapped readback (:mod:`kvcanary_numba.monitor.mapped`): one
packed launch per step, made once here with every argument persistent (the status
block, the mapped host buffer, the publish counter), so a step issues it as one
compiled driver call (:class:`~.table.LaunchTable`).
"""

from __future__ import annotations

import numpy as np

from ..kernels import publish as kernels
from . import _common as common
from .prepared import PreparedLaunch
from .table import LaunchTable

__all__ = ["StatusPublisher"]

_SIG = kernels.SIGNATURES["publish_status"][0]


class _DeviceSide:
    """The device view of pinned host memory. Under unified addressing (every 64-bit CUDA
    process) memory from ``cudaHostAlloc`` is mapped into every device at its host address."""

    def __init__(self, host: np.ndarray):
        self.host = host  # keeps the memory alive as long as the view
        self.__cuda_array_interface__ = {"shape": host.shape, "typestr": host.dtype.str, "strides": None,
                                         "data": (host.ctypes.data, False), "version": 3}  # fmt: skip


class StatusPublisher:
    """The publish launch of one status block.

    Parameters
    ----------
    words : int64[n] CUDA array (NumPy under the simulator: the buffers are NumPy too)
        The status block (:class:`~kvcanary_numba.monitor.status.StatusBlock` ``.words``).

    Attributes
    ----------
    host : numpy.ndarray, int64[n + 1]
        What the kernel writes: ``host[0]`` the sequence number of the newest publish
        (negative while it is written), ``host[1:]`` the words (pinned host memory on a GPU).
    published : int64[1] CUDA array (NumPy under the simulator)
        How many publishes have run; the kernel numbers the next one from it.
    """

    def __init__(self, words):
        n = int(words.shape[0])
        if isinstance(words, np.ndarray):  # the simulator (or a test's launch layer) writes NumPy memory itself
            self.host = np.zeros(n + 1, dtype=np.int64)
            self.published = np.zeros(1, dtype=np.int64)
            device_side = self.host
        else:
            import cupy
            import cupyx

            self.host = cupyx.zeros_pinned(n + 1, dtype=np.int64)
            self.published = cupy.zeros(1, dtype=np.int64)
            device_side = _DeviceSide(self.host)
        args = common.persistent_views(words, device_side, self.published)
        self._table = LaunchTable([PreparedLaunch(kernels.publish_status, _SIG, 1, kernels.PUBLISH_THREADS, args)])

    def launch(self, stream: int | None = None) -> None:
        """Queue one publish on ``stream`` (a handle; default: CuPy's current stream)."""
        self._table.launch(stream)
