"""``benchmarks.timing.device_times`` against a model of a stream (no GPU): the events time the
GPU's work only when the spin kernel outlasts the host's enqueueing, and a batch whose spin ran
out first is timed again behind a longer spin. No real timing is asserted."""

from __future__ import annotations

import pathlib
import sys
import types

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import timing  # noqa: E402


class Stream:
    """One host clock and one in-order GPU queue, in µs: work starts when both the host has
    queued it and the GPU has finished what came before."""

    def __init__(self, host_us: float, gpu_us: float):
        self.host = self.gpu = 0.0
        self.host_us, self.gpu_us = host_us, gpu_us
        self.spins: list[int] = []

    def queue(self, duration: float) -> float:
        self.gpu = max(self.gpu, self.host) + duration
        return self.gpu

    def spin(self, microseconds: int) -> None:
        self.spins.append(microseconds)
        self.queue(microseconds)

    def call(self, _i: int) -> None:  # the timed call: host work, then one kernel
        self.host += self.host_us
        self.queue(self.gpu_us)

    def synchronize(self) -> None:
        self.host = max(self.host, self.gpu)


@pytest.fixture
def stream(monkeypatch):
    model = Stream(host_us=0.0, gpu_us=0.0)

    class Event:
        def record(self, _stream=None):
            self.at = model.queue(0.0)

        def synchronize(self):
            model.synchronize()

        @property
        def done(self):  # cudaEventQuery: the GPU has passed the event by the host's present
            return self.at <= model.host

    cuda = types.SimpleNamespace(
        Event=Event,
        get_current_stream=lambda: types.SimpleNamespace(synchronize=model.synchronize),
        get_elapsed_time=lambda a, b: (b.at - a.at) / 1e3,  # milliseconds, as CuPy's
    )
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(timing, "_spin", model.spin)
    monkeypatch.setattr(timing, "synchronize", model.synchronize)
    return model


def test_a_spin_that_outlasts_the_host_times_the_gpu_once(stream):
    stream.host_us, stream.gpu_us = 20.0, 7.0
    result = timing.device_times(stream.call, iters=20, host_us=60)
    assert result["median_us"] == pytest.approx(7.0)
    assert result["host_bound"] is False
    assert len(stream.spins) == 1 and result["spin_us"] == stream.spins[0]


def test_a_host_slower_than_the_spin_is_timed_again_behind_a_longer_spin(stream):
    # 20 calls of 500 µs of host time outlast the first spin (2000 + 20 x 90 µs): the GPU waits for
    # the host and the later calls' events time the host. The second spin, 4x as long, covers them.
    stream.host_us, stream.gpu_us = 500.0, 7.0
    result = timing.device_times(stream.call, iters=20, host_us=60)
    first = 2000 + 20 * (60 + 30)
    assert stream.spins == [first, 4 * first]
    assert result["median_us"] == pytest.approx(7.0)
    assert result["host_bound"] is False and result["spin_us"] == 4 * first


def test_a_host_no_spin_outlasts_is_reported(stream):
    stream.host_us, stream.gpu_us = 10_000.0, 7.0
    result = timing.device_times(stream.call, iters=20, host_us=60)
    first = 2000 + 20 * (60 + 30)
    assert stream.spins == [first * 4**k for k in range(timing.RESPINS + 1)]
    assert result["host_bound"] is True and result["spin_us"] == stream.spins[-1]
    assert result["median_us"] > 7.0  # what such a batch times: kept, and flagged


def test_the_markdown_marks_a_host_bound_median():
    from benchmarks.report import markdown

    records = [
        {"op": "verify", "variant": "NONE", "entries": 64, "median_us": 46.4, "p90_us": 1857.0, "host_bound": True},
        {"op": "verify", "variant": "ALL", "entries": 64, "median_us": 13.6, "p90_us": 14.4, "host_bound": False},
    ]
    table = markdown({"name": "t"}, records, [])
    assert "| NONE | 64 | 46.4 (host-bound) | 1857 |" in table
    assert "| ALL | 64 | 13.6 | 14.4 |" in table
