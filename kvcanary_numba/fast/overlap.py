"""The shared-memory test (KVC-C017) a validation-memo hit still owes.

A memo snapshot (:mod:`.memo`) holds the address of every CUDA array and a token for every
NumPy array held by a context, plan or source (its memory cannot move while it lives), but
only the layout of a NumPy array passed at the top level: reading its address costs time on
every call. :func:`recheck_for` therefore builds a :class:`Recheck` when a call has such
arrays: it runs on every memo hit and tests just those arrays, with their addresses read by a
compiled helper (~0.1 us each), against the spans remembered at the miss.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

from .._overlap import COMPILED_DTYPES, disjoint, extent, host_span, shared
from .tokens import token

__all__ = ["Recheck", "recheck_for"]


def recheck_for(function: str, arrays: list[tuple[str, Any]]) -> Recheck | None:
    """The :class:`Recheck` a memo hit of a validated call with ``arrays`` (name, ArrayInfo) owes, or None."""
    pinned, loose = [], []
    for index, (name, info) in enumerate(arrays):
        lo, hi = info.span()
        if lo == hi:  # an empty array shares nothing (and its shape is part of the snapshot)
            continue
        if info.kind == "numpy" and name.isidentifier():  # top level: address not in the snapshot
            loose.append((name, index, info.output, info.dtype in COMPILED_DTYPES))
        else:
            pinned.append((lo, hi, index, name, info.output))
    return Recheck(function, loose, pinned) if loose else None


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

    __slots__ = ("function", "inputs", "outputs", "pinned", "los", "his", "pinned_outputs", "names", "passed", "_token")

    def __init__(self, function: str, loose: list, pinned: list):
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
                    raise shared(self.function, (lo, hi, index, name, False), self.pinned_outputs[i])
        if self.outputs:  # top-level outputs (offsets, scatter, fingerprint): against every other array
            spans = [
                (*span_of(kwargs[name]), index, name, output)
                for output, group in ((False, self.inputs), (True, self.outputs))
                for name, index, span_of in group
            ]
            spans = sorted(span for span in spans + self.pinned if span[0] != span[1])
            disjoint(self.function, spans)
