"""One rank of a job: a toy engine with its monitor, stepped in lockstep with the other ranks.

Every step each rank writes its verdict word (the monitor does, at the end of the step's TAIL
phase), the ranks combine their words with an element-wise max (``allreduce_max``: NCCL in
``nccl_ranks.py``, a pipe to a coordinator in ``cpu_ranks.py``), and every rank hands the merged
word back to its monitor. In mode ``raise`` the call that acts on a word reporting violation rows
raises :class:`~kvcanary_numba.monitor.CanaryVerdictError` on every rank at once, so every rank
leaves the loop at the same step and none is left waiting in a collective.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np

from kvcanary_numba.constants import VERDICT_LANES, VERDICT_MAGIC
from kvcanary_numba.engine import EngineConfig, ToyEngine
from kvcanary_numba.monitor import CanaryVerdictError, CanaryViolationError

__all__ = ["run_rank"]


def run_rank(
    rank: int,
    *,
    allreduce_max: Callable,
    device: str = "cpu",
    steps: int = 40,
    fault_rank: int | None = None,
    fault_step: int = 6,
    seed: int = 0,
    verdict: bool = True,
) -> dict:
    """Run ``steps`` engine steps of rank ``rank``; returns what happened (a JSON-able dict).

    ``allreduce_max(word)`` takes this rank's verdict word and returns the element-wise max of every
    rank's word (a NumPy array, or a CUDA array written in the current stream's order).
    ``fault_rank`` gets one KV byte flipped at ``fault_step`` (or the first step after it with a
    running request); every rank runs the same workload (``seed``), as tensor-parallel ranks do.

    ``verdict=False`` shows what the verdict prevents: each monitor raises on its own rows from
    ``end_step``, and the collective (standing for the engine's own, e.g. tensor-parallel
    activations) goes on with a word that reports nothing; the corrupted rank leaves the loop alone.
    """
    faults = {"kv_byte_flip": fault_step} if rank == fault_rank else ()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the toy engine's monitor keeps the expected-token check on
        engine = ToyEngine(EngineConfig(seed=seed), device=device, faults=faults)
        monitor = engine.attach_monitor(mode="raise", verdict=verdict, rank=rank, health_interval=0)
    outcome = {"rank": rank, "stopped_at": None, "found_by": None, "own_rows": 0}
    quiet = np.zeros(VERDICT_LANES, dtype=np.int32)
    quiet[0] = VERDICT_MAGIC  # without a verdict: what the engine's own collective carries
    try:
        while engine.step_index < steps:
            engine.step()  # pre_forward, the forward's KV writes, post_forward (writes the word), end_step
            if verdict:
                monitor.apply_verdict(allreduce_max(monitor.verdict.word))
            else:
                allreduce_max(quiet if device == "cpu" else monitor.xp.asarray(quiet))
        monitor.flush()  # a merged word still being copied (device words are read one call later)
    except CanaryVerdictError as exc:
        outcome.update(
            stopped_at=engine.step_index - 1, found_by=exc.verdict.rank, own_rows=len(exc.violations), message=str(exc)
        )
    except CanaryViolationError as exc:  # verdict=False: this rank alone
        outcome.update(stopped_at=engine.step_index - 1, found_by=rank, own_rows=len(exc.violations), message=str(exc))
    outcome["faults"] = [(f.kind, f.step) for f in engine.faults]
    return outcome
