"""Two monitors in one process, their hooks called in random interleavings (A.pre, B.pre, A.post,
B.end, ...), on the kernels under the simulator, eager and prepared: a fault planted in one monitor's
KV is reported by that monitor only, with the rows a monitor run alone on the NumPy path reports."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from monitor_helpers import DECODE, PREFILL, Driver, token_bytes

from kvcanary_numba.launch import _launch as _common

pytestmark = [
    pytest.mark.simulator,
    pytest.mark.skipif(not _common.ON_SIMULATOR, reason="drives NumPy arrays through the kernels (simulator)"),
]

STEPS = (PREFILL, DECODE, {1: [(105, 7)]})
FAULT = (1, 3)  # before step 1, flip a K byte of slot 3 (written at step 0)


class Stepper:
    """One monitor's step, hook by hook: ``pre``, ``post`` (after the forward's KV writes), ``end``."""

    def __init__(self, driver: Driver, fault: tuple[int, int] | None):
        self.d, self.fault, self.index, self.batch = driver, fault, 0, None

    def actions(self) -> list:
        return [(self, hook) for _ in STEPS for hook in ("pre", "post", "end")]

    def run(self, hook: str) -> None:
        d, new = self.d, STEPS[self.index]
        if hook == "pre":
            if self.fault is not None and self.fault[0] == self.index:
                d.k[self.fault[1], 0] ^= 1
            self.batch = d.batch(new)
            d.monitor.pre_forward(self.batch)
        elif hook == "post":
            for token, slot in zip(self.batch.input_ids, self.batch.out_cache_loc):
                d.k[slot] = token_bytes(int(token), 0)
                d.v[slot] = token_bytes(int(token), 1)
            d.monitor.post_forward()
        else:
            for row, tokens in new.items():
                d.requests[row] += tokens
            d.monitor.end_step()
            self.index += 1


def _interleaved(rng, steppers) -> None:
    queues = [s.actions() for s in steppers]
    while any(queues):
        live = [q for q in queues if q]
        queue = live[int(rng.integers(len(live)))]
        stepper, hook = queue.pop(0)
        stepper.run(hook)


def _rows(d: Driver) -> Counter:
    return Counter(d.rows())  # the kernels append rows in atomic order: compare as multisets


def _alone_on_numpy(fault) -> Counter:
    d = Driver()
    s = Stepper(d, fault)
    for _, hook in s.actions():
        s.run(hook)
    d.monitor.flush()
    return _rows(d)


@pytest.mark.parametrize("prepared", [False, True], ids=["eager", "prepared"])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_fault_in_one_monitors_kv_is_reported_by_that_monitor_only(prepared, seed):
    want = _alone_on_numpy(FAULT)
    assert want and all(reasons == ("verify_real_kv_hash",) for *_, reasons in want)
    a = Driver(backend="cuda", prepared=prepared)
    b = Driver(backend="cuda", prepared=prepared)
    _interleaved(np.random.default_rng(seed), [Stepper(a, FAULT), Stepper(b, None)])
    a.monitor.flush()
    b.monitor.flush()
    assert _rows(a) == want
    assert _rows(b) == Counter()
    # Each monitor's records are its own: B's canary buffer is what B alone would hold.
    alone = Driver(backend="cuda", prepared=prepared)
    s = Stepper(alone, None)
    for _, hook in s.actions():
        s.run(hook)
    for g_b, g_alone in zip(b.monitor.groups, alone.monitor.groups):
        for e_b, e_alone in zip(g_b.tail, g_alone.tail):
            assert np.array_equal(e_b.context.canary_buf, e_alone.context.canary_buf)


def test_verdict_words_of_interleaved_monitors_are_each_their_own():
    a = Driver(backend="cuda", prepared=True, verdict=True, rank=0)
    b = Driver(backend="cuda", prepared=True, verdict=True, rank=1)
    _interleaved(np.random.default_rng(7), [Stepper(a, FAULT), Stepper(b, None)])
    word_a, word_b = a.monitor.verdict.word, b.monitor.verdict.word
    assert word_a[1] == word_b[1] == len(STEPS)  # one word per TAIL phase each
    assert b.monitor.verdict.state[0] == 0 and word_b[2:].sum() == 0  # B saw no row, ever
    assert a.monitor.verdict.state[0] == sum(_alone_on_numpy(FAULT).values())  # A's state saw A's rows
