"""Host-side chain hashing: splitmix64 finalizer, mix3, and int64/uint64 views.

Three flavours of the same arithmetic: scalar functions on Python ints (the
readable spec, for documentation, tests and single values), ``numba.njit``
scalars on 64-bit integers (for the references' compiled loops) and functions
on NumPy arrays built on them (for the vectorised references). The device
versions live in :mod:`kvcanary_numba.kernels.hashing`. All arithmetic wraps
modulo 2**64.
"""

from __future__ import annotations

import numpy as np

from ._jit import cpu_jit
from .constants import (
    CANARY_CHAIN_ANCHOR,
    SPLITMIX64_MUL1,
    SPLITMIX64_MUL2,
    UINT64_MASK,
)

__all__ = [
    "splitmix64",
    "splitmix64_mix3",
    "chain_head",
    "to_signed",
    "to_unsigned",
    "splitmix64_array",
    "splitmix64_mix3_array",
    "splitmix64_u64",
    "splitmix64_mix3_u64",
]


def to_unsigned(value: int) -> int:
    """Reinterpret a Python int (signed int64 or uint64) as uint64 bits."""
    return int(value) & UINT64_MASK


def to_signed(value: int) -> int:
    """Reinterpret uint64 bits as the signed int64 value stored on device."""
    value = to_unsigned(value)
    return value - (1 << 64) if value >= (1 << 63) else value


def splitmix64(x: int) -> int:
    """SplitMix64 finalizer (no golden-ratio increment) of one 64-bit value.

    Parameters
    ----------
    x : int
        Any int; only its low 64 bits matter (negative ints are two's complement).

    Returns
    -------
    int
        The hash as an unsigned value in ``[0, 2**64)``.
    """
    x = to_unsigned(x)
    x ^= x >> 30
    x = (x * SPLITMIX64_MUL1) & UINT64_MASK
    x ^= x >> 27
    x = (x * SPLITMIX64_MUL2) & UINT64_MASK
    x ^= x >> 31
    return x


def splitmix64_mix3(a: int, b: int, c: int) -> int:
    """``S(S(S(a) ^ b) ^ c)``: the chain step with ``a`` = prev_hash, ``b`` = token, ``c`` = position."""
    h = splitmix64(a)
    h = splitmix64(h ^ to_unsigned(b))
    return splitmix64(h ^ to_unsigned(c))


def chain_head() -> int:
    """The prev_hash of a chain's first slot, ``splitmix64(CANARY_CHAIN_ANCHOR)``."""
    return splitmix64(CANARY_CHAIN_ANCHOR)


_MUL1 = np.uint64(SPLITMIX64_MUL1)
_MUL2 = np.uint64(SPLITMIX64_MUL2)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def splitmix64_array(x: np.ndarray) -> np.ndarray:
    """Element-wise :func:`splitmix64` of an array.

    Parameters
    ----------
    x : numpy.ndarray
        Any integer dtype of 8 bytes (int64 or uint64), any shape.

    Returns
    -------
    numpy.ndarray
        ``uint64`` array of the same shape (a new array).
    """
    h = np.asarray(x).view(np.uint64)
    out = np.empty(h.shape, dtype=np.uint64)
    _splitmix64_loop(h.reshape(-1), out.reshape(-1))  # out is fresh and contiguous: reshape is a view
    return out


@cpu_jit(nogil=True)
def splitmix64_u64(x):
    """:func:`splitmix64` of one 64-bit integer, callable from ``numba.njit`` code (CPU).

    ``x`` is an int64 or uint64 scalar (its bits); returns ``numpy.uint64``.
    """
    h = np.uint64(x)  # a new name: rebinding x to another integer type would make Numba unify to float64
    h ^= h >> _S30
    h *= _MUL1
    h ^= h >> _S27
    h *= _MUL2
    h ^= h >> _S31
    return h


@cpu_jit(nogil=True)
def splitmix64_mix3_u64(a, b, c):
    """:func:`splitmix64_mix3` of three 64-bit integers (their uint64 bits), for ``numba.njit`` code."""
    h = splitmix64_u64(splitmix64_u64(a) ^ np.uint64(b))
    return splitmix64_u64(h ^ np.uint64(c))


@cpu_jit(nogil=True)
def _splitmix64_loop(x, out):
    for i in range(out.shape[0]):
        out[i] = splitmix64_u64(x[i])


@cpu_jit(nogil=True)
def _mix3_loop(a, b, c, out):
    # One fused pass: the NumPy form makes nine full-array temporaries (the CPU verify's hot spot).
    for i in range(out.shape[0]):
        out[i] = splitmix64_mix3_u64(a[i], b[i], c[i])


def splitmix64_mix3_array(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Element-wise :func:`splitmix64_mix3`; inputs are 1-D 8-byte integer arrays of one length.

    Returns a new ``uint64`` array. Compiled with ``numba.njit`` (CPU) on first use;
    equal to ``S(S(S(a) ^ b) ^ c)`` with :func:`splitmix64_array`.
    """
    a, b, c = (np.asarray(v).view(np.uint64) for v in (a, b, c))
    out = np.empty(a.shape[0], dtype=np.uint64)
    _mix3_loop(a, b, c, out)
    return out
