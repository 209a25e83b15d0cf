"""The verify and the write of all endpoints of a phase in one launch each (``fast/endpoints.py``,
``fast/kernels/endpoints.py``) against one plain launch per endpoint and the NumPy reference, byte for
byte: canary buffers, counters, write indices, ring rows (as multisets), on random decode steps
with a fault of every class the monitor tests plant."""

from __future__ import annotations

import numpy as np
import pytest
from endpoint_worlds import PATHS, TAGS, random_world, run_step

from kvcanary_numba import FailReason, RealKvHashMode
from kvcanary_numba.launch import _launch as _common

pytestmark = pytest.mark.simulator
F = FailReason

#: (name, world options, launches of the fused step: HEAD and TAIL verify + write, unless a phase falls back).
CASES = [
    ("shared ring, ALL, tokens, assert", {}, 4),
    ("own rings, PARTIAL, no token check", dict(shared_ring=False, mode=RealKvHashMode.PARTIAL, check_tokens=False), 4),
    ("two sources each, no assert", dict(nsrc=(2, 2), asserted=False), 4),
    ("NONE mode", dict(mode=RealKvHashMode.NONE, check_tokens=False), 4),
    ("K and V fold different source counts", dict(nsrc=(1, 2)), 6),  # TAIL: plain launches per endpoint
    ("longer requests", dict(bs=3, prefix_max=40, extend_max=6), 4),  # decode-shaped still: < bs + 64 tokens
]


def _same(got, want, what: str) -> None:
    np.testing.assert_array_equal(got.bufs, want.bufs, err_msg=f"{what}: canary buffers")
    np.testing.assert_array_equal(got.words, want.words, err_msg=f"{what}: write indices and counters")
    assert got.rows() == want.rows(), f"{what}: ring rows"


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize(("name", "options", "fused_launches"), CASES, ids=[c[0] for c in CASES])
def test_fused_step_equals_plain_launches_and_the_reference(name, options, fused_launches, seed):
    step = random_world(seed, **options)
    runs = {path: run_step(step[0], step, path) for path in PATHS}
    want = runs["reference"][0]
    for path in ("plain", "fused"):
        _same(runs[path][0], want, path)
    assert runs["plain"][1] == 8 and runs["fused"][1] == fused_launches
    assert sum(map(sum, (r.values() for r in want.rows()))) > 0  # the planted faults were reported


def test_every_planted_fault_class_is_reported_by_the_fused_step():
    bits = 0
    for seed in range(6):
        step = random_world(100 + seed, bs=6)
        world, _ = run_step(step[0], step, "fused")
        for rows in world.rows():
            for row in rows:
                bits |= row[7]
    for bit in F:
        assert bits & bit, f"{bit!r} never reported"


def test_counters_count_every_endpoint_as_its_own_launch():
    step = random_world(7, faults=False)
    world, launches = run_step(step[0], step, "fused")
    kernel_runs = world.words[0, 1:5]
    np.testing.assert_array_equal(kernel_runs, [2, 2, 2, 2])  # per tag: a verify and a write
    assert world.rows() == [{}] and launches == 4
    assert [int(t) for t in TAGS] == sorted(int(t) for t in TAGS)


@pytest.mark.parametrize("warps", [1, 2])
def test_fused_step_at_gpu_launch_shapes(warps):
    # Several warps per block and requests per warp: the part index arithmetic of real launches.
    step = random_world(11, bs=9, prefix_max=20)
    with _common.simulated_shapes(write_warps=warps, block=64):
        runs = {path: run_step(step[0], step, path) for path in PATHS}
    for path in ("plain", "fused"):
        _same(runs[path][0], runs["reference"][0], path)


# --- GPU at scale ------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("shared_ring", [True, False])
def test_gpu_fused_decode_step_at_scale_equals_plain_launches_and_the_reference(seed, shared_ring):
    # 256 requests with up to 300 prefix entries each: every part strides over many entries and
    # requests, real-KV folds are staged, rings take thousands of rows.
    step = random_world(
        seed, bs=256, prefix_max=300, extend_max=1, num_slots=1 << 17, shared_ring=shared_ring, nsrc=(2, 2)
    )
    runs = {path: run_step(step[0], step, path) for path in PATHS}
    for path in ("plain", "fused"):
        _same(runs[path][0], runs["reference"][0], path)
    assert runs["fused"][1] == 4
