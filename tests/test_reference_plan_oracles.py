"""Plan on the NumPy backend against oracles: the per-entry loop on random and generated batches, golden vectors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import FILL, assert_matches_loop, entries, loop_plan, padded_lut, run_plan

pytest.importorskip("hypothesis", reason="hypothesis is not installed (pip install -e '.[dev]')")

from hypothesis import given, settings, strategies as st

# --- the per-entry loop on large, random and generated batches ---


@pytest.mark.parametrize("bs", [4097, 65536])
def test_large_batches_have_no_cap(bs, rng):
    rtt = rng.integers(1, 10**6, size=(bs + 1, 8), dtype=np.int32)
    rpi = rng.permutation(np.arange(bs + 1))[:bs]  # includes the padding row once (or not)
    prefix, ext = rng.integers(-1, 6, size=bs), rng.integers(-1, 3, size=bs)
    vplan, wplan = run_plan(rpi, prefix, ext, rtt, vcap=8 * bs)
    assert_matches_loop(vplan, wplan, loop_plan(rpi, prefix, ext, rtt))


@pytest.mark.parametrize("seed", range(40))
def test_random_plans_match_loop(seed):
    rng = np.random.default_rng(seed)
    bs, rows, cols = int(rng.integers(0, 12)), int(rng.integers(1, 8)), int(rng.integers(1, 24))
    rtt = rng.integers(-3, 60, size=(rows, cols), dtype=np.int32)
    rpi = rng.integers(-1, rows + 2, size=bs)
    prefix, ext = rng.integers(-2, cols + 4, size=bs), rng.integers(-2, 5, size=bs)
    window = int(rng.choice([0, 0, 1, 3, 50]))
    lut = padded_lut(rng.integers(-2, 90, size=int(rng.integers(1, 70)))) if window else None
    pool, lens, offset = None, None, 0
    if rng.random() < 0.6:
        pool = rng.integers(-5, 10**6, size=(int(rng.integers(1, rows + 2)), int(rng.integers(1, 30))), dtype=np.int32)
        lens, offset = rng.integers(-2, 35, size=bs), int(rng.integers(-2, 3))
    vcap, wcap = int(rng.integers(1, 60)), bs + int(rng.integers(1, 4))
    vplan, wplan = run_plan(
        rpi, prefix, ext, rtt, window=window, lut=lut, vcap=vcap, wcap=wcap, pool=pool, lens=lens, offset=offset
    )
    want = loop_plan(rpi, prefix, ext, rtt, window=window, lut=lut, pool=pool, lens=lens, offset=offset)
    assert_matches_loop(vplan, wplan, want)
    # Plan invariants (SGLang's _invariants.py).
    offsets = wplan.write_offsets[: bs + 1]
    assert (np.diff(offsets) >= 0).all()
    assert offsets[-1] == sum(max(int(e), 0) for r, e in zip(rpi, ext) if r != 0)
    assert all(s == -1 for r, s in zip(rpi, wplan.write_seed_slot_indices) if r == 0)
    if int(vplan.enable[0]):
        got = entries(vplan)
        assert all(q == -1 for p, q in zip(got["positions"], got["prevs"]) if p == 0)


@st.composite
def batches(draw):
    """A batch with padding rows, rows and positions outside the table, an optional LUT and pool."""
    rows, cols = draw(st.integers(1, 6)), draw(st.integers(1, 12))
    bs = draw(st.integers(0, 8))
    ints = lambda lo, hi, n: np.array(draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n)), np.int64)  # noqa: E731
    rtt = ints(-2, 40, rows * cols).astype(np.int32).reshape(rows, cols)
    batch = dict(rpi=ints(-1, rows + 1, bs), prefix=ints(-2, cols + 3, bs), ext=ints(-1, 4, bs), rtt=rtt)
    window = draw(st.sampled_from([0, 1, 4]))
    lut = padded_lut(ints(-2, 60, draw(st.integers(1, 50)))) if window else None
    pool = lens = None
    if draw(st.booleans()):
        pool = ints(-1, 99, (rows + 1) * 6).astype(np.int32).reshape(rows + 1, 6)
        lens = ints(-1, 8, bs)
    extra = dict(window=window, lut=lut, pool=pool, lens=lens, offset=draw(st.integers(-1, 1)))
    return batch, extra, draw(st.integers(1, 40))


@settings(max_examples=60, deadline=None)
@given(batches())
def test_plan_property_matches_loop(case):
    batch, extra, vcap = case
    vplan, wplan = run_plan(
        batch["rpi"], batch["prefix"], batch["ext"], batch["rtt"], vcap=vcap, wcap=len(batch["rpi"]) + 1, **extra
    )
    assert_matches_loop(vplan, wplan, loop_plan(batch["rpi"], batch["prefix"], batch["ext"], batch["rtt"], **extra))
    if not int(vplan.enable[0]):  # overflow leaves every entry as it was
        assert (vplan.verify_slot_indices == FILL).all() and (vplan.verify_prev_slot_indices == FILL).all()


# --- golden vectors: SGLang's own plan outputs, bit for bit ---


def test_plan_matches_golden_vectors(vectors_dir):
    paths = sorted(vectors_dir.glob("scenario_*.npz"))
    assert paths
    for path in paths:
        data = np.load(path)
        meta = json.loads(str(data["meta"]))
        for step in range(int(data["steps"])):
            p = f"s{step}_"
            check = bool(meta["check_tok"])
            vplan, wplan = run_plan(
                data[p + "rpi"],
                data[p + "prefix"],
                data[p + "ext"],
                data[p + "req_to_token"],
                window=int(meta["W"]),
                lut=data["lut"] if meta["swa"] else None,
                vcap=meta["verify_cap"],
                wcap=meta["write_cap"],
                pool=data[p + "pool"] if check else None,
                lens=data[p + "valid_lens"] if check else None,
                offset=int(meta["offset"]),
            )
            label = f"{path.name} step {step}"
            n, bs = int(data[p + "verify_num_valid"]), data[p + "rpi"].shape[0]
            assert int(vplan.verify_num_valid[0]) == n, label
            assert int(vplan.enable[0]) == int(data[p + "enable"]), label
            for ours, theirs in [
                (vplan.verify_slot_indices, "v_slots"),
                (vplan.verify_expected_tokens, "v_tokens"),
                (vplan.verify_expected_positions, "v_positions"),
                (vplan.verify_prev_slot_indices, "v_prev"),
            ]:
                np.testing.assert_array_equal(ours[:n], data[p + theirs], err_msg=f"{label}: {theirs}")
            np.testing.assert_array_equal(wplan.write_offsets[: bs + 1], data[p + "w_offsets"], err_msg=label)
            np.testing.assert_array_equal(wplan.write_seed_slot_indices[:bs], data[p + "w_seeds"], err_msg=label)
            assert int(wplan.write_num_valid_reqs[0]) == int(data[p + "w_num_valid"]), label
