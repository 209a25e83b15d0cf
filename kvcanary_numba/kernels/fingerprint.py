"""Device real-KV fingerprint, shared by verify and write, and a standalone kernel.

A source reaches a kernel as a 1-D ``uint64`` span over its bytes
(:func:`kvcanary_numba.launch._common.byte_span`) plus four int64 parameters,
all in 8-byte words: ``(row_stride, page_size, words_per_token, read_words)``
where ``read_words`` is 2 in PARTIAL mode and ``read_bytes // 8`` in ALL mode.
The parameters of the (up to) four sources travel as one
``UniTuple(int64, 16)``; unused sources get any span and are never read.

Slot ``s`` of a source starts at word
``(s // page_size) * row_stride + (s % page_size) * words_per_token``; its words
are folded ``acc = splitmix64(acc ^ w)`` from 0, read as 16-byte vectors
(lo word, then hi word). Sources fold in order ``acc = splitmix64(acc ^ fold_s)``.
Sources are 16-byte aligned with 16-byte multiples for strides and sizes
(checked by :class:`kvcanary_numba.RealKvSource`), so every vector load is aligned.

Two ways to compute it: :func:`real_kv_hash`, one thread per slot (write, the
standalone kernel), and :func:`warp_real_kv_hash`, a whole warp for its 32
lanes' slots (verify): consecutive slots are folded lane by lane, scattered ones
are staged through shared memory first, so each load covers 4 slots' bytes
instead of touching 32 cache lines.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import cuda, int64, uint64

from ..constants import WARP_SIZE
from . import ON_SIMULATOR
from .hashing import MINUS_ONE, ONE, ZERO, splitmix64

__all__ = [
    "KERNELS",
    "SIGNATURES",
    "TILE_PITCH",
    "TILE_WORDS",
    "fold_source",
    "load_pair",
    "one_vector_each",
    "one_vector_kv_hash",
    "real_kv_hash",
    "slot_base",
    "warp_real_kv_hash",
    "warp_sync",
]

_TWO, _FOUR, _SIX, _EIGHT = np.int64(2), np.int64(4), np.int64(6), np.int64(8)

#: Words of each slot one round of the warp fold stages (8 vectors of 16 bytes).
TILE_WORDS = np.int64(16)
#: Row pitch of a warp's staging tile, in words: one word of padding puts the 32
#: lanes' 8-byte reads of one column (and each half-warp's staging stores) on
#: distinct shared-memory banks.
TILE_PITCH = int(TILE_WORDS) + 1
_VECTORS = TILE_WORDS // _TWO
_ROWS_PER_LOAD = np.int64(WARP_SIZE) // _VECTORS
_FULL_MASK = np.uint32(0xFFFFFFFF)

if ON_SIMULATOR:

    @cuda.jit(device=True)
    def load_pair(words, i):
        """Words ``i`` and ``i + 1`` of ``words`` (``i`` even): one 16-byte load on a GPU."""
        return words[i], words[i + ONE]

else:
    from numba import types
    from numba.cuda.extending import intrinsic

    @intrinsic
    def load_pair(typingctx, words, i):
        """Words ``i`` and ``i + 1`` of ``words`` as one aligned 16-byte vector load."""
        sig = types.UniTuple(types.uint64, 2)(words, i)

        def codegen(context, builder, signature, args):
            array = context.make_array(signature.args[0])(context, builder, value=args[0])
            vec_type = ir.VectorType(ir.IntType(64), 2)
            pointer = builder.bitcast(builder.gep(array.data, [args[1]]), vec_type.as_pointer())
            vec = builder.load(pointer, align=16)
            lo = builder.extract_element(vec, ir.Constant(ir.IntType(32), 0))
            hi = builder.extract_element(vec, ir.Constant(ir.IntType(32), 1))
            return context.make_tuple(builder, signature.return_type, (lo, hi))

        return sig, codegen


@cuda.jit(device=True)
def slot_base(slot, row_stride, page_size, words_per_token):
    """Index of the first word of in-range ``slot`` in its source's span; int64."""
    if page_size == ONE:  # token-granular pools: skip the 64-bit division
        return slot * row_stride
    row = slot // page_size
    return row * row_stride + (slot - row * page_size) * words_per_token


@cuda.jit(device=True)
def fold_source(words, slot, row_stride, page_size, words_per_token, read_words):
    """Fold of one source's ``read_words`` words for in-range ``slot``; uint64."""
    base = slot_base(slot, row_stride, page_size, words_per_token)
    # Four 16-byte loads are issued before their words are folded: a warp issues in
    # order, so loading inside the fold loop would wait one memory latency per pair.
    acc = uint64(0)
    for k in range(ZERO, read_words, _EIGHT):
        a0, a1 = load_pair(words, base + k)
        b0 = b1 = c0 = c1 = d0 = d1 = uint64(0)
        more = read_words - k  # even, >= 2
        if more > _TWO:
            b0, b1 = load_pair(words, base + k + _TWO)
        if more > _FOUR:
            c0, c1 = load_pair(words, base + k + _FOUR)
        if more > _SIX:
            d0, d1 = load_pair(words, base + k + _SIX)
        acc = splitmix64(splitmix64(acc ^ a0) ^ a1)
        if more > _TWO:
            acc = splitmix64(splitmix64(acc ^ b0) ^ b1)
        if more > _FOUR:
            acc = splitmix64(splitmix64(acc ^ c0) ^ c1)
        if more > _SIX:
            acc = splitmix64(splitmix64(acc ^ d0) ^ d1)
    return acc


@cuda.jit(device=True)
def real_kv_hash(slot, nsrc, w0, w1, w2, w3, p):
    """``real_kv_hash`` of in-range ``slot`` over the first ``nsrc`` sources (0 when none); uint64.

    ``nsrc`` is a compile-time constant in the specialised kernels, so the
    unused branches vanish.
    """
    acc = uint64(0)
    if nsrc >= 1:
        acc = splitmix64(acc ^ fold_source(w0, slot, p[0], p[1], p[2], p[3]))
    if nsrc >= 2:
        acc = splitmix64(acc ^ fold_source(w1, slot, p[4], p[5], p[6], p[7]))
    if nsrc >= 3:
        acc = splitmix64(acc ^ fold_source(w2, slot, p[8], p[9], p[10], p[11]))
    if nsrc >= 4:
        acc = splitmix64(acc ^ fold_source(w3, slot, p[12], p[13], p[14], p[15]))
    return acc


@cuda.jit(device=True)
def warp_sync():
    """Barrier of the calling warp (of the block under the simulator, whose blocks are one warp)."""
    if ON_SIMULATOR:
        cuda.syncthreads()
    else:
        cuda.syncwarp()


@cuda.jit(device=True)
def warp_all(predicate):
    """Whether ``predicate`` holds on every lane of the warp (of the block under the simulator)."""
    if ON_SIMULATOR:
        return cuda.syncthreads_and(1 if predicate else 0) != 0
    return cuda.all_sync(_FULL_MASK, predicate)


@cuda.jit(device=True)
def _stage_round(tile, bases, words, row, word, offset, count):
    # One 16-byte vector of tile row ``row`` (a lane's slot). Without a branch, so that
    # the eight calls' loads are all issued before the first store waits: a row with no
    # slot, or a word past ``count``, loads word 0 (always there) and is never folded.
    base = bases[row]
    index = base + offset + word if base >= ZERO and word < count else ZERO
    lo, hi = load_pair(words, index)
    tile[row, word] = lo
    tile[row, word + ONE] = hi


@cuda.jit(device=True)
def _warp_fold_source(tile, bases, lane, words, slot, slot_ok, row_stride, page_size, words_per_token, read_words):
    """:func:`fold_source` of each lane's slot, computed by the whole warp (0 where not ``slot_ok``).

    When the 32 slots are consecutive in the source, every lane folds its own slot
    (the warp's loads then walk one contiguous span). Otherwise one lane per slot
    would make each 16-byte load of the warp touch 32 cache lines, so the warp
    stages ``TILE_WORDS`` words of all 32 slots in ``tile`` per round, with loads
    that cover 4 slots x 128 contiguous bytes each, and every lane folds its own
    row. All 32 lanes must call it (``slot_ok`` False for idle lanes).
    """
    if read_words <= _TWO:  # PARTIAL: one vector per slot, nothing to share
        return fold_source(words, slot, row_stride, page_size, words_per_token, read_words) if slot_ok else uint64(0)
    base = slot_base(slot, row_stride, page_size, words_per_token) if slot_ok else MINUS_ONE
    # A vote does not order shared memory: the previous call's reads of bases[0] must be done
    # before any lane overwrites it (compute-sanitizer racecheck found the hazard).
    warp_sync()
    bases[lane] = base
    warp_sync()
    step = row_stride if page_size == ONE else words_per_token
    if warp_all(base >= ZERO and base == bases[0] + lane * step):
        # 32 consecutive slots: the lanes' own loads walk one contiguous span together,
        # and a lane per slot keeps more loads in flight than staging does.
        return fold_source(words, slot, row_stride, page_size, words_per_token, read_words)
    word = (lane % _VECTORS) * _TWO  # this lane's vector within a staged row
    row = lane // _VECTORS  # the first of the rows this lane stages
    acc = uint64(0)
    for offset in range(ZERO, read_words, TILE_WORDS):
        count = min(TILE_WORDS, read_words - offset)
        if offset > ZERO:  # the previous round's rows are folded (the first round follows the sync above)
            warp_sync()
        for k in range(_VECTORS):  # unrolled: the loads of all rounds are in flight together
            _stage_round(tile, bases, words, row + k * _ROWS_PER_LOAD, word, offset, count)
        warp_sync()
        if base >= ZERO:
            for k in range(ZERO, count, _TWO):
                acc = splitmix64(splitmix64(acc ^ tile[lane, k]) ^ tile[lane, k + ONE])
    return acc


@cuda.jit(device=True)
def one_vector_each(nsrc, p):
    """Whether every source reads one 16-byte vector per slot (PARTIAL mode, or 16-byte ALL reads)."""
    one = nsrc < 1 or p[3] == _TWO
    if nsrc >= 2:
        one = one and p[7] == _TWO
    if nsrc >= 3:
        one = one and p[11] == _TWO
    if nsrc >= 4:
        one = one and p[15] == _TWO
    return one


@cuda.jit(device=True)
def _vector_of(words, slot, slot_ok, row_stride, page_size, words_per_token):
    """The first 16-byte vector of ``slot`` in a source (zeros where not ``slot_ok``)."""
    lo = hi = uint64(0)
    if slot_ok:
        lo, hi = load_pair(words, slot_base(slot, row_stride, page_size, words_per_token))
    return lo, hi


@cuda.jit(device=True)
def one_vector_kv_hash(slot, slot_ok, nsrc, w0, w1, w2, w3, p):
    """:func:`real_kv_hash` where every source reads one vector per slot; uint64.

    Every source's vector is loaded before the first is folded, so the loads of all
    sources are in flight together: one memory round trip per slot instead of one per
    source. (A fold of one vector from 0 is ``splitmix64(splitmix64(lo) ^ hi)``.)
    """
    a0, a1 = _vector_of(w0, slot, slot_ok and nsrc >= 1, p[0], p[1], p[2])
    b0, b1 = _vector_of(w1, slot, slot_ok and nsrc >= 2, p[4], p[5], p[6])
    c0, c1 = _vector_of(w2, slot, slot_ok and nsrc >= 3, p[8], p[9], p[10])
    d0, d1 = _vector_of(w3, slot, slot_ok and nsrc >= 4, p[12], p[13], p[14])
    acc = uint64(0)
    if nsrc >= 1:
        acc = splitmix64(acc ^ splitmix64(splitmix64(a0) ^ a1))
    if nsrc >= 2:
        acc = splitmix64(acc ^ splitmix64(splitmix64(b0) ^ b1))
    if nsrc >= 3:
        acc = splitmix64(acc ^ splitmix64(splitmix64(c0) ^ c1))
    if nsrc >= 4:
        acc = splitmix64(acc ^ splitmix64(splitmix64(d0) ^ d1))
    return acc


@cuda.jit(device=True)
def warp_real_kv_hash(tile, bases, lane, slot, slot_ok, nsrc, w0, w1, w2, w3, p):
    """:func:`real_kv_hash` of each lane's slot, computed by the whole warp; uint64.

    ``tile``: the warp's uint64 [32, TILE_PITCH] shared rows; ``bases``: its
    int64 [32] shared slot bases. Lanes without ``slot_ok`` get a meaningless value.
    """
    acc = uint64(0)
    if nsrc >= 1:
        acc = splitmix64(acc ^ _warp_fold_source(tile, bases, lane, w0, slot, slot_ok, p[0], p[1], p[2], p[3]))
    if nsrc >= 2:
        acc = splitmix64(acc ^ _warp_fold_source(tile, bases, lane, w1, slot, slot_ok, p[4], p[5], p[6], p[7]))
    if nsrc >= 3:
        acc = splitmix64(acc ^ _warp_fold_source(tile, bases, lane, w2, slot, slot_ok, p[8], p[9], p[10], p[11]))
    if nsrc >= 4:
        acc = splitmix64(acc ^ _warp_fold_source(tile, bases, lane, w3, slot, slot_ok, p[12], p[13], p[14], p[15]))
    return acc


def _make_fingerprint(nsrc: int):
    def fingerprint(slots, out, limit, w0, w1, w2, w3, p):
        # Grid-stride over slots; a slot outside [0, limit) has no bytes to read
        # and gets 0, the NONE-mode value (limit = slots every source covers).
        for i in range(cuda.grid(1), slots.shape[0], cuda.gridsize(1)):
            slot = slots[i]
            value = uint64(0)
            if uint64(slot) < uint64(limit):
                value = real_kv_hash(slot, nsrc, w0, w1, w2, w3, p)
            out[i] = int64(value)

    fingerprint.__name__ = fingerprint.__qualname__ = f"fingerprint_src{nsrc}"
    return cuda.jit(fingerprint)


#: Kernel arguments after the per-op ones: four source spans and their parameters.
SOURCE_SIGNATURE = "uint64[::1], uint64[::1], uint64[::1], uint64[::1], UniTuple(int64, 16)"

KERNELS = {f"fingerprint_src{n}": _make_fingerprint(n) for n in range(5)}
SIGNATURES = {name: (f"void(int64[::1], int64[::1], int64, {SOURCE_SIGNATURE})",) for name in KERNELS}
