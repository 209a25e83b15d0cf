"""Which per-step arrays the prepared phases are bound to, and whether a step needs rebinding.

:class:`~.steps.PreparedSteps` keeps one :class:`BoundArrays` for the last step
whose arrays it bound; a step that :meth:`~BoundArrays.holds` launches the
same phases without computing their key or looking at a role.

The tests the hooks run on every call are straight-line code generated once per
shape of the question (:func:`identity_test`, :func:`_exact_test`): a loop or a
``map`` over the arrays costs two to three times as much, and a prepared step
is a few microseconds of host time in all.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from operator import attrgetter, is_
from typing import Any

from ..launch._launch import array_layout

__all__ = ["BoundArrays", "identity_test"]

_SHAPE = attrgetter("shape")


class BoundArrays:
    """The batch arrays (roles of fixed shape) two phases were last bound to.

    :meth:`holds` says whether a step's arrays need no rebinding: each is the
    same object, or a new view with the same base and layout (pointer, shape,
    strides, dtype: the same kernel argument, on the same device), and every
    array still has the shape it had (an in-place ``shape`` change gives
    another key). Anything else takes the keyed, validating path.

    Parameters
    ----------
    arrays : tuple
        The batch's arrays of the fixed-shape roles (None for an absent one).
    head, tail : PreparedPhase
        The phases bound to them.
    free : tuple of (PreparedPhase, str)
        The free roles (a length of their own every step) either phase binds:
        rebound at every step, whatever :meth:`holds` says.
    """

    __slots__ = ("_exact", "arrays", "free", "head", "present", "shapes", "tail")

    def __init__(self, arrays: tuple, head, tail, free: tuple = ()):
        self.arrays, self.head, self.tail, self.free = arrays, head, tail, free
        self.present = [a for a in arrays if a is not None]
        try:
            self.shapes = list(map(_SHAPE, self.present))
        except AttributeError:  # an array object without .shape (DLPack only): the keyed path every step
            self.shapes = None
        self._exact = None if self.shapes is None else _exact_test(arrays)

    def holds(self, arrays: tuple) -> bool:
        if self._exact is not None and self._exact(arrays):  # the usual step: the same objects
            return True
        old = self.arrays
        if self.shapes is None or len(arrays) != len(old):
            return False
        if not (all(map(is_, arrays, old)) or all(map(_same, arrays, old))):
            return False
        return list(map(_SHAPE, self.present)) == self.shapes


def _same(new: Any, old: Any) -> bool:
    """``new`` is ``old``, or another view of its base with its layout (``buffer[:n]`` sliced again)."""
    if new is old:
        return True
    if new is None or old is None or type(new) is not type(old):
        return False
    base = getattr(old, "base", None)
    return base is not None and getattr(new, "base", None) is base and array_layout(new) == array_layout(old)


_MAKERS: dict[tuple, Callable] = {}  # (count, indices whose shape is compared) -> factory of exact tests


def _exact_test(arrays: tuple) -> Callable[[tuple], bool]:
    """``exact(new)``: ``new`` holds the very objects of ``arrays`` and each array still has its shape
    now. Straight-line code over closure cells (each distinct array's shape read once): 0.9 -> 0.5 us
    on the development VM against ``all(map(...))`` and a list of shapes, and every prepared step
    runs it. The code depends only on the count and on which entries are distinct arrays: compiled
    once per such pattern."""
    n = len(arrays)
    distinct = tuple(i for i, a in enumerate(arrays) if a is not None and all(a is not b for b in arrays[:i]))
    make = _MAKERS.get((n, distinct))
    if make is None:
        names = ", ".join(f"a{i}" for i in range(n))
        tests = [f"a{i} is o{i}" for i in range(n)] + [f"o{i}.shape == s{i}" for i in distinct]
        params = [f"o{i}" for i in range(n)] + [f"s{i}" for i in distinct]
        source = (
            f"def make({', '.join(params)}):\n"
            f"    def exact(new):\n"
            f"        if len(new) != {n}:\n"
            f"            return False\n"
            f"        {names}, = new\n"
            f"        return {' and '.join(tests)}\n"
            f"    return exact\n"
        )
        scope: dict = {}
        exec(source, scope)  # noqa: S102 - names generated above, no outside input
        make = _MAKERS[(n, distinct)] = scope["make"]
    return make(*arrays, *(arrays[i].shape for i in distinct))


@cache
def identity_test(names: tuple[str, ...]) -> Callable[[Any, tuple], bool]:
    """``same(obj, objects)``: whether ``getattr(obj, names[i]) is objects[i]`` for every ``i``.

    Straight-line code (one ``is`` per name, built once per tuple of names): a third of the
    cost of a loop over the names or of building the tuple to compare. The monitor's hooks
    run one at every call (``StepBatch`` fields), a graph match another.
    """
    tests = " and ".join(f"obj.{name} is objects[{i}]" for i, name in enumerate(names))
    scope: dict = {}
    exec(f"def same(obj, objects):\n    return {tests}\n", scope)  # noqa: S102 - names are attribute names
    return scope["same"]
