"""SplitMix64 on whole NumPy arrays, in plain NumPy.

:func:`kvcanary_numba.hashing.splitmix64` is the scalar definition on Python
ints; :func:`splitmix64_words` is the same arithmetic element-wise on
``uint64`` arrays, for the vectorised part of the specification (the real-KV
fold). ``hashing.splitmix64_array`` runs a Numba-compiled loop (it serves the
CPU path); the specification stays free of compiled code, so it spells the
finalizer out here.

``uint64`` array arithmetic wraps modulo 2**64, which is the arithmetic we want.
"""

from __future__ import annotations

import numpy as np

from ..constants import SPLITMIX64_MUL1, SPLITMIX64_MUL2

__all__ = ["splitmix64_words"]

_MUL1 = np.uint64(SPLITMIX64_MUL1)
_MUL2 = np.uint64(SPLITMIX64_MUL2)
_S27, _S30, _S31 = np.uint64(27), np.uint64(30), np.uint64(31)


def splitmix64_words(x: np.ndarray) -> np.ndarray:
    """Element-wise SplitMix64 finalizer (no golden-ratio increment).

    Parameters
    ----------
    x : numpy.ndarray of uint64, any shape

    Returns
    -------
    numpy.ndarray of uint64, the same shape (a new array)
    """
    h = np.array(x, dtype=np.uint64)  # a copy: the steps below work in place
    with np.errstate(over="ignore"):  # the multiplications wrap on purpose
        h ^= h >> _S30
        h *= _MUL1
        h ^= h >> _S27
        h *= _MUL2
        h ^= h >> _S31
    return h
