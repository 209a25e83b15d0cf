"""Arguments that share memory: an array a call writes may share no byte with another array of that call.

The rule (KVC-C017, every public launch, every backend): an output that shares memory with any other
array argument of the same call is rejected before anything is written or launched. Inputs may share
memory with inputs (both are only read), and views of one buffer that do not overlap are separate
arguments (the monitor keeps its write index, counters and plan lanes as disjoint words of one status
array). Why reject rather than define a result: the kernels read inputs in some threads while others
write outputs, so an aliased call is a data race on a GPU and under the simulator; the NumPy reference
could give one answer, the kernels another, or a different one each run.

What is compared is each array's byte *span* ``[lo, hi)``: the data pointer, plus ``(extent - 1) *
stride`` per axis (downwards for a negative stride), plus one item; an empty array spans nothing.
Spans are bounds, as :func:`numpy.may_share_memory` takes them. Every output is validated
C-contiguous, so an output's span is exactly its bytes; only a non-contiguous input (a real-KV source
whose rows leave holes) can be reported sharing with an output that sits in a hole it never reads.

The fast wing's validation memo (``fast/memo.py``) re-tests on every memo hit the arrays whose
addresses its snapshot does not hold (top-level NumPy arrays), with :func:`disjoint`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import types
from numba.extending import intrinsic

from ._jit import cpu_jit
from .errors import error

__all__ = ["COMPILED_DTYPES", "bounds", "check", "disjoint", "extent", "host_span", "shared", "spans"]


@intrinsic
def _address(typingctx, array):
    """An array's data pointer as int64 (``a.ctypes.data`` compiles ~10x slower)."""

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        return builder.ptrtoint(data, context.get_value_type(types.int64))

    return types.int64(array), codegen


@cpu_jit(nogil=True)
def extent(a):
    """Bytes ``[lo, hi)`` an array's elements span (``lo == hi`` when it is empty)."""
    lo = _address(a)
    if a.size == 0:
        return lo, lo
    hi = lo + a.itemsize
    for length, stride in zip(a.shape, a.strides):
        step = np.int64((length - 1) * stride)
        if step < 0:
            lo += step
        else:
            hi += step
    return lo, hi


#: dtypes whose arrays Numba types natively (float16, structured and byte-swapped dtypes are not):
#: their spans come from :func:`extent`, the others' from the array interface (~0.8 µs).
COMPILED_DTYPES = frozenset(np.dtype(c) for c in "bBhHiIlLqQfdFD?")


def bounds(ptr: int, shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> tuple[int, int]:
    """:func:`extent` from an array's description (CUDA arrays, dtypes Numba does not type)."""
    lo = hi = ptr
    for length, stride in zip(shape, strides):
        if length == 0:
            return ptr, ptr
        step = (length - 1) * stride
        if step < 0:
            lo += step
        else:
            hi += step
    return lo, hi + itemsize


def host_span(array: np.ndarray) -> tuple[int, int]:
    """Byte span of a NumPy array."""
    if array.dtype in COMPILED_DTYPES:
        return extent(array)
    return bounds(array.__array_interface__["data"][0], array.shape, array.strides, array.itemsize)


def shared(function: str, first: tuple, second: tuple):
    """KVC-C017 naming the output of the pair (the first one when both are) and the other array."""
    output, other = (first, second) if first[4] else (second, first)
    return error("KVC-C017", function=function, argument=output[3], other=other[3])


def _first_conflict(spans: list[tuple]) -> tuple | None:
    """The pair that comes first in argument order among overlapping spans with an output, or None.

    ``spans``: (lo, hi, index, name, output) of non-empty arrays, sorted by ``lo``.
    """
    found = None
    for i, a in enumerate(spans):
        for b in spans[i + 1 :]:
            if b[0] >= a[1]:  # sorted by lo: no later span reaches back into a
                break
            if a[4] or b[4]:
                pair = (a, b) if a[2] < b[2] else (b, a)
                if found is None or (pair[0][2], pair[1][2]) < (found[0][2], found[1][2]):
                    found = pair
    return found


def disjoint(function: str, spans: list[tuple]) -> None:
    """Raise KVC-C017 for the first conflicting pair of ``spans`` (sorted by ``lo``), if any."""
    reach = -1
    for span in spans:  # the usual call: all disjoint, seen in one pass
        if span[0] < reach:
            pair = _first_conflict(spans)
            if pair is not None:
                raise shared(function, *pair)
            return
        reach = span[1]


def check(function: str, arrays: list[tuple[str, Any]]) -> None:
    """Raise KVC-C017 if an output among ``arrays`` shares memory with another of them.

    Parameters
    ----------
    function : str
        Public function named in the message.
    arrays : list of (name, ArrayInfo)
        Every array argument of the call, validated; outputs are those checked as writeable.

    Raises
    ------
    KvCanaryError
        KVC-C017, naming the output and the other array of the pair that comes first in argument order.
    """
    disjoint(function, sorted(spans(arrays)))


def spans(arrays: list[tuple[str, Any]]) -> list[tuple]:
    """``(lo, hi, index, name, output)`` of each non-empty array of ``arrays`` (name, ArrayInfo)."""
    out = []
    for index, (name, info) in enumerate(arrays):
        lo, hi = info.span()
        if lo != hi:  # an empty array shares nothing
            out.append((lo, hi, index, name, info.output))
    return out
