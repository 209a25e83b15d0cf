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

The validation memo (:mod:`._memo`) skips validation when a call's snapshot passed before. A
snapshot holds the address of every CUDA array and a token for every NumPy array held by a context,
plan or source (its memory cannot move while it lives), but only the layout of a NumPy array passed
at the top level (reading its address costs time on every call). :func:`check` therefore returns a
:class:`Recheck` when a call has such arrays: it runs on every memo hit and tests just those arrays,
with their addresses read by a compiled helper (~0.1 µs each), against the spans remembered at the
miss.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

import numpy as np
from numba import types
from numba.extending import intrinsic

from ._jit import cpu_jit
from .errors import error

__all__ = ["Recheck", "bounds", "check", "extent", "host_span"]


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
_COMPILED = frozenset(np.dtype(c) for c in "bBhHiIlLqQfdFD?")


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
    if array.dtype in _COMPILED:
        return extent(array)
    return bounds(array.__array_interface__["data"][0], array.shape, array.strides, array.itemsize)


def _shared(function: str, first: tuple, second: tuple):
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


def _disjoint(function: str, spans: list[tuple]) -> None:
    """Raise KVC-C017 for the first conflicting pair of ``spans`` (sorted by ``lo``), if any."""
    reach = -1
    for span in spans:  # the usual call: all disjoint, seen in one pass
        if span[0] < reach:
            pair = _first_conflict(spans)
            if pair is not None:
                raise _shared(function, *pair)
            return
        reach = span[1]


def check(function: str, kind: str, arrays: list[tuple[str, Any]]) -> tuple[str, Recheck | None]:
    """Raise KVC-C017 if an output among ``arrays`` shares memory with another of them.

    Parameters
    ----------
    function : str
        Public function named in the message.
    kind : str
        The call's backend (returned as is).
    arrays : list of (name, ArrayInfo)
        Every array argument of the call, validated; outputs are those checked as writeable.
        Names without a dot or bracket are top-level arguments.

    Returns
    -------
    kind : str
    recheck : Recheck or None
        What a memo hit of this snapshot must test again (None: nothing).

    Raises
    ------
    KvCanaryError
        KVC-C017, naming the output and the other array of the pair that comes first in argument order.
    """
    spans, pinned, loose = [], [], []
    for index, (name, info) in enumerate(arrays):
        lo, hi = info.span()
        if lo == hi:  # an empty array shares nothing (and its shape is part of the snapshot)
            continue
        span = (lo, hi, index, name, info.output)
        spans.append(span)
        if info.kind == "numpy" and name.isidentifier():  # a top-level NumPy array: address not in the snapshot
            loose.append((name, index, info.output, info.dtype in _COMPILED))
        else:
            pinned.append(span)
    spans.sort()
    _disjoint(function, spans)
    return kind, (Recheck(function, loose, pinned) if loose else None)


class Recheck:
    """The shared-memory test a memo hit still owes: top-level NumPy arrays against everything else.

    Parameters
    ----------
    function : str
        Public function named in the message.
    loose : list of (name, index, output, compiled)
        The top-level NumPy arguments (their addresses are read again on every hit; ``compiled``:
        their dtype is one :func:`extent` reads, a fact the snapshot keeps).
    pinned : list of (lo, hi, index, name, output)
        Spans of the other non-empty arrays, as validated (their addresses are in the snapshot).
    """

    __slots__ = ("function", "inputs", "outputs", "pinned", "los", "his", "pinned_outputs", "names", "passed",
                 "_token")  # fmt: skip

    def __init__(self, function: str, loose: list, pinned: list):
        from ._memo import token  # here, not at import: _memo's imports lead back to this module

        self._token, self.names, self.passed = token, tuple(name for name, *_ in loose), None
        self.function, self.inputs, self.outputs = function, [], []
        for name, index, output, compiled in loose:
            (self.outputs if output else self.inputs).append((name, index, extent if compiled else host_span))
        pinned.sort()
        self.pinned = pinned
        # Pinned outputs never overlap each other (validated): sorted by lo, their his are sorted too,
        # so one bisection finds the only output an input's span could meet.
        self.pinned_outputs = [s for s in pinned if s[4]]
        self.los, self.his = [s[0] for s in self.pinned_outputs], [s[1] for s in self.pinned_outputs]

    def __call__(self, kwargs: dict) -> None:
        """Raise KVC-C017 if a top-level NumPy array of ``kwargs`` now shares memory it must not.

        The arrays that last passed are remembered by object (weak tokens): the same live objects
        with the snapshot's layouts hold the same memory (a NumPy array's memory moves only when
        ``resize`` reallocates it, and fresh memory overlaps no live array), so they pass again
        without their addresses being read (an engine that refills its arrays in place).
        """
        token = self._token
        objects = tuple([token(kwargs[name]) for name in self.names])
        if objects == self.passed:
            return
        self._test(kwargs)
        self.passed = objects

    def _test(self, kwargs: dict) -> None:
        his, los, count = self.his, self.los, len(self.his)
        if count:  # an engine's per-step inputs against the context's or plan's outputs: one bisection each
            for name, index, span_of in self.inputs:
                lo, hi = span_of(kwargs[name])
                i = bisect_right(his, lo)
                if i < count and los[i] < hi:
                    raise _shared(self.function, (lo, hi, index, name, False), self.pinned_outputs[i])
        if self.outputs:  # top-level outputs (offsets, scatter, fingerprint): against every other array
            spans = [(*span_of(kwargs[name]), index, name, output) for output, group in
                     ((False, self.inputs), (True, self.outputs)) for name, index, span_of in group]  # fmt: skip
            spans = sorted(span for span in spans + self.pinned if span[0] != span[1])
            _disjoint(self.function, spans)
