"""CPU-compiled loops (``numba.njit``), cached on disk where numba can write its cache.

A process then loads the loops of the CPU path instead of compiling them at its first calls
(~2.5 s for a plan, a write and a verify on a 2-core VM; ~0.01 s loaded). Numba puts the
cache beside the module, else in a user-wide directory (``NUMBA_CACHE_DIR`` overrides both);
where neither is writable it refuses ``cache=True`` when the function is decorated, so
:func:`cpu_jit` then compiles per process instead of failing the import.

Numba names a cache file by the function's qualified name and line and does not key its
index on compile options: a loop compiled twice (in parallel and on one thread) compiles its
second form from :func:`twin`, under a file of its own. A caller's cache is not invalidated
when a callee in another file changes (``hashing.py``'s SplitMix64, fixed by the format):
after editing one, delete the ``__pycache__/*.nbi`` / ``*.nbc`` files of its callers.
"""

from __future__ import annotations

import types
from collections.abc import Callable

from numba import njit

__all__ = ["cpu_jit", "twin"]


def cpu_jit(**options) -> Callable:
    """``numba.njit(cache=True, **options)`` as a decorator, without the cache where numba has
    no writable cache location."""

    def decorate(fn):
        try:
            return njit(cache=True, **options)(fn)
        except RuntimeError:  # "cannot cache function ...: no locator available"
            return njit(**options)(fn)

    return decorate


def twin(fn: types.FunctionType, suffix: str) -> types.FunctionType:
    """A copy of ``fn`` named ``<qualname><suffix>``: the same code under a cache file of its own."""
    copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__ + suffix, fn.__defaults__, fn.__closure__)
    copy.__qualname__ = fn.__qualname__ + suffix
    copy.__doc__ = fn.__doc__
    return copy
