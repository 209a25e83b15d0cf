"""The per-step verdict word of a monitor in a job of several ranks, and acting on the merged word.

A tensor- or pipeline-parallel engine runs one monitor per rank. A rank that raises on its
own leaves the others waiting in their next collective, so with ``verdict=True`` a monitor
never raises from :meth:`~.monitor.CanaryMonitor.end_step`; instead:

1. at the end of each TAIL phase one launch writes the step's verdict word
   (:attr:`VerdictState.word`, int32 ``[VERDICT_LANES]``, layout in
   :mod:`kvcanary_numba.reference.verdict`) from the status block and the ring, on the
   device, with no host read (recorded into the prepared TAIL phase and captured with it);
2. the engine combines the words of all ranks with its own collective: one element-wise
   max (NCCL's ``ncclMax``, ``torch.distributed.all_reduce(op=MAX)``, ``jax.lax.pmax``;
   :func:`merge_verdicts` on the host);
3. every rank hands the merged word back (:meth:`~.monitor.CanaryMonitor.apply_verdict`)
   and acts on it: in mode ``raise`` every rank raises :class:`CanaryVerdictError` on the
   same call.

A merged word on the device is copied to pinned host memory in the current stream's order
and read on the NEXT call (waiting for that one copy only), so no call synchronises the host
with the current step; every rank then acts one call later, all on the same call. A NumPy
merged word (a host merge) is acted on at once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from .._interop import dlpack_only, native_array
from .._validate import check_array, check_bool, check_int
from ..constants import (
    VERDICT_FAIL_BITS,
    VERDICT_FORMAT,
    VERDICT_LANES,
    VERDICT_MAGIC,
    VERDICT_NEW_ROWS,
    VERDICT_PLAN_OVERFLOW,
    VERDICT_RANK,
    VERDICT_RING_FULL,
    VERDICT_SEQ,
    VERDICT_STALLED,
    FailReason,
    fail_reason_label,
)
from ..errors import error
from ..reference import verdict as reference_verdict
from .pump import CanaryViolationError
from .readback import MergedCopies
from .status import FIRST_PLAN_WORD

__all__ = [
    "CanaryVerdictError",
    "Verdict",
    "VerdictState",
    "apply_verdict",
    "check_rank",
    "decode_verdict",
    "flush_verdict",
    "merge_verdicts",
    "write_verdict",
]

logger = logging.getLogger("kvcanary_numba.monitor")

#: The int32 lane of group g's plan ``enable``: ``2 * FIRST_PLAN_WORD + PLAN_LANE_STRIDE * g``
#: (monitor/status.py: two int64 words, four int32 lanes, per group).
PLAN_LANE_STRIDE = 4


@dataclass(frozen=True, slots=True)
class Verdict:
    """A verdict word read on the host (one rank's, or the merge of several).

    Attributes
    ----------
    seq : int
        Verdicts written (the newest of the merged ranks').
    new_rows : int
        Violation rows recorded since the previous verdict (the most of any rank).
    rank : int or None
        The highest rank with new rows (None: no rank has any).
    ring_full, plan_overflow, stalled : bool
        Some rank's ring is full; some rank's plan overflowed this step; some rank's health
        check found launches that did not run.
    fail_bits : FailReason
        The fail bits of the new rows of every rank, OR-ed.
    """

    seq: int
    new_rows: int
    rank: int | None
    ring_full: bool
    plan_overflow: bool
    stalled: bool
    fail_bits: FailReason

    @property
    def stop(self) -> bool:
        """Whether mode ``raise`` stops on this verdict: new rows, or lost launches."""
        return self.new_rows > 0 or self.stalled

    def summary(self) -> str:
        """One line: what the verdict reports."""
        parts = []
        if self.new_rows:
            bits = "+".join(fail_reason_label(b) for b in FailReason if b & self.fail_bits) or "unstored"
            parts.append(f"{self.new_rows} new violation row(s) ({bits}; highest rank with rows: {self.rank})")
        if self.stalled:
            parts.append("launches that did not run")
        if self.ring_full:
            parts.append("a full violation ring")
        if self.plan_overflow:
            parts.append("a plan over its verify capacity")
        return f"verdict {self.seq}: " + (", ".join(parts) if parts else "clean")


def decode_verdict(function: str, word: np.ndarray, argument: str = "merged") -> Verdict:
    """The :class:`Verdict` of a host word (int32 [VERDICT_LANES], checked); KVC-M051 unless it is one."""
    lanes = [int(v) for v in word]
    bad = [i for i, v in enumerate(lanes) if v < 0]
    if lanes[VERDICT_FORMAT] != VERDICT_MAGIC or bad:
        got = f"lane {bad[0]} = {lanes[bad[0]]}" if bad else f"lane 0 = {lanes[VERDICT_FORMAT]:#x}"
        raise error("KVC-M051", function=function, argument=argument, got=got, magic=VERDICT_MAGIC)
    bits = FailReason(0)
    for b, flag in enumerate(lanes[VERDICT_FAIL_BITS:]):
        if flag:
            bits |= FailReason(1 << b)
    return Verdict(
        seq=lanes[VERDICT_SEQ],
        new_rows=lanes[VERDICT_NEW_ROWS],
        rank=lanes[VERDICT_RANK] - 1 if lanes[VERDICT_RANK] else None,
        ring_full=bool(lanes[VERDICT_RING_FULL]),
        plan_overflow=bool(lanes[VERDICT_PLAN_OVERFLOW]),
        stalled=bool(lanes[VERDICT_STALLED]),
        fail_bits=bits,
    )


def merge_verdicts(words) -> np.ndarray:
    """Combine verdict words of several ranks on the host: the element-wise max an all-reduce does.

    Parameters
    ----------
    words : list or tuple of arrays
        One word per rank, each int32 ``[VERDICT_LANES]`` (NumPy, or any CUDA array: copied
        to the host).

    Returns
    -------
    ndarray
        int32 ``[VERDICT_LANES]``: what each rank passes to ``apply_verdict``.

    Raises
    ------
    KvCanaryError
        KVC-M052 (no words), KVC-C002 / KVC-C003 / KVC-C004 (a word of another dtype or
        shape), KVC-M051 (a word that is no verdict).
    """
    fn = "merge_verdicts"
    if not isinstance(words, (list, tuple)) or not words:
        got = f"an empty {type(words).__name__}" if isinstance(words, (list, tuple)) else type(words).__name__
        raise error("KVC-M052", function=fn, argument="words", got=got)
    host = []
    for i, word in enumerate(words):
        word = native_array(fn, f"words[{i}]", word) if dlpack_only(word) else word
        info = check_array(fn, f"words[{i}]", word, dtype=np.int32, ndim=1, shape=(VERDICT_LANES,), contiguous=False)
        word = np.asarray(word) if info.kind == "numpy" else _to_host(word)
        decode_verdict(fn, word, f"words[{i}]")
        host.append(word)
    return reference_verdict.merge_verdicts(host)


def _to_host(word) -> np.ndarray:
    import cupy  # a CUDA word: CuPy reads any CUDA array interface

    return cupy.asnumpy(cupy.asarray(word))


def write_verdict(*, backend: str, **kwargs) -> None:
    """Write one verdict word: the NumPy specification or the kernel (through the fast wing's
    memo of internal glue on a GPU, so an eager step replays the packed launch)."""
    if backend == "numpy":
        reference_verdict.write_verdict(**kwargs)
        return
    from ..fast import glue_memo  # the kernels' glue: numba.cuda, not on the CPU path
    from ..launch import verdict as glue

    glue_memo.run_memoised("write_verdict", glue.write_verdict, kwargs)


class CanaryVerdictError(CanaryViolationError):
    """Raised on every rank, in mode ``raise``, by the call that acts on a merged verdict that
    reports new violation rows or lost launches (once per monitor).

    Attributes
    ----------
    verdict : Verdict
        The merged verdict.
    rank : int or None
        This monitor's rank.
    step : int
        Steps this monitor had ended at the call (the same on every rank).
    violations : list of Violation
        The rows this rank found (empty on a rank whose own KV is clean).
    """

    def __init__(self, verdict: Verdict, *, rank: int | None, step: int, violations):
        super().__init__(violations, rank=rank)
        self.verdict, self.step = verdict, step
        self.args = (
            f"kv-canary rank {rank}: every rank stops after {step} step(s): {verdict.summary()}; "
            f"this rank found {len(self.violations)} violation(s)" + "".join(f"\n{v.summary()}" for v in violations),
        )


class VerdictState:
    """A monitor's verdict word, its device state, and what acts on merged words.

    Parameters
    ----------
    xp : module
        NumPy or CuPy: the monitor's array module.
    status : StatusBlock
        The monitor's status block.
    ring : array, int64 [capacity, 8]
        The monitor's violation ring.
    num_groups : int
    rank : int or None
    mode : {"log", "raise"}
    placement : ArrayInfo
        Where the monitor's buffers live (a CUDA merged word must be on that device).
    """

    @classmethod
    def build(cls, function: str, verdict, monitor, *, placement) -> VerdictState | None:
        """The verdict of ``monitor`` (its array module, status block, ring, groups, rank and mode),
        or None for ``verdict=False`` (KVC-C010 unless a bool)."""
        if not check_bool(function, "verdict", verdict):
            return None
        return cls(
            xp=monitor.xp,
            status=monitor.status,
            ring=monitor.ring,
            num_groups=len(monitor.groups),
            rank=monitor.rank,
            mode=monitor.mode,
            placement=placement,
        )

    def __init__(self, *, xp, status, ring, num_groups: int, rank: int | None, mode: str, placement):
        self.xp, self.rank, self.mode, self.placement = xp, rank, mode, placement
        #: The step's word (int32 [VERDICT_LANES]): what the engine's collective combines.
        self.word = xp.zeros(VERDICT_LANES, dtype=np.int32)
        self.state = xp.zeros(2, dtype=np.int64)  # the write index last seen, verdicts written
        self.stalled = xp.zeros(1, dtype=np.int32)  # set once a health check fails (sticky)
        self.arguments = dict(
            status_lanes=status.words.view(np.int32),
            ring=ring,
            state=self.state,
            stalled=self.stalled,
            word=self.word,
            first_plan_lane=2 * FIRST_PLAN_WORD,
            plan_lane_stride=PLAN_LANE_STRIDE,
            num_groups=int(num_groups),
            rank=0 if rank is None else int(rank),
        )
        self.last: Verdict | None = None  # the merged verdict acted on last
        self._copies = None if xp is np else MergedCopies(VERDICT_LANES)
        self._raised = self._stall_seen = False
        self._health_seen = None

    def write(self, backend: str) -> None:
        """The verdict launch (the TAIL phase's last; no host read)."""
        write_verdict(backend=backend, **self.arguments)

    def observe(self, health) -> None:
        """Raise the sticky stalled flag when ``health`` has a new failed report (a device fill)."""
        report = health.last
        if report is not self._health_seen:
            self._health_seen = report
            if report is not None and not report.ok:
                self.stalled.fill(1)

    def apply(self, function: str, merged, *, step: int, violations) -> Verdict | None:
        """Act on the ranks' merged word (what ``CanaryMonitor.apply_verdict`` does).

        Parameters
        ----------
        function : str
            The caller, for error messages.
        merged : array, int32 [VERDICT_LANES]
            The element-wise max of every rank's :attr:`word`: a NumPy array (acted on now) or a
            CUDA array on the monitor's device, written in the order of the current stream
            (copied to the host in that order, acted on at the next call or :meth:`flush`).
        step : int
            The monitor's step count (named in the error).
        violations : list of Violation
            The rows this rank decoded so far (carried by the error).

        Returns
        -------
        Verdict or None
            The verdict acted on: ``merged``'s for a NumPy word, the previous call's for a CUDA
            word (None at the first call).

        Raises
        ------
        CanaryVerdictError
            Mode ``raise``: the first verdict acted on that has new rows or lost launches (once;
            later ones are logged, as in mode ``log``).
        KvCanaryError
            KVC-M051 (not a verdict word: e.g. a sum all-reduce), KVC-C007 (a CUDA word on another
            device, or for a monitor on the host), KVC-C002 / KVC-C003 / KVC-C004 / KVC-C006.
        """
        merged = native_array(function, "merged", merged) if dlpack_only(merged) else merged
        info = check_array(function, "merged", merged, dtype=np.int32, ndim=1, shape=(VERDICT_LANES,))
        if info.kind == "numpy":
            word = np.array(merged)
        else:
            here = self.placement
            if here.kind != "cuda" or (info.device is not None and info.device != here.device):
                where = "numpy" if here.kind != "cuda" else f"cuda:{here.device}"
                raise error(
                    "KVC-C007",
                    function=function,
                    argument="merged",
                    got=f"cuda:{info.device}",
                    reference="the monitor's buffers",
                    expected=where,
                )
            word = self._copies.push(info.ptr, merged)
        return None if word is None else self._act(function, word, step, violations)

    def flush(self, function: str, *, step: int, violations) -> Verdict | None:
        """Act on a merged word still being copied (end of a run; waits for its copy)."""
        word = None if self._copies is None else self._copies.take()
        return None if word is None else self._act(function, word, step, violations)

    def _act(self, function: str, word: np.ndarray, step: int, violations) -> Verdict:
        verdict = self.last = decode_verdict(function, word)
        if not verdict.stop:
            return verdict
        if self.mode == "raise" and not self._raised:
            self._raised = True
            raise CanaryVerdictError(verdict, rank=self.rank, step=step, violations=list(violations))
        if verdict.new_rows or not self._stall_seen:  # a stall is sticky: logged once
            self._stall_seen = self._stall_seen or verdict.stalled
            logger.warning("kv-canary rank %s: step %d: %s", self.rank, step, verdict.summary())
        return verdict


def apply_verdict(monitor, function: str, merged) -> Verdict | None:
    """``CanaryMonitor.apply_verdict``: :meth:`VerdictState.apply` for ``monitor`` (its step and rows);
    KVC-M050 on a monitor built without ``verdict=True``."""
    if monitor.verdict is None:
        raise error("KVC-M050", function=function)
    return monitor.verdict.apply(function, merged, step=monitor.step, violations=monitor.pump.violations)


def flush_verdict(monitor, function: str) -> Verdict | None:
    """``CanaryMonitor.flush``'s last part: act on a merged word still being copied (None: no verdict)."""
    if monitor.verdict is None:
        return None
    return monitor.verdict.flush(function, step=monitor.step, violations=monitor.pump.violations)


def check_rank(function: str, rank) -> int | None:
    """``rank`` as an int >= 0, or None (KVC-C011)."""
    return None if rank is None else check_int(function, "rank", rank, low=0, high=2**31 - 2)
