"""Which path runs a monitor step's phases: a captured CUDA graph, the prepared steps, or the step plan.

The monitor's hooks hold the three (``graph``, ``fast``, ``step_plan``) and ask here:

- :func:`head` runs a step's HEAD phase on the fastest path that may take the batch and
  returns the TAIL phase to run at ``post_forward`` (on the same path, on the arrays the
  step was planned with);
- :func:`use_prepared`, :func:`prepared_steps`, :func:`switched_backend` and
  :func:`check_capture` say whether the monitor may prepare steps (they need the kernels),
  make them, and whether it may capture them (prepared steps on a GPU);
- :func:`follow` keeps the paths true when the real-KV sources change
  (:class:`~.sources.Change`): packed launches are re-pointed (``moved``, ``same``: they
  drop the old arrays) or recorded again (``reshaped``), a captured graph is dropped unless
  the memory stayed put, and a TAIL phase still pending on a stale path runs on the plan.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np

from .._validate import check_bool, resolve_backend
from ..errors import error
from ..fast.steps import PreparedSteps

__all__ = ["NEEDS_KERNELS", "check_capture", "follow", "head", "prepared_steps", "switched_backend", "use_prepared"]

NEEDS_KERNELS = "prepared steps launch the CUDA kernels: device='cuda' (or backend='cuda' under the simulator)"


def head(graph, fast, plan, batch, checked) -> Callable[[], None]:
    """Run ``batch``'s HEAD phase (the batch checked, ``checked``: the monitor's last check of it)
    on the graph if it matches, else the prepared steps, else the plan; returns its TAIL phase."""
    if graph is not None and graph.matches(batch, checked):  # batch's fields, as just checked
        graph.pre()
        return graph.post
    if fast is not None:
        fast.pre(batch)
        return fast.post
    plan.head(batch, *plan.prepare_inputs(batch))
    return _planned_tail(plan, batch)


def _planned_tail(plan, batch) -> Callable[[], None]:
    # TAIL stamps what HEAD planned: the arrays of this moment, as the prepared and graph paths
    # (which bind them now) do, even if the engine reassigns a batch field before post_forward.
    planned = copy.copy(batch)
    return lambda: plan.tail(planned)


def prepared_steps(plan, xp) -> PreparedSteps:
    """The prepared steps of ``plan``; on a GPU they compile the kernels every step uses now (never
    inside a capture)."""
    return PreparedSteps(plan, compile=xp is not np)


def switched_backend(function: str, backend: Any, placement, fast) -> str:
    """``backend`` resolved for a monitor switching backends (KVC-C008: prepared steps need ``"cuda"``)."""
    resolved = resolve_backend(function, backend, [("the monitor's buffers", placement)])
    if fast is not None and resolved != "cuda":
        raise error("KVC-C008", function=function, argument="backend", got=backend, reason=NEEDS_KERNELS)
    return resolved


def check_capture(function: str, fast, xp, device: str) -> None:
    """KVC-C008 unless the monitor can capture a graph (prepared steps on a GPU); None otherwise."""
    if fast is None or xp is np:
        raise error(
            "KVC-C008",
            function=function,
            argument="device",
            got=device,
            reason="CUDA-graph capture needs device='cuda' (CuPy arrays on a GPU) and prepared steps",
        )


def use_prepared(function: str, prepared: Any, backend: str, xp) -> bool:
    """Whether the monitor runs prepared steps: ``prepared`` (checked: they need the kernels, KVC-C008),
    by default on a GPU."""
    if prepared is None:
        return backend == "cuda" and xp is not np
    if check_bool(function, "prepared", prepared) and backend != "cuda":
        raise error("KVC-C008", function=function, argument="prepared", got=prepared, reason=NEEDS_KERNELS)
    return prepared


def follow(change, fast, graph, pending: Callable | None, plan, batch) -> tuple[Any, Callable | None]:
    """The paths after the sources changed: returns (the graph to keep, the TAIL phase to run).

    Parameters
    ----------
    change : Change
        What changed (:class:`~.sources.Change`); None: nothing did.
    fast, graph, plan
        The monitor's prepared steps, captured step and step plan.
    pending : callable or None
        The TAIL phase of the step open between pre_forward and post_forward, if any.
    batch : StepBatch or None
        That step's batch.
    """
    if change is None:
        return graph, pending
    if fast is not None:
        fast.forget() if change.kind == "reshaped" else fast.repoint(change.moves)
    if change.kind == "same":
        return graph, pending  # same memory, same geometry: a graph launches what it did
    stale = graph is not None and pending == graph.post
    stale = stale or change.kind == "reshaped" and fast is not None and pending == fast.post
    if pending is not None and stale:
        plan.prepare_inputs(batch, eager=False)  # the slots HEAD filled on the device, not again
        pending = _planned_tail(plan, batch)
    return None, pending  # a graph's kernels hold the old pointers
