"""Which per-step arrays the prepared phases are bound to, and whether an array is still what was checked.

:class:`~.steps.PreparedSteps` keeps one :class:`BoundArrays` for the last step
whose arrays it bound; a step that :meth:`~BoundArrays.holds` launches the
same phases without computing their key or looking at a role.

An array can change under the same Python object: NumPy's and CuPy's ``shape``
(and NumPy's ``strides`` and ``dtype``) can be set in place, a PyTorch tensor can
be given other storage (``set_``, a growing ``resize_``), any object with a CUDA
array interface can report another pointer. So the identity tests here also
compare what of each array can change that way (:func:`layout_key`): the
shape, strides and dtype of a NumPy array (whose memory moves only with its
shape: ``resize``), the shape and pointer of a CuPy array (its strides follow its
shape, its dtype is fixed), the whole layout of anything else.

The tests the hooks run on every call are straight-line code generated once per
shape of the question (:func:`holds_test`, :func:`_exact_test`): a loop or a
``map`` over the arrays costs two to three times as much, and a prepared step
is a few microseconds of host time in all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..launch._launch import array_layout

__all__ = ["BoundArrays", "holds_test", "layout_key", "safe_layout"]


def safe_layout(x: Any) -> Any:
    """``array_layout(x)``, or a new object (equal to nothing) when ``x`` cannot tell it now
    (a deleted or donated buffer, an object that is no array): the caller then checks it in full."""
    try:
        return array_layout(x)
    except Exception:  # noqa: BLE001 - any failure to describe means "not the same"
        return object()


def _kind(x: Any) -> str:
    if x is None or isinstance(x, (int, float, str)):
        return "none"  # nothing to compare but the object: an immutable value
    if type(x) is np.ndarray:
        return "numpy"
    if type(x).__module__.split(".")[0] == "cupy" and hasattr(x, "data"):
        return "cupy"
    return "other"


#: Per kind: the conditions on stored object ``o`` (``{i}``: its index) and the values they compare with.
_CONDITIONS = {
    "numpy": ("o{i}.shape == s{i}", "o{i}.strides == t{i}", "o{i}.dtype is d{i}"),
    "cupy": ("o{i}.shape == s{i}", "o{i}.data.ptr == p{i}"),
    "other": ("_layout(o{i}) == l{i}",),
    "none": (),
}
_PARAMS = {"numpy": ("s", "t", "d"), "cupy": ("s", "p"), "other": ("l",), "none": ()}


def _values(x: Any, kind: str) -> tuple:
    if kind == "numpy":
        return x.shape, x.strides, x.dtype
    if kind == "cupy":
        return x.shape, x.data.ptr
    return (safe_layout(x),) if kind == "other" else ()


def layout_key(x: Any) -> tuple:
    """What of array ``x`` a launch depends on and an in-place change can alter (see the module
    docstring); equal keys of one object mean nothing a launch reads of it moved."""
    kind = _kind(x)
    return (kind, *_values(x, kind))


def _generated(kinds: tuple[str, ...], first: list[str], tested: tuple[int, ...]) -> Callable:
    """``make(o0, ..., values...)`` returning ``test(new)``: ``first`` are the leading lines of the
    test's body (they bind or test ``a{i}`` against ``o{i}``), then each ``tested`` index's conditions."""
    conditions, params = [], []
    for i in tested:
        conditions += [c.format(i=i) for c in _CONDITIONS[kinds[i]]]
        params += [f"{p}{i}" for p in _PARAMS[kinds[i]]]
    body = [*first, f"        return {' and '.join(conditions) or 'True'}"]
    source = "\n".join(
        [
            f"def make({', '.join([f'o{i}' for i in range(len(kinds))] + params)}):",
            "    def test(new):",
            *body,
            "    return test",
        ]
    )
    scope: dict = {"_layout": safe_layout}
    exec(source + "\n", scope)  # noqa: S102 - names generated here, no outside input
    return scope["make"]


def _made(make: Callable, objects: tuple, kinds: tuple[str, ...], tested: tuple[int, ...]) -> Callable:
    values = [v for i in tested for v in _values(objects[i], kinds[i])]
    return make(*objects, *values)


class BoundArrays:
    """The batch arrays (roles of fixed shape) two phases were last bound to.

    :meth:`holds` says whether a step's arrays need no rebinding: each is the
    same object, or a new view with the same base, with the layout (pointer,
    shape, strides, dtype: the same kernel argument, on the same device) it had
    when bound. An array changed in place since has another layout: anything
    else takes the keyed, validating path.

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

    __slots__ = ("_exact", "arrays", "free", "head", "layouts", "tail")

    def __init__(self, arrays: tuple, head, tail, free: tuple = ()):
        self.arrays, self.head, self.tail, self.free = arrays, head, tail, free
        self.layouts = [None if a is None else safe_layout(a) for a in arrays]
        self._exact = _exact_test(arrays)

    def holds(self, arrays: tuple) -> bool:
        if self._exact(arrays):  # the usual step: the same objects, unchanged
            return True
        return len(arrays) == len(self.arrays) and all(map(_same, arrays, self.arrays, self.layouts))


def _same(new: Any, old: Any, layout: Any) -> bool:
    """``new`` is ``old`` or another view of its base (``buffer[:n]`` sliced again), with ``layout``."""
    if new is None or old is None:
        return new is old
    if new is not old:
        base = getattr(old, "base", None)
        if type(new) is not type(old) or base is None or getattr(new, "base", None) is not base:
            return False
    return safe_layout(new) == layout


_MAKERS: dict[tuple, Callable] = {}  # (count, distinct indices, kinds) -> factory of exact tests


def _exact_test(arrays: tuple) -> Callable[[tuple], bool]:
    """``exact(new)``: ``new`` holds the very objects of ``arrays``, each with the layout key it has now
    (:func:`layout_key`; each distinct array read once). Straight-line code over closure cells: 0.9 ->
    0.5 us on the development VM against ``all(map(...))`` and a list of shapes, and every prepared
    step runs it. Compiled once per count, pattern of distinct entries and kinds of array."""
    n = len(arrays)
    distinct = tuple(i for i, a in enumerate(arrays) if a is not None and all(a is not b for b in arrays[:i]))
    kinds = tuple(_kind(a) for a in arrays)
    make = _MAKERS.get((n, distinct, kinds))
    if make is None:
        names = ", ".join(f"a{i}" for i in range(n))
        first = [
            f"        if len(new) != {n}:",
            "            return False",
            f"        {names}, = new",
            f"        if not ({' and '.join(f'a{i} is o{i}' for i in range(n))}):",
            "            return False",
        ]
        make = _MAKERS[(n, distinct, kinds)] = _generated(kinds, first, distinct)
    return _made(make, arrays, kinds, distinct)


_HOLDERS: dict[tuple, Callable] = {}  # (names, kinds) -> factory of holds tests


def holds_test(names: tuple[str, ...], objects: tuple) -> Callable[[Any], bool]:
    """``holds(obj)``: ``getattr(obj, names[i]) is objects[i]`` for every ``i``, and each of those
    arrays still has the layout key it has now (:func:`layout_key`; an int, float or str is
    compared by identity alone).

    Straight-line code (one ``is`` per name, then each array's key; compiled once per tuple of
    names and kinds of array): the monitor's hooks run one at every call (``StepBatch`` fields, as
    last checked), a graph match another (the captured arrays).
    """
    kinds = tuple(_kind(x) for x in objects)
    make = _HOLDERS.get((names, kinds))
    if make is None:
        same = " and ".join(f"new.{name} is o{i}" for i, name in enumerate(names))
        first = [f"        if not ({same}):", "            return False"]
        tested = tuple(i for i, kind in enumerate(kinds) if kind != "none")
        make = _HOLDERS[(names, kinds)] = _generated(kinds, first, tested)
    return _made(make, objects, kinds, tuple(i for i, kind in enumerate(kinds) if kind != "none"))
