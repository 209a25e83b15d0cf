"""Replay of repeated internal glue calls, as repeated public calls are replayed.

The monitor's validated GPU path (a step whose arrays its prepared phases cannot bind)
calls the endpoint glue (``fast/endpoints.py``) four times per decode step. Run every
time, that glue re-derives the kernel variant and the grid, and each eager launch
re-packs every parameter of the kernel (211-259 for the endpoint kernels, their
per-endpoint tuples item by item): about 1.3 ms of host time per decode step on an H200
host (2026-12-04), against 0.36 ms when those launches were memoised public calls. :func:`run_memoised` gives
the glue the public calls' memo without their validation (the monitor validated the
batch; the contexts and plans are its own):

- the key of a call is a ``memo.snapshot`` of its arguments, each walked as held
  (depth 1, so every NumPy, Numba or CAI array gets its per-object token, CuPy and
  PyTorch arrays their pointer, all their shape, strides and dtype; scalars their
  value), as the public calls' memo keys them: a per-step CuPy array allocated anew
  at the same address with the same layout replays (its launch would pack the same
  parameters), one at another address or of another layout takes the full path;
- the key's :class:`~.memo.Entry` runs through
  ``replay.run_launches``: the glue the first time, the glue with its launches
  packed the second time, then a replay of those launches (one launch table, no
  glue) wherever ``entry.where`` (stream, device, glue launch state) is unchanged.

Nothing kept here holds a user object: snapshots hold layouts, tokens and scalars,
packed launches pointers (``memo``, ``PreparedLaunch.release``), and a token's
entry goes when its object dies. A per-call array freed and replaced at its address
is a new object, hence a new token, hence the full path; a CuPy array is keyed by
its pointer, as in the public memo (equal pointers and layouts pack to equal
launches). Under
the simulator, while a recording is active, or when a key cannot be taken (an
object that cannot be weakly referenced: ``Uncacheable``) the glue runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import replay
from .chain import SharedChain
from .memo import Entry, Memo, snapshot
from .tokens import Uncacheable

__all__ = ["MEMO", "clear", "key", "run_memoised"]

#: Entries of the glue calls seen (a monitor step makes four; bounded, oldest out).
MEMO = Memo(size=256)


def _held(value: Any) -> Any:
    # A shared chain is no dataclass: what its launches read of it is its two scratch arrays.
    if type(value) is SharedChain:
        return (value.published, value.published_seeds)
    return value


def key(name: str, kwargs: dict) -> tuple:
    """The memo key of glue ``name`` called with ``kwargs`` (see the module docstring).

    Raises
    ------
    Uncacheable
        Something in ``kwargs`` cannot be described without keeping it alive.
    """
    return snapshot((name, tuple(map(_held, kwargs.values()))))[0]


def run_memoised(name: str, run: Callable[..., None], kwargs: dict, stream: int | None = None) -> None:
    """``run(**kwargs)``, or the replay of its launches (see the module docstring).

    Parameters
    ----------
    name : str
        The glue function (part of the key).
    run : callable
        The glue: it must read nothing but ``kwargs`` and the launch state the
        launch layer knows of (``replay.LAUNCH_STATE``), and do nothing but
        launch.
    kwargs : dict
        Its keyword arguments.
    """
    if not replay.replayable():  # nothing would be packed or replayed: no key to take
        run(**kwargs, stream=stream)
        return
    try:
        found = key(name, kwargs)
    except Uncacheable:
        run(**kwargs, stream=stream)
        return
    entry = MEMO.get(found)
    if entry is None:
        entry = Entry("cuda")
        MEMO.put(found, entry)
    else:
        entry.hits += 1
    replay.run_launches(entry, run, kwargs, stream)


def clear() -> None:
    """Forget every entry. For code that swaps what the glue reads besides its arguments (tests
    that patch ``endpoints.fused_count``): an entry made before would replay the old launches."""
    MEMO.clear()
