"""The tiled stamps of all endpoints of a long (prefill-shaped) phase in one launch
(``kernels/tiled_endpoints.py``, ``launch/endpoints.py``) against one ``write_tiled`` launch per
endpoint (the plain path inside ``chain.sharing``) and the NumPy reference, byte for byte: canary
buffers, counters, write indices, ring rows (as multisets), on random long steps with the monitor
tests' faults, duplicates (the last entry of a slot wins), seed states that differ from the
published ones (that request walks serially), a scratch too small (every request walks serially)."""

from __future__ import annotations

import numpy as np
import pytest
from endpoint_worlds import PATHS, TAGS, random_world, run_step
from kernel_pairs import KERNEL_DEVICE, to_host

from kvcanary_numba import RealKvHashMode
from kvcanary_numba.fast.chain import SharedChain, long_step
from kvcanary_numba.fast.endpoints import launch_endpoint_writes
from kvcanary_numba.hashing import to_signed
from kvcanary_numba.launch import _launch as _common

pytestmark = pytest.mark.simulator

#: Long requests: at least 3 x 40 tokens for 3 requests, the tiled path (1 warp x 2 entries: 64-entry tiles).
LONG = dict(bs=3, prefix_max=4, extend_min=40, extend_max=75)
#: (name, world options, launches of the plain and the fused step). Plain: HEAD verify K, chain_publish,
#: write_tiled K, verify V, write_tiled V; TAIL the same without chain_publish. Fused: HEAD verify,
#: chain_publish, one tiled launch; TAIL verify and one tiled launch.
CASES = [
    ("shared ring, ALL, tokens, assert", {}, (9, 5)),
    (
        "own rings, PARTIAL, no token check",
        dict(shared_ring=False, mode=RealKvHashMode.PARTIAL, check_tokens=False),
        (9, 5),
    ),
    ("two sources each, no assert", dict(nsrc=(2, 2), asserted=False), (9, 5)),
    ("NONE mode", dict(mode=RealKvHashMode.NONE, check_tokens=False), (9, 5)),
    ("K and V fold different source counts", dict(nsrc=(1, 2)), (9, 7)),  # TAIL: a write_tiled per endpoint
]


def _same(got, want, what: str) -> None:
    np.testing.assert_array_equal(got.bufs, want.bufs, err_msg=f"{what}: canary buffers")
    np.testing.assert_array_equal(got.words, want.words, err_msg=f"{what}: write indices and counters")
    assert got.rows() == want.rows(), f"{what}: ring rows"


def _long_world(seed: int, **options):
    step = random_world(seed, **{**LONG, **options})
    _, _, wplan, ids, _, _, _ = step
    assert long_step(int(ids.shape[0]), int(wplan.write_num_valid_reqs[0]))
    return step


def _plant_long(step, rng) -> None:
    """Duplicates inside requests (within a tile, across tiles, padding into one slot) and seed
    records that differ from the publisher's (HEAD K) in the HEAD V and the TAIL K buffers."""
    world, _, wplan, _, _, loc, _ = step
    offsets = wplan.write_offsets
    for r in range(2):  # requests 0 and 1 (never clipped by the planted range)
        lo, hi = int(offsets[r]), int(offsets[r + 1])
        last = hi - 1 - int(rng.integers(0, 3))  # in a later tile than the earlier copies, for long requests
        for i in (lo + 3, lo + 20, last):
            loc[i] = loc[lo + 30]
        loc[lo + 32 : lo + 35] = 0 if r == 0 else loc[lo + 32]  # slot 0 is nobody's slot
    fields = world.bufs.view(np.int64)  # [4 buffers, slots, 4]
    seeds = wplan.write_seed_slot_indices
    seeded = [r for r in range(int(wplan.write_num_valid_reqs[0])) if 0 <= seeds[r] < world.num_slots]
    assert seeded, "no request with a seed record"
    for buf, r in ((1, seeded[0]), (2, seeded[-1]), (3, seeded[0])):
        fields[buf, seeds[r], 2] ^= 1 << 20  # the seed's chain hash: that request's own serial walk


def _check(step, expected_launches, **run) -> dict:
    runs = {path: run_step(step[0], step, path, **run) for path in PATHS}
    for path in ("plain", "fused"):
        _same(runs[path][0], runs["reference"][0], path)
    assert (runs["plain"][1], runs["fused"][1]) == expected_launches
    return runs


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize(("name", "options", "launches"), CASES, ids=[c[0] for c in CASES])
def test_fused_tiled_step_equals_plain_tiled_launches_and_the_reference(name, options, launches, seed):
    runs = _check(_long_world(seed, **options), launches)
    assert sum(map(sum, (r.values() for r in runs["reference"][0].rows()))) > 0  # the planted faults were reported


@pytest.mark.parametrize("seed", range(2))
def test_duplicates_and_seed_states_differing_from_the_published_ones(seed):
    step = _long_world(20 + seed)
    _plant_long(step, np.random.default_rng(seed))
    _check(step, (9, 5))


@pytest.mark.parametrize("seed", range(2))
def test_tail_inputs_differing_from_the_published_ones(seed):
    # TAIL stamps other inputs than HEAD published: each consumer switches to its own chain at its
    # request's first difference (a token in a later tile, a position, an entry skipped or not), also
    # across a duplicate whose last entry comes after the difference.
    step = _long_world(30 + seed)
    _plant_long(step, np.random.default_rng(seed))
    world, vplan, wplan, ids, pos, loc, _ = step
    ids, pos, loc = ids.copy(), pos.copy(), loc.copy()
    lo0, lo1, lo2 = (int(o) for o in wplan.write_offsets[:3])
    ids[lo0 + 25] += 1  # request 0: after the first duplicates (lo0 + 3, 20), before its last copy
    pos[lo1 + 10] += 2  # request 1: also a chain-position row
    # Request 2: an entry skipped, or stored into a slot no other request reads or writes.
    used = set(loc.tolist()) | set(vplan.verify_slot_indices.tolist()) | set(wplan.write_seed_slot_indices.tolist())
    loc[lo2 + 5] = -1 if loc[lo2 + 5] >= 0 else min(set(range(1, world.num_slots)) - used)
    _check(step, (9, 5), tail_inputs=(ids, pos, loc))


def test_without_planted_faults_every_endpoint_counts_its_own_launch():
    step = _long_world(7, faults=False)
    runs = _check(step, (9, 5))
    world = runs["fused"][0]
    np.testing.assert_array_equal(world.words[0, 1:5], [2, 2, 2, 2])  # per tag: a verify and a write
    assert world.rows() == [{}]
    assert [int(t) for t in TAGS] == sorted(int(t) for t in TAGS)


def test_scratch_too_small_walks_every_request_serially():
    step = _long_world(3)
    _plant_long(step, np.random.default_rng(3))
    _check(step, (9, 5), chain_tokens=8)


@pytest.mark.parametrize("warps", [1, 2])
def test_fused_tiled_step_at_gpu_launch_shapes(warps):
    # Several warps per block (a 128-entry tile) and the part arithmetic of real launches.
    step = _long_world(11, bs=4, extend_min=30, extend_max=140)
    _plant_long(step, np.random.default_rng(11))
    with _common.simulated_shapes(write_warps=warps, block=64):
        _check(step, (9, 5))


def test_both_endpoints_stamp_from_the_published_chain():
    # A prev_hash planted in the scratch after HEAD shows up in TAIL K's and TAIL V's records.
    world, vplan, wplan, ids, pos, loc, _ = _long_world(5, faults=False)
    state = world.on(KERNEL_DEVICE)
    xp = np if KERNEL_DEVICE == "cpu" else __import__("cupy")
    wp = type(wplan)(**{k: xp.asarray(v.copy()) for k, v in wplan.arrays().items()})
    inputs = dict(
        input_ids=xp.asarray(ids),
        positions=xp.asarray(pos),
        out_cache_loc=xp.asarray(loc),
        enable_write_input_assert=False,
        expected_input_tokens=None,
        expected_input_positions=None,
    )
    chain = SharedChain(xp, tokens=ids.shape[0], requests=wplan.write_req_capacity)
    bs = int(wplan.write_num_valid_reqs[0])
    for stage, publish in (((TAGS[0], TAGS[1]), True), ((TAGS[2], TAGS[3]), False)):
        launch_endpoint_writes(
            contexts=[state[t] for t in stage], plan=wp, chain=chain, publish=publish, requests=bs, **inputs
        )
        if publish:
            published = to_host(chain.published).copy()
            published[0, 50] = to_signed(0x1234)
            chain.published[...] = xp.asarray(published)
    fields = to_host(state["bufs"]).view(np.int64)
    slot = int(loc[50])
    assert fields[2, slot, 2] == 0x1234 and fields[3, slot, 2] == 0x1234  # TAIL K and V consumed it
    assert fields[0, slot, 2] != 0x1234 and fields[1, slot, 2] != 0x1234  # HEAD stamped before the plant


# --- GPU at scale ------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize(("seed", "mode"), [(0, RealKvHashMode.PARTIAL), (1, RealKvHashMode.NONE)])
@pytest.mark.parametrize("plant", [False, True])
def test_gpu_fused_prefill_step_at_scale(seed, mode, plant):
    # 8 x 8k as the monitor's prefill step: 16 tiles of 512 entries per request and endpoint.
    step = random_world(
        seed,
        bs=8,
        prefix_max=64,
        extend_min=8192,
        extend_max=8192,
        num_slots=8 * (8192 + 64) + 16,
        mode=mode,
        check_tokens=False,
    )
    if plant:
        _plant_long(step, np.random.default_rng(seed))
    _check(step, (9, 5))
