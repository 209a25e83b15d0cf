"""Several monitors and the verdict word on GPUs: two monitors on one GPU, each on its own CuPy stream,
their hooks interleaved (prepared and graph-replayed paths); two monitors on two GPUs (skipped unless
there are two); the verdict word of the kernels against the NumPy path's, and merged words read back
one call later. A fault planted in one monitor's KV is reported by that monitor only."""

from __future__ import annotations

import pathlib
import sys
from collections import Counter

import numpy as np
import pytest

from kvcanary_numba.monitor import CanaryVerdictError
from kvcanary_numba.monitor.verdict import decode_verdict

pytestmark = pytest.mark.gpu

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

STEPS = 6
FLIP_BEFORE = 3
FLIPS = [("k", 1, 4, 0), ("v", 2, 6, 3)]  # (half, request, position, byte): KV written at the prefill


def _workload(xp, seed: int, **options):
    from benchmarks.workloads import MonitorWorkload

    return MonitorWorkload(
        xp, requests=4, prefix=12, max_steps=STEPS, bytes_per_token=64, seed=seed, mode=_all(), **options
    )


def _all():
    from kvcanary_numba import RealKvHashMode

    return RealKvHashMode.ALL


class Hooks:
    """One workload's steps as hook actions; ``engine`` and ``hook`` are contexts for the engine's own
    array work and for the monitor's calls (its stream, its device)."""

    def __init__(self, w, *, flips=(), engine=None, hook=None, graph=False):
        import contextlib

        self.w, self.flips, self.graph = w, flips, graph
        self.engine = engine or contextlib.nullcontext
        self.hook = hook or contextlib.nullcontext
        self.i = 0

    def actions(self) -> list:
        return [(self, "prefill")] + [(self, hook) for _ in range(STEPS) for hook in ("pre", "post", "end")]

    def run(self, what: str) -> None:
        w, m = self.w, self.w.monitor
        if what == "prefill":
            with self.engine():
                batch = w._batch(w.prefix)
                w.fill(batch, 0, w.prefix)
            with self.hook():
                m.pre_forward(batch)
            with self.engine():
                w.write_kv(batch)
            with self.hook():
                m.post_forward()
                m.end_step()
            if self.graph:
                with self.engine():
                    w.fill(w.batch, w.length, w.extend)
                with self.hook():
                    m.capture_graph(w.batch)
            return
        if what == "pre":
            with self.engine():
                if self.i == FLIP_BEFORE:
                    for half, request, position, byte in self.flips:
                        getattr(w, half)[int(w.table[request, position]), byte] ^= 1
                w.fill(w.batch, w.length, w.extend)
            with self.hook():
                m.pre_forward(w.batch)
        elif what == "post":
            with self.engine():
                w.write_kv(w.batch)
            with self.hook():
                m.post_forward()
        else:
            with self.hook():
                m.end_step()
            w.length += w.extend
            self.i += 1


def _interleave(seed: int, hooks) -> None:
    rng = np.random.default_rng(seed)
    queues = [h.actions() for h in hooks]
    while any(queues):
        live = [q for q in queues if q]
        queue = live[int(rng.integers(len(live)))]
        owner, what = queue.pop(0)
        owner.run(what)


def _rows(m) -> Counter:
    return Counter((v.tag, v.slot_idx, v.position, v.reasons) for v in m.violations)


def _alone_on_numpy(seed: int, flips) -> Counter:
    w = _workload(np, seed)
    h = Hooks(w, flips=flips)
    for _, what in h.actions():
        h.run(what)
    w.monitor.flush()
    return _rows(w.monitor)


@pytest.mark.parametrize("path", ["prepared", "graph"])
@pytest.mark.parametrize("order", [0, 1])
def test_gpu_two_monitors_on_one_gpu_each_on_its_stream(path, order):
    import cupy

    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(2)]
    a, b = _workload(cupy, 11), _workload(cupy, 12)
    cupy.cuda.Device().synchronize()  # built on the legacy stream, which the two streams do not wait for
    hooks = [
        Hooks(w, flips=flips, engine=lambda s=s: s, hook=lambda s=s: s, graph=path == "graph")
        for w, flips, s in ((a, FLIPS, streams[0]), (b, (), streams[1]))
    ]
    _interleave(order, hooks)
    for w, s in zip((a, b), streams):
        with s:
            w.monitor.flush()
    want = _alone_on_numpy(11, FLIPS)
    assert want and _rows(a.monitor) == want
    assert _rows(b.monitor) == Counter()
    if path == "graph":
        assert a.monitor.graph.replays == b.monitor.graph.replays == STEPS


def test_gpu_two_monitors_on_two_gpus_report_a_fault_on_one_device_only():
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    with cupy.cuda.Device(0):
        a = _workload(cupy, 11, verdict=True, rank=0)
    with cupy.cuda.Device(1):
        b = _workload(cupy, 11, verdict=True, rank=1)
    # The engine's array work runs on each workload's device; every monitor hook is called with
    # device 0 current: B's hooks must switch to device 1 themselves and switch back.
    hooks = [
        Hooks(a, engine=lambda: cupy.cuda.Device(0), hook=lambda: cupy.cuda.Device(0)),
        Hooks(b, flips=FLIPS, engine=lambda: cupy.cuda.Device(1), hook=lambda: cupy.cuda.Device(0)),
    ]
    _interleave(3, hooks)
    with cupy.cuda.Device(0):
        a.monitor.flush()
        b.monitor.flush()
        assert cupy.cuda.runtime.getDevice() == 0
    assert a.monitor.violations == []
    assert _rows(b.monitor) == _alone_on_numpy(11, FLIPS)
    assert b.monitor.verdict.word.device.id == 1 and a.monitor.verdict.word.device.id == 0
    with cupy.cuda.Device(1):
        assert int(b.monitor.verdict.state[0].get()) == len(b.monitor.violations)
    with cupy.cuda.Device(0):
        assert int(a.monitor.verdict.state[0].get()) == 0


@pytest.mark.parametrize("kind", ["prepared", "graph"])
def test_gpu_verdict_words_equal_the_numpy_paths_and_merged_words_act_one_call_later(kind):
    import cupy

    host = _workload(np, 5, verdict=True, rank=0)
    device = _workload(cupy, 5, verdict=True, rank=0, monitor_mode="raise")
    hooks = [Hooks(host, flips=FLIPS), Hooks(device, flips=FLIPS, graph=kind == "graph")]
    words, acted = [], []
    for h in hooks:
        h.run("prefill")
    for _ in range(STEPS):
        for what in ("pre", "post", "end"):
            for h in hooks:
                h.run(what)
        want = host.monitor.verdict.word.copy()
        got = device.monitor.verdict.word.get()
        assert got.tobytes() == want.tobytes()  # counts and OR-ed bits do not depend on row order
        words.append(want)
        try:
            acted.append(device.monitor.apply_verdict(device.monitor.verdict.word))  # a device word
        except CanaryVerdictError as exc:
            acted.append(exc.verdict)
            break
    assert acted[0] is None  # the first call only queues its copy
    for verdict, word in zip(acted[1:], words):
        assert verdict == decode_verdict("test", word)  # each call acts on the previous call's word
    assert any(v is not None and v.stop for v in acted)  # the flips stopped the run
