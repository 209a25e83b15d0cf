"""Per-object tokens: a number for a live object, never reused for another object.

The validation memo (:mod:`.memo`) and the shared-memory re-test (:mod:`.overlap`) key
long-lived arrays by token instead of by address: reading a NumPy array's address costs
microseconds, and a token is dropped (weak-reference callback) when its object dies, so an
array freed and replaced at the same address gets a new token.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

__all__ = ["TOKENS", "Uncacheable", "token"]


class Uncacheable(Exception):
    """The arguments hold something the snapshot cannot describe: validate in full."""


_next = itertools.count(1)
#: id(object) -> (weak reference, token); the callback drops the entry when the object dies.
TOKENS: dict[int, tuple[weakref.ref, int]] = {}


def token(x: Any) -> int:
    """A number for live object ``x``, never reused for another object."""
    key = id(x)
    hit = TOKENS.get(key)
    if hit is not None and hit[0]() is x:
        return hit[1]
    try:
        ref = weakref.ref(x, lambda _, key=key: TOKENS.pop(key, None))
    except TypeError:
        raise Uncacheable(type(x).__name__) from None
    value = next(_next)
    TOKENS[key] = (ref, value)
    return value
