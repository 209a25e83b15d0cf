"""The monitor's eager GPU path (``prepared=False``: the step plan every step) and the memo of its
endpoint glue (``fast/glue_memo.py``): results byte-equal to the NumPy monitor on the
simulator, and with the launch layer as on a GPU (packing, eager refills, replays) whose raw
launches the simulator runs from their packed parameters; what takes the full path again;
that nothing cached keeps an array alive."""

from __future__ import annotations

import gc
import os
import pathlib
import re
import subprocess
import sys
import weakref
from types import SimpleNamespace

import numpy as np
import pytest
from launch_fakes import KERNEL_A, SIG, args_for, gpu, launched, run_packed  # noqa: F401
from monitor_helpers import monitor_run

from kvcanary_numba.fast import endpoints, glue_memo, replay as _kernel_launch
from kvcanary_numba.fast.chain import SharedChain
from kvcanary_numba.fast.memo import Memo, Uncacheable
from kvcanary_numba.fast.prepared import PreparedLaunch
from kvcanary_numba.launch import _launch as _common

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.fake_launch import gpu_launch_layer  # noqa: E402

simulated = pytest.mark.skipif(not _common.ON_SIMULATOR, reason="drives NumPy arrays through the kernel glue")

#: Two requests of 4 cached tokens, 5 decode steps; a K and a V byte of cached slots flipped before step 3.
CASE = dict(requests=2, prefix=4, bytes_per_token=32, steps=5, flips=[("k", 1, 1, 0), ("v", 2, 2, 3)])


def _assert_equal(got: dict, want: dict) -> None:
    assert want["violations"].shape[0] >= 2  # the flipped K and V bytes were caught
    assert set(got) == set(want)
    for name, array in want.items():
        np.testing.assert_array_equal(got[name], array, err_msg=name)


@pytest.fixture
def replaying(monkeypatch):
    """The launch layer as on a GPU (``benchmarks/fake_launch.py``), raw launches run by the
    simulator from their parameter slots (:func:`launch_fakes.run_packed`), a fresh glue memo;
    yields how often each endpoint glue ran."""
    runs = {"verifies": 0, "writes": 0}

    def counted(name, glue):
        def run(**kwargs):
            runs[name] += 1
            glue(**kwargs)

        return run

    monkeypatch.setattr(endpoints, "_verifies", counted("verifies", endpoints._verifies))
    monkeypatch.setattr(endpoints, "_writes", counted("writes", endpoints._writes))
    monkeypatch.setattr(PreparedLaunch, "launch", run_packed)
    monkeypatch.setattr(glue_memo, "MEMO", Memo(size=256))
    launched.clear()
    restore = gpu_launch_layer()
    try:
        yield runs
    finally:
        restore()


@pytest.mark.simulator
@simulated
def test_eager_kernel_steps_equal_the_numpy_monitor():
    # The simulator: the glue runs every call (nothing is packed), through the memo's entry point.
    want, _ = monitor_run(np, "numpy", **CASE)
    got, m = monitor_run(np, "eager", **CASE)
    assert m.fast is None and m.backend == "cuda"
    _assert_equal(got, want)


@pytest.mark.simulator
@simulated
@pytest.mark.parametrize("verified", [False, True])
def test_replayed_eager_steps_equal_the_numpy_monitor(replaying, monkeypatch, verified):
    # verified: every replay is re-derived by the glue and compared with what it packed (StaleLaunch).
    monkeypatch.setattr(_kernel_launch, "VERIFY_REPLAYS", verified)
    want, _ = monitor_run(np, "numpy", **CASE)
    got, _ = monitor_run(np, "eager", **CASE)
    _assert_equal(got, want)
    # 6 steps (prefill + 5 decode) of 6 launches, each run once, from packed parameters.
    assert len(launched) == 36
    if not verified:
        # Verifies: HEAD and TAIL keys, seen first at the prefill, packed at decode step 0, then replayed.
        # Writes: the prefill's batch is other arrays; the decode keys run at steps 0 and 1 only.
        assert replaying == {"verifies": 4, "writes": 6}


def _reassign_input_ids(kept: list):
    def hook(i, w):
        if i == 3:  # writes replay since step 2: a new token array, the old one kept alive with other tokens
            kept.append(w.batch.input_ids)
            w.batch.input_ids = w.batch.input_ids.copy()
            kept.append(w.batch.input_ids)
            kept.append(len(launched))

    return hook


@pytest.mark.simulator
@simulated
def test_a_reassigned_token_array_takes_the_full_path(replaying):
    want, _ = monitor_run(np, "numpy", **CASE, before_step=_reassign_input_ids([]))
    kept: list = []
    got, _ = monitor_run(np, "eager", **CASE, before_step=_reassign_input_ids(kept))
    _assert_equal(got, want)  # a stale pointer would stamp step 2's tokens again
    old, new, mark = kept
    pointers = [ptrs for _, ptrs in launched[mark:]]
    assert any(new.ctypes.data in p for p in pointers)
    assert not any(old.ctypes.data in p for p in pointers)
    assert replaying["writes"] == 6 + 4  # HEAD and TAIL writes at steps 3 (first sight) and 4 (packed)


def _new_shape(i, w):
    if i == 3:  # two tokens per request from here on: every per-step array is new, and longer
        w.extend = 2
        w.batch = w._batch(2)


@pytest.mark.simulator
@simulated
def test_a_batch_of_another_shape_takes_the_full_path(replaying):
    want, _ = monitor_run(np, "numpy", **CASE, before_step=_new_shape, room=2)
    got, _ = monitor_run(np, "eager", **CASE, before_step=_new_shape, room=2)
    _assert_equal(got, want)
    assert replaying["writes"] == 6 + 4


@pytest.mark.simulator
@simulated
@pytest.mark.parametrize("layer", ["simulator", "as on a GPU"])
def test_a_replaced_batch_is_not_kept_alive(request, layer):
    if layer != "simulator":
        request.getfixturevalue("replaying")
    refs, kept = [], []

    def hook(i, w):
        if i == 3:  # steps 0-2 made, packed and replayed the launches of this batch
            refs.extend(weakref.ref(a) for a in w.batch.fields() if a is not None and a is not w.req_to_token)
            w.batch = w._batch(1)
            kept.append(w)  # the workload, its new batch and (below) the monitor outlive the run

    _, m = monitor_run(np, "eager", **CASE, before_step=hook)
    gc.collect()
    assert len(refs) == 6 and all(ref() is None for ref in refs)
    assert m.fast is None and kept[0].batch.input_ids is not None


@pytest.mark.simulator
@simulated
def test_host_step_on_the_eager_path_makes_every_launch_of_the_step():
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.host_step",
            "--path",
            "eager",
            "--steps",
            "20",
            "--requests",
            "3",
            "--prefix",
            "4",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, NUMBA_ENABLE_CUDASIM="1"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # 2 plan launches, then per phase the fused verify and write of K and V: eager, packed or replayed.
    assert "eager path, launch layer as on a GPU, 6 raw launches per step" in done.stdout, done.stdout
    assert re.search(r"eager +pre\+post +median +[\d.]+ us", done.stdout), done.stdout


# --- the memo on the launch layer alone (fake kernels and driver: tests/launch_fakes.py) ----------


def _glue(runs: list):
    def run(*, tokens, scale, stream=None):
        runs.append(tokens)
        _common.launch(KERNEL_A, SIG, 1, 32, args_for(0x10000, scalar=scale), stream)

    return run


def test_first_run_then_pack_then_replay_and_a_new_object_runs_again(gpu, monkeypatch):
    monkeypatch.setattr(glue_memo, "MEMO", Memo(size=8))
    runs: list = []
    tokens = np.zeros(4, dtype=np.int64)
    for _ in range(4):
        glue_memo.run_memoised("glue", _glue(runs), dict(tokens=tokens, scale=3))
    assert len(runs) == 2 and len(gpu.log) == 4  # first run, packed, then replayed twice
    copy = tokens.copy()  # same shape, dtype and contents: a new object all the same
    glue_memo.run_memoised("glue", _glue(runs), dict(tokens=copy, scale=3))
    glue_memo.run_memoised("glue", _glue(runs), dict(tokens=tokens, scale=4))
    assert len(runs) == 4 and runs[2] is copy


def test_keys_follow_objects_layouts_and_scalars():
    chain = SharedChain(np, tokens=4, requests=2)
    tokens = np.zeros(4, dtype=np.int64)

    def key(**changes):
        kwargs = {**dict(tokens=tokens, chain=chain, flag=True), **changes}
        return glue_memo.key("writes", kwargs)

    base = key()
    assert key() == base
    assert key(tokens=tokens.copy()) != base  # a new object
    assert key(flag=False) != base
    assert key(tokens=tokens[:2]) != base  # a view: another object and shape
    other = SharedChain(np, tokens=4, requests=2)
    assert key(chain=other) != base  # the chain's scratch arrays
    tokens.shape = (2, 2)  # in place: the same object, another layout
    assert key() != base
    with pytest.raises(Uncacheable):
        key(tokens=object())  # nothing the walk knows: the glue runs unmemoised


class _FakeCupyArray:
    """What the memo reads of a CuPy array (its walker is picked by the class's module)."""

    __module__ = "cupy._core.core"

    def __init__(self, ptr: int, shape: tuple):
        self._ptr, self.shape, self.strides, self.dtype = ptr, shape, (8,), np.dtype(np.int64)

    @property
    def data(self):  # a property, as CuPy's: the walker is chosen from the class
        return SimpleNamespace(ptr=self._ptr)


def test_cupy_arrays_are_keyed_by_pointer_as_in_the_public_memo():
    # An engine that allocates its per-step arrays anew gets them back at the same addresses from
    # CuPy's pool: equal pointers and layouts pack equal launches, so those calls replay.
    def key(tokens):
        return glue_memo.key("writes", dict(tokens=tokens, flag=True))

    base = key(_FakeCupyArray(0x1000, (4,)))
    assert key(_FakeCupyArray(0x1000, (4,))) == base  # another object at the same address
    assert key(_FakeCupyArray(0x2000, (4,))) != base
    assert key(_FakeCupyArray(0x1000, (5,))) != base


def test_a_freed_argument_is_not_kept_alive_by_the_memo(gpu, monkeypatch):
    monkeypatch.setattr(glue_memo, "MEMO", Memo(size=8))
    runs: list = []
    tokens = np.zeros(4, dtype=np.int64)
    for _ in range(3):
        glue_memo.run_memoised("glue", _glue(runs), dict(tokens=tokens, scale=3))
    assert glue_memo.MEMO.get(glue_memo.key("glue", dict(tokens=tokens, scale=3))).launches
    ref = weakref.ref(tokens)
    runs.clear()
    del tokens
    gc.collect()
    assert ref() is None
