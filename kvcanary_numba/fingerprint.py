"""Real-KV fingerprints: the public ``compute_real_kv_hash`` and the source checks every launch shares."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _memo, _overlap
from ._arrays import ArrayInfo, check_array, check_int, inspect_array
from ._backend import resolve_backend
from .constants import MAX_REAL_KV_SOURCES, RealKvHashMode
from .context import RealKvSource
from .errors import error

__all__ = ["compute_real_kv_hash"]

_FUNCTION = "compute_real_kv_hash"


def check_real_kv_sources(
    function: str, real_kv_sources: Any, real_kv_hash_mode: Any, *, num_slots: int | None = None,
    slots_of: str = "num_slots",
) -> tuple[RealKvHashMode, list[tuple[str, ArrayInfo]]]:
    """Launch-time checks of a source tuple and its mode (shared by verify, write and fingerprint).

    The geometry of each source was checked when the :class:`RealKvSource`
    was built; this adds what depends on the launch.

    Parameters
    ----------
    function : str
        Public function named in error messages.
    real_kv_sources : tuple or list of RealKvSource
        At most ``MAX_REAL_KV_SOURCES`` (KVC-R008) RealKvSource objects (KVC-R009).
    real_kv_hash_mode : RealKvHashMode or int
        A member of RealKvHashMode (KVC-C011).
    num_slots : int, optional
        Canary slots the launch may fingerprint; every source must cover them
        (``rows * page_size >= num_slots``, KVC-R007).
    slots_of : str
        What ``num_slots`` was read from, as the KVC-R007 message names it.

    Returns
    -------
    mode : RealKvHashMode
    arrays : list of (name, ArrayInfo)
        The source tensors, to add to the call's backend/device resolution
        (so a source on another device raises KVC-C007).

    Raises
    ------
    KvCanaryError
        KVC-R007, KVC-R008, KVC-R009, KVC-C011, KVC-C001.
    """
    if not isinstance(real_kv_sources, (tuple, list)):
        raise error("KVC-R009", function=function, argument="real_kv_sources", got=type(real_kv_sources).__name__)
    if len(real_kv_sources) > MAX_REAL_KV_SOURCES:
        raise error("KVC-R008", function=function, expected=MAX_REAL_KV_SOURCES, got=len(real_kv_sources))
    arrays = []
    for index, source in enumerate(real_kv_sources):
        name = f"real_kv_sources[{index}]"
        if not isinstance(source, RealKvSource):
            raise error("KVC-R009", function=function, argument=name, got=type(source).__name__)
        if num_slots is not None and source.slots_covered < num_slots:
            raise error(
                "KVC-R007",
                function=function,
                index=index,
                rows=source.rows,
                page_size=source.page_size,
                got=source.slots_covered,
                needed=num_slots,
                slots_of=slots_of,
            )
        arrays.append((f"{name}.tensor", inspect_array(function, f"{name}.tensor", source.tensor)))
    mode = check_int(function, "real_kv_hash_mode", real_kv_hash_mode, low=0, high=len(RealKvHashMode) - 1)
    return RealKvHashMode(mode), arrays


#: Snapshots of calls that passed validation (see :mod:`kvcanary_numba._memo`).
_MEMO = _memo.Memo()


def compute_real_kv_hash(*, real_kv_sources, real_kv_hash_mode, slot_indices, out, backend: str = "auto",
                         stream=None) -> None:
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
    kwargs = dict(real_kv_sources=real_kv_sources, real_kv_hash_mode=real_kv_hash_mode, slot_indices=slot_indices,
                  out=out)
    _memo.run_validated(_FUNCTION, "fingerprint", _MEMO, _validate, kwargs, backend, stream,
                        {"real_kv_hash_mode": lambda mode: RealKvHashMode(int(mode))})


def _validate(*, real_kv_sources, real_kv_hash_mode, slot_indices, out, backend) -> tuple[str, _overlap.Recheck | None]:
    _, arrays = check_real_kv_sources(_FUNCTION, real_kv_sources, real_kv_hash_mode)
    slots = check_array(_FUNCTION, "slot_indices", slot_indices, dtype=np.int64, ndim=1)
    out_info = check_array(_FUNCTION, "out", out, dtype=np.int64, ndim=1, shape=slots.shape, writeable=True)
    arrays = [("slot_indices", slots), ("out", out_info), *arrays]
    return _overlap.check(_FUNCTION, resolve_backend(_FUNCTION, backend, arrays), arrays)
