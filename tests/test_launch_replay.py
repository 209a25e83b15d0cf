"""Eager raw launches and replay of repeated public CUDA calls (``fast/replay.py``), on the CPU with
a fake driver that decodes the parameter buffer of every raw launch: what runs, what is packed, what
is replayed, and that nothing stale is launched."""

from __future__ import annotations

import pytest
from launch_fakes import KERNEL_A, KERNEL_B, SIG, args_for, expected_values, gpu  # noqa: F401

from kvcanary_numba.fast import prepared as prepared_module, replay as _kernel_launch
from kvcanary_numba.fast.memo import Entry
from kvcanary_numba.fast.recording import recording
from kvcanary_numba.launch import _launch as _common


def glue(runs: list, ptr: int = 0x10000, scalar: int = -5):
    """A launch-glue function making two launches (kernels A and B) on arrays at ``ptr``."""

    def run(stream, **kwargs):
        runs.append(kwargs)
        _common.launch(KERNEL_A, SIG, 1, 32, args_for(ptr, scalar=scalar), stream)
        _common.launch(KERNEL_B, SIG, 3, 64, args_for(ptr + 0x8000, scalar=scalar), stream)

    return run


def raw_launches(gpu) -> list:
    return [(grid, block, stream, values) for kind, _, grid, block, stream, values in gpu.log if kind == "raw"]


def test_eager_launches_refill_one_packed_launch_per_kernel_with_every_argument(gpu):
    for ptr, scalar, grid in ((0x10000, -5, 1), (0x10000, 9, 2), (0x20000, 9, 7)):  # same arrays, then new ones
        args = args_for(ptr, scalar=scalar)
        with _common.sink(_kernel_launch.eager):
            _common.launch(KERNEL_A, SIG, grid, 32, args, 0)
        assert raw_launches(gpu)[-1] == (grid, 32, 0, expected_values(args))
    cached = list(gpu.driver.eager.by_kernel.values())
    assert len(cached) == 1 and cached[0].raw and cached[0].args == []  # no array kept alive


def test_first_run_then_pack_then_replay(gpu):
    entry, runs = Entry("cuda"), []
    run = glue(runs)
    want = [(1, 32, 7, expected_values(args_for(0x10000))), (3, 64, 7, expected_values(args_for(0x18000)))]
    _kernel_launch.run_launches(entry, run, {}, 7)  # first sight: the glue, on the call's stream
    assert raw_launches(gpu) == want and entry.launches is None
    gpu.log.clear()
    entry.hits = 1
    _kernel_launch.run_launches(entry, run, {}, 7)  # the snapshot came back: packed while launched
    assert raw_launches(gpu) == want and len(entry.launches) == 2
    assert all(p.args == [] for p in entry.launches)  # packed launches keep no argument alive
    gpu.log.clear()
    _kernel_launch.run_launches(entry, run, {}, 7)  # then: replayed, the glue does not run
    assert raw_launches(gpu) == want and len(runs) == 2


def test_another_stream_device_or_shared_chain_packs_again(gpu):
    from kvcanary_numba.fast import chain

    entry, runs = Entry("cuda"), []
    entry.hits = 1
    _kernel_launch.run_launches(entry, glue(runs), {}, 7)
    _kernel_launch.run_launches(entry, glue(runs), {}, 9)  # another stream: packed again for it
    assert len(runs) == 2 and entry.where[:2] == (9, 0)
    gpu.monkeypatch.setattr(gpu.driver, "current_device", lambda: 1)
    _kernel_launch.run_launches(entry, glue(runs), {}, 9)  # another device: function handles differ
    assert len(runs) == 3 and entry.where[:2] == (9, 1)
    _kernel_launch.run_launches(entry, glue(runs), {}, 9)
    assert len(runs) == 3  # replayed
    import numpy as np

    shared = chain.SharedChain(np, tokens=4, requests=2)
    with chain.sharing(shared, publish=True):  # the write glue reads it: not the same launches
        _kernel_launch.run_launches(entry, glue(runs), {}, 9)
        key = chain.replay_key()
    assert len(runs) == 4 and key[0] == "PUBLISH" and key in entry.where[2:]


def test_a_launch_that_cannot_be_packed_is_never_replayed(gpu):
    gpu.monkeypatch.setattr(gpu.driver, "function_handle", lambda kernel, signature: None)
    core: list = []
    gpu.monkeypatch.setattr(prepared_module, "run", core.append)  # the core's launch (the public API)
    gpu.monkeypatch.setattr(_kernel_launch, "run", core.append)
    entry, runs = Entry("cuda"), []
    entry.hits = 1
    for _ in range(2):
        _kernel_launch.run_launches(entry, glue(runs), {}, 7)
    assert entry.launches is None and len(runs) == 2
    assert gpu.log == [] and [spec.stream for spec in core] == [7] * 4  # the core's launch, every time


def test_no_replay_while_recording(gpu):
    entry, runs = Entry("cuda"), []
    entry.hits = 1
    _kernel_launch.run_launches(entry, glue(runs), {}, 7)
    assert entry.launches is not None
    gpu.log.clear()
    with recording() as rec:  # the monitor records its phases through the public calls
        _kernel_launch.run_launches(entry, glue(runs), {}, 7)
    assert gpu.log == [] and [s.kernel for s in rec.launches] == [KERNEL_A, KERNEL_B] and len(runs) == 2


def test_verified_replays_catch_what_the_snapshot_missed(gpu):
    # A glue reading state that is neither in the call's snapshot nor in LAUNCH_STATE: the pointer
    # it launches on moves while the snapshot stays the same. Verified replays refuse to launch.
    state = {"ptr": 0x10000}
    runs: list = []

    def run(stream, **kwargs):
        runs.append(kwargs)
        _common.launch(KERNEL_A, SIG, 1, 32, args_for(state["ptr"]), stream)

    entry = Entry("cuda")
    entry.hits = 1
    _kernel_launch.run_launches(entry, run, {}, 7)
    gpu.monkeypatch.setattr(_kernel_launch, "VERIFY_REPLAYS", True)
    _kernel_launch.run_launches(entry, run, {}, 7)  # unchanged: verified, then replayed
    assert len(raw_launches(gpu)) == 2 and len(runs) == 2
    state["ptr"] = 0x30000
    with pytest.raises(_kernel_launch.StaleLaunch, match=r"argument 0: \(196608"):
        _kernel_launch.run_launches(entry, run, {}, 7)
    assert len(raw_launches(gpu)) == 2  # nothing launched
