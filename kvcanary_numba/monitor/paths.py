"""Which path a monitor step takes: the eager step plan, the prepared steps, or a captured CUDA graph.

The backend (where the eager steps launch) and the prepared steps are fixed at construction
(:func:`resolve_paths`; the backend may be switched between steps: :func:`check_backend`).
Each HEAD phase then runs on the fastest path that fits its batch (:func:`run_head`): the
captured graph while the batch is the captured one, else the prepared steps, else the step
plan; the path of the HEAD phase runs the step's TAIL phase too.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np

from .._validate import ArrayInfo, check_bool, resolve_backend
from ..errors import error

__all__ = ["PREPARED_NEEDS_KERNELS", "check_backend", "check_capture", "resolve_paths", "run_head"]

PREPARED_NEEDS_KERNELS = "prepared steps launch the CUDA kernels: device='cuda' (or backend='cuda' under the simulator)"
_CAPTURE_NEEDS = "CUDA-graph capture needs device='cuda' (CuPy arrays on a GPU) and prepared steps"
_BUFFERS = "the monitor's buffers"


def resolve_paths(function: str, backend: str, prepared, placement: ArrayInfo, xp) -> tuple[str, bool]:
    """The monitor's resolved backend and whether it has prepared steps (default: on a GPU).

    Raises
    ------
    KvCanaryError
        ``resolve_backend``'s codes; KVC-C010 for a ``prepared`` that is no bool; KVC-C008 for
        prepared steps without the kernels.
    """
    backend = resolve_backend(function, backend, [(_BUFFERS, placement)])
    if prepared is not None and check_bool(function, "prepared", prepared) and backend != "cuda":
        raise error("KVC-C008", function=function, argument="prepared", got=prepared, reason=PREPARED_NEEDS_KERNELS)
    return backend, (backend == "cuda" and xp is not np if prepared is None else prepared)


def check_backend(function: str, backend: str, placement: ArrayInfo, *, prepared: bool) -> str:
    """The backend a monitor switches to (KVC-C008: with prepared steps, only ``"cuda"``)."""
    resolved = resolve_backend(function, backend, [(_BUFFERS, placement)])
    if prepared and resolved != "cuda":
        raise error("KVC-C008", function=function, argument="backend", got=backend, reason=PREPARED_NEEDS_KERNELS)
    return resolved


def check_capture(function: str, fast, xp, device: str) -> None:
    """KVC-C008 unless the monitor can capture a CUDA graph (prepared steps on a GPU)."""
    if fast is None or xp is np:
        raise error("KVC-C008", function=function, argument="device", got=device, reason=_CAPTURE_NEEDS)


def run_head(graph, fast, plan, batch, checked) -> Callable[[], None]:
    """Run the HEAD phase of ``batch`` (checked) on the fastest path; returns its TAIL phase.

    ``checked`` is the batch checks' record of the fields just checked (what lets a graph
    match without comparing every field again).
    """
    if graph is not None and graph.matches(batch, checked):
        graph.pre()
        return graph.post
    if fast is not None:
        fast.pre(batch)
        return fast.post
    plan.head(batch, *plan.prepare_inputs(batch))
    # TAIL stamps what HEAD planned: the arrays of this moment, as the prepared and graph paths
    # (which bind them now) do, even if the engine reassigns a batch field before post_forward.
    planned = copy.copy(batch)
    return lambda: plan.tail(planned)
