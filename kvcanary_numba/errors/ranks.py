"""Codes KVC-M050 and on: monitors in a job of several ranks (the verdict word and its merge)."""

from __future__ import annotations

from .registry import define

#: Two ranks' monitors (one process stands for two here), each through one clean step.
_RANKS = (
    "import kvcanary_numba as kc\n"
    "import numpy as np\n"
    "{extra}"
    "\n"
    "rtt = np.array([[0] * 4, [10, 11, 12, 13]], np.int32)\n"
    "batch = kc.StepBatch(req_pool_indices=np.array([1]), prefix_lens=np.array([0]),\n"
    "                     extend_seq_lens=np.array([4]), req_to_token=rtt,\n"
    "                     input_ids=np.arange(101, 105), positions=np.arange(4),\n"
    "                     out_cache_loc=np.arange(10, 14))\n"
    "ranks = []\n"
    "for rank in (0, 1):  # one monitor per rank\n"
    "    full = kc.KvGroup(kind='full', num_slots=64, has_v=False)  # K only\n"
    "    m = kc.CanaryMonitor(full=full, write_req_capacity=1, mode='raise',\n"
    "                         {options})\n"
    "    with m.forward(batch):\n"
    "        pass  # the engine writes the step's KV here\n"
    "    m.end_step()\n"
    "    ranks.append(m)\n"
)
_MERGE = "from kvcanary_numba.monitor import merge_verdicts\n"


def _ranks(options: str = "verdict=True, rank=rank", extra: str = "") -> str:
    return _RANKS.format(options=options, extra=extra)


define(
    "KVC-M050",
    title="Verdict asked of a monitor built without one",
    message="{function}: the monitor was built without verdict=True: it writes no verdict word to merge or apply",
    meaning=(
        "In a job of several ranks, a rank that raised on its own violation would leave the others "
        "waiting in their next collective. A monitor built with verdict=True writes a small verdict word "
        "at the end of each step's TAIL phase (on the device, no host read); the engine combines the "
        "words of all ranks with an element-wise max (its own all-reduce) and hands the result to "
        "apply_verdict on every rank, which then raises on all of them at the same call. A monitor "
        "built without it keeps SGLang's behaviour (each rank reports alone) and has no word."
    ),
    triggers=(
        "Calling apply_verdict on a monitor constructed without verdict=True.",
        "Building the monitors of a multi-rank job from a configuration that leaves the verdict off.",
    ),
    solutions=(
        "Pass verdict=True (and rank=) to CanaryMonitor on every rank.",
        "In a job of one process, leave apply_verdict out: end_step reports by itself.",
    ),
    before=_ranks("rank=rank")
    + "for m in ranks:  # built without verdict=True: no word\n    m.apply_verdict(np.zeros(16, np.int32))",
    after=_ranks(extra=_MERGE)
    + "merged = merge_verdicts([m.verdict.word for m in ranks])  # the all-reduce, on the host\n"
    "for m in ranks:\n"
    "    m.apply_verdict(merged)",
    defensive="if m.verdict is not None:\n    m.apply_verdict(m.verdict.word)",
    prevention="Build every rank's monitor with the same options, verdict=True and its own rank.",
    related=("KVC-M051", "KVC-M001"),
    extension=True,
)

define(
    "KVC-M051",
    title="Not a verdict word",
    message=(
        "{function}: {argument} is not a verdict word ({got}); lane 0 of one is {magic:#x} and no lane is negative"
    ),
    meaning=(
        "A verdict word is int32 [16]: lane 0 holds a fixed format tag and every other lane a flag or a "
        "count, all >= 0, so that the element-wise max of the words of all ranks is again a verdict word. "
        "A word whose tag is wrong did not come from a monitor's verdict, or was combined with another "
        "operation than max: a sum multiplies the tag, a minimum or an average loses the flags of the "
        "rank that found a violation."
    ),
    triggers=(
        "All-reducing the words with a sum (NCCL's default ncclSum, torch.distributed's ReduceOp.SUM).",
        "Passing a buffer the collective has not written yet, or another tensor of the same shape.",
    ),
    solutions=(
        "Combine the words with a max (ncclMax, ReduceOp.MAX, jax.lax.pmax) or merge_verdicts on the host.",
        "Pass the collective's output buffer, in the order of the current stream.",
    ),
    before=_ranks() + "merged = ranks[0].verdict.word + ranks[1].verdict.word  # a sum, not a max\n"
    "for m in ranks:\n"
    "    m.apply_verdict(merged)",
    after=_ranks(extra=_MERGE) + "merged = merge_verdicts([m.verdict.word for m in ranks])  # the element-wise max\n"
    "for m in ranks:\n"
    "    m.apply_verdict(merged)",
    defensive="merged = np.maximum.reduce(words)  # what an all-reduce with op=max computes",
    prevention="Wrap the engine's all-reduce of verdict words in one function that names the max.",
    related=("KVC-M050", "KVC-M052"),
    extension=True,
)

define(
    "KVC-M052",
    title="No verdict words to merge",
    message="{function}: {argument} must be a non-empty list or tuple of verdict words, got {got}",
    meaning=(
        "merge_verdicts is the host form of the all-reduce that combines the ranks' verdict words: the "
        "element-wise max of one word per rank. With no word there is no verdict to act on, and a "
        "generator or a single array is refused rather than guessed at."
    ),
    triggers=(
        "Gathering the words of the ranks into a list that stayed empty (no rank reported).",
        "Passing one word (an array) instead of a list of words.",
    ),
    solutions=("Pass a list with one word per rank, each int32 [16].",),
    before=_ranks(extra=_MERGE) + "words = [m.verdict.word for m in ranks if m.rank > 1]  # no such rank\n"
    "merged = merge_verdicts(words)",
    after=_ranks(extra=_MERGE) + "words = [m.verdict.word for m in ranks]  # one word per rank\n"
    "merged = merge_verdicts(words)\n"
    "for m in ranks:\n"
    "    m.apply_verdict(merged)",
    defensive="merged = merge_verdicts(list(words)) if words else None",
    prevention="Collect exactly one word per rank before merging (a gather of the ranks' words).",
    related=("KVC-M051",),
    extension=True,
)
