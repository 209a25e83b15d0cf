"""Device chain hashing: splitmix64 finalizer, mix3 and the slot hash.

The same arithmetic as :mod:`kvcanary_numba.hashing` on uint64 scalars. Every
operand is an explicit ``uint64`` (module constants are ``numpy.uint64``):
mixing signed and unsigned 64-bit ints would make Numba promote to float64,
and the simulator computes ``uint64 + int64`` in float64 too.

The canary buffer is passed to kernels as ``int64[:, ::1]`` with shape
``[num_slots, stride // 8]``; fields are (token, position, prev_hash,
real_kv_hash) at columns 0..3.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, int64, uint64

from ..constants import (
    CANARY_CHAIN_HEAD,
    FIELD_POSITION,
    FIELD_PREV_HASH,
    FIELD_REAL_KV_HASH,
    FIELD_TOKEN,
    SPLITMIX64_MUL1,
    SPLITMIX64_MUL2,
)

__all__ = [
    "CHAIN_HEAD",
    "MINUS_ONE",
    "ONE",
    "POSITION",
    "PREV_HASH",
    "REAL_KV",
    "TOKEN",
    "ZERO",
    "mix3",
    "slot_hash",
    "splitmix64",
]

CHAIN_HEAD = np.uint64(CANARY_CHAIN_HEAD)
_MUL1 = np.uint64(SPLITMIX64_MUL1)
_MUL2 = np.uint64(SPLITMIX64_MUL2)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
#: Record columns and small constants as int64, so device index arithmetic stays int64.
TOKEN = np.int64(FIELD_TOKEN)
POSITION = np.int64(FIELD_POSITION)
PREV_HASH = np.int64(FIELD_PREV_HASH)
REAL_KV = np.int64(FIELD_REAL_KV_HASH)
ZERO = np.int64(0)
ONE = np.int64(1)
MINUS_ONE = np.int64(-1)


@cuda.jit(device=True)
def splitmix64(x):
    """SplitMix64 finalizer of uint64 ``x`` (no increment); uint64 result."""
    x = x ^ (x >> _S30)
    x = x * _MUL1
    x = x ^ (x >> _S27)
    x = x * _MUL2
    return x ^ (x >> _S31)


@cuda.jit(device=True)
def mix3(a, b, c):
    """``S(S(S(a) ^ b) ^ c)`` of uint64 ``a`` (prev hash), ``b`` (token), ``c`` (position)."""
    return splitmix64(splitmix64(splitmix64(a) ^ b) ^ c)


@cuda.jit(device=True)
def slot_hash(buf, slot):
    """Chain hash of the record at in-range ``slot`` of ``buf`` (int64 [num_slots, stride // 8])."""
    s = int64(slot)
    return mix3(uint64(buf[s, PREV_HASH]), uint64(buf[s, TOKEN]), uint64(buf[s, POSITION]))
