"""A long public write (its own published chain, then the tiled stamp) with the launch layer as
on a GPU: the glue's launches, then the packed ones, then the replayed ones, each run by the
simulator from its parameter slots (``launch_fakes.run_packed``), stamp what the reference
stamps, on the same launch scratch every call."""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest
from canary_helpers import HEAD, make_context, stamp, write_args, write_plan
from launch_fakes import launched, run_packed

from kvcanary_numba import launch_canary_write_kernel
from kvcanary_numba.fast import calls, chain, replay as _kernel_launch
from kvcanary_numba.fast.kernels import chain as chain_kernels, write_tiled
from kvcanary_numba.fast.memo import Memo
from kvcanary_numba.fast.prepared import PreparedLaunch
from kvcanary_numba.fast.scratch import STREAM_SCRATCH
from kvcanary_numba.launch import _launch as _common

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.fake_launch import gpu_launch_layer  # noqa: E402

pytestmark = [
    pytest.mark.simulator,
    pytest.mark.skipif(not _common.ON_SIMULATOR, reason="drives NumPy arrays through the kernel glue"),
]

LENGTHS = [40, 3, 21]  # request 1 is short; the capacity of 3 averages 21 tokens per request
SEEDS = [50, -1, 51]


def _case():
    n = sum(LENGTHS)
    ctx = make_context(130, ring_capacity=64)
    stamp(ctx, 50, 7, 4, HEAD)
    stamp(ctx, 51, 8, 9, HEAD)
    slots = [s if s < 50 else s + 2 for s in range(1, n + 1)]
    slots[30] = -1  # a skipped entry
    slots[45] = slots[44]  # a duplicate: the later entry wins
    positions = list(range(5, 5 + LENGTHS[0])) + list(range(LENGTHS[1])) + list(range(10, 10 + LENGTHS[2]))
    positions[60] += 1  # breaks the chain-position assert of request 2
    return ctx, write_args(write_plan(LENGTHS, SEEDS), range(500, 500 + n), positions, slots)


@pytest.mark.parametrize("verified", [False, True])
def test_glue_packed_and_replayed_long_writes_equal_the_reference(monkeypatch, verified):
    # verified: each replay is re-derived by the glue and compared with what it packed (StaleLaunch).
    monkeypatch.setattr(_kernel_launch, "VERIFY_REPLAYS", verified)
    monkeypatch.setattr(chain, "OWN_TILED_MIN_TOKENS", 16)
    monkeypatch.setattr(PreparedLaunch, "launch", run_packed)
    monkeypatch.setattr(calls.OPERATIONS["launch_canary_write_kernel"], "memo", Memo())  # the first call runs the glue
    want, kwargs = _case()
    got = want.replace(
        **{
            name: getattr(want, name).copy()
            for name in (
                "canary_buf",
                "violation_ring",
                "violation_write_index",
                "slot_run_counter",
                "kernel_run_counter",
            )
        }
    )
    launched.clear()
    restore = gpu_launch_layer()
    try:
        for _ in range(3):  # glue, packed, replayed
            launch_canary_write_kernel(context=got, backend="cuda", **kwargs)
        # The scratch of the launch layer's device and lane (another key once the layer is restored).
        published = [a for key, a in STREAM_SCRATCH.arrays(0).items() if key[0] == "published"]
    finally:
        restore()
    for _ in range(3):
        launch_canary_write_kernel(context=want, backend="numpy", **kwargs)
    for name in ("canary_buf", "violation_write_index", "slot_run_counter", "kernel_run_counter"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    rows = int(want.violation_write_index[0])
    assert rows >= 3  # the broken chain position, once per call
    assert sorted(map(tuple, got.violation_ring[:rows])) == sorted(map(tuple, want.violation_ring[:rows]))
    # chain_publish, then the tiled stamp, each call, on the same published scratch.
    stamp_signature = write_tiled.SIGNATURES[write_tiled.kernel_name(False, 0)][0]
    assert [signature for signature, _ in launched] == [
        chain_kernels.SIGNATURES["chain_publish"][0],
        stamp_signature,
    ] * 3
    pointers = {a.ctypes.data for a in published}
    assert all(pointers & set(ptrs) for _, ptrs in launched)
