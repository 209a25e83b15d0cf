"""Replay of repeated public CUDA calls (``_kernel_launch.run_launches``), on the CPU with a fake
driver and fake packed launches: when the glue runs, when it is packed, when it is replayed."""

from __future__ import annotations

import pytest

from kvcanary_numba._memo import Entry
from kvcanary_numba.launch import _kernel_launch, prepared
from kvcanary_numba.launch.recording import recording


class FakePacked:
    """Stands in for a PreparedLaunch: packs nothing, records its launches."""

    def __init__(self, kernel, signature, grid, block, args, raw=True):
        self.kernel, self.grid, self.block, self.raw = kernel, grid, block, raw
        self._func, self._params, self.args = f"func:{kernel}", f"params:{kernel}:{args}", list(args)

    def launch(self, stream=None):
        launched.append(("packed", self.kernel, _kernel_launch._current_stream_ptr()))


launched: list = []


@pytest.fixture
def gpu(monkeypatch):
    """The launch layer as on a GPU (device 0), with the fakes above."""
    launched.clear()
    monkeypatch.setattr(_kernel_launch, "ON_SIMULATOR", False)
    monkeypatch.setattr(_kernel_launch, "_current_device", lambda: 0)
    monkeypatch.setattr(prepared, "PreparedLaunch", FakePacked)
    monkeypatch.setattr(prepared._driver, "launch", lambda func, grid, block, stream, params: launched.append(
        ("replay", func, stream, params)))
    return monkeypatch


def glue(args=(1,)):
    """A launch-glue function making two launches, counting its runs."""

    def run(**kwargs):
        glue.runs += 1
        for kernel in ("a", "b"):
            if getattr(_kernel_launch._collecting, "sink", None) is None:
                launched.append(("glue", kernel, _kernel_launch._current_stream_ptr()))
            else:
                _kernel_launch.launch(kernel, "sig", 1, 32, args)

    return run


glue.runs = 0


def test_first_run_then_pack_then_replay(gpu):
    entry, run = Entry("cuda"), glue()
    glue.runs = 0
    _kernel_launch.run_launches(entry, run, {}, 7)  # first sight: the glue, on the call's stream
    assert launched == [("glue", "a", 7), ("glue", "b", 7)] and entry.launches is None
    launched.clear()
    entry.hits = 1
    _kernel_launch.run_launches(entry, run, {}, 7)  # the snapshot came back: packed while launched
    assert launched == [("packed", "a", 7), ("packed", "b", 7)] and len(entry.launches) == 2
    assert all(p.args == [] for p in entry.launches)  # packed launches keep no argument alive
    launched.clear()
    _kernel_launch.run_launches(entry, run, {}, 7)  # then: replayed, the glue does not run
    assert launched == [("replay", "func:a", 7, "params:a:(1,)"), ("replay", "func:b", 7, "params:b:(1,)")]
    assert glue.runs == 2


def test_another_stream_or_device_runs_the_glue_again(gpu):
    entry, run = Entry("cuda"), glue()
    entry.hits = 1
    _kernel_launch.run_launches(entry, run, {}, 7)
    launched.clear()
    _kernel_launch.run_launches(entry, run, {}, 9)  # another stream: packed again for it
    assert [item[0] for item in launched] == ["packed", "packed"] and entry.where == (9, 0)
    gpu.setattr(_kernel_launch, "_current_device", lambda: 1)
    launched.clear()
    _kernel_launch.run_launches(entry, run, {}, 9)  # another current device: function handles differ
    assert [item[0] for item in launched] == ["packed", "packed"] and entry.where == (9, 1)


def test_a_launch_that_cannot_be_packed_is_never_replayed(gpu):
    gpu.setattr(prepared, "PreparedLaunch", lambda *a: FakePacked(*a, raw=False))
    gpu.setattr(_kernel_launch, "_raw_launches", type("T", (), {"by_kernel": {}})())
    entry = Entry("cuda")
    entry.hits = 1
    with pytest.raises(Exception):  # noqa: B017 - the fallback tries Numba's launch of the fake kernel
        _kernel_launch.run_launches(entry, glue(), {}, 7)
    assert entry.launches is None


def test_no_replay_while_recording(gpu):
    entry, run = Entry("cuda"), glue()
    entry.hits = 1
    _kernel_launch.run_launches(entry, run, {}, 7)
    assert entry.launches is not None
    launched.clear()
    with recording() as rec:  # the monitor records its phases through the public calls
        _kernel_launch.run_launches(entry, run, {}, 7)
    assert [item[0] for item in launched] == ["glue", "glue"] and rec.launches == []
