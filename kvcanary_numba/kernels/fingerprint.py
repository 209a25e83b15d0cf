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
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import cuda, int64, uint64

from . import ON_SIMULATOR
from .hashing import ONE, ZERO, splitmix64

__all__ = ["KERNELS", "SIGNATURES", "fold_source", "load_pair", "real_kv_hash"]

_TWO, _FOUR, _SIX, _EIGHT = np.int64(2), np.int64(4), np.int64(6), np.int64(8)

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
def fold_source(words, slot, row_stride, page_size, words_per_token, read_words):
    """Fold of one source's ``read_words`` words for in-range ``slot``; uint64."""
    if page_size == ONE:  # token-granular pools: skip the 64-bit division
        base = slot * row_stride
    else:
        row = slot // page_size
        base = row * row_stride + (slot - row * page_size) * words_per_token
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
