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

:func:`run_parallel` calls the parallel form of such a loop where that is safe from several
host threads, and its one-thread form where it is not (Numba's workqueue threading layer).
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable

import numba
from numba import njit

__all__ = ["cpu_jit", "run_parallel", "twin"]


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


#: Threading layers that run parallel regions of several host threads at once (Numba's
#: documentation: TBB and OpenMP are thread-safe, workqueue is not).
THREADSAFE_LAYERS = ("tbb", "omp")
#: [whether the process's threading layer is thread-safe], once a parallel region has chosen it.
_layer_safe: list[bool] = []
#: Held by the host thread in a parallel region while the layer is not known to be thread-safe.
_parallel_region = threading.Lock()


def _threadsafe_layer() -> bool:
    if not _layer_safe:
        try:
            layer = numba.threading_layer()
        except ValueError:  # no parallel region has run in this process yet: no layer chosen
            return False
        _layer_safe.append(layer in THREADSAFE_LAYERS)
    return _layer_safe[0]


def run_parallel(parallel: Callable, serial: Callable, *args):
    """``parallel(*args)``, or ``serial(*args)`` (the same loop compiled for one thread) where a
    parallel region now could abort the process.

    Numba's workqueue threading layer (the one left when neither TBB nor OpenMP is installed)
    aborts the process when two host threads run parallel regions at once. Under it, and until a
    first parallel region has shown which layer the process uses, one host thread at a time runs
    the parallel form; another thread runs the serial form meanwhile instead of waiting.
    """
    if _threadsafe_layer():
        return parallel(*args)
    if not _parallel_region.acquire(blocking=False):
        return serial(*args)
    try:
        return parallel(*args)
    finally:
        _parallel_region.release()
