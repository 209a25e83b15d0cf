"""Which per-step arrays the monitor's prepared phases are bound to, and whether a step needs rebinding.

:class:`~.fastpath.FastPath` keeps one :class:`BoundArrays` for the last step
whose arrays it bound; a step that :meth:`~BoundArrays.holds` launches the
same phases without computing their key or looking at a role.
"""

from __future__ import annotations

from operator import attrgetter, is_
from typing import Any

from ..launch._common import array_layout

__all__ = ["BoundArrays"]

_SHAPE = attrgetter("shape")


class BoundArrays:
    """The batch arrays (roles of fixed shape) two phases were last bound to.

    :meth:`holds` says whether a step's arrays need no rebinding: each is the
    same object, or a new view with the same base and layout (pointer, shape,
    strides, dtype: the same kernel argument, on the same device), and every
    array still has the shape it had (an in-place ``shape`` change gives
    another key). Anything else takes the keyed, validating path.
    """

    __slots__ = ("arrays", "present", "shapes", "head", "tail")

    def __init__(self, arrays: tuple, head, tail):
        self.arrays, self.head, self.tail = arrays, head, tail
        self.present = [a for a in arrays if a is not None]
        try:
            self.shapes = list(map(_SHAPE, self.present))
        except AttributeError:  # an array object without .shape (DLPack only): the keyed path every step
            self.shapes = None

    def holds(self, arrays: tuple) -> bool:
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
