"""Small helpers shared by the tests: error-code assertions, and the plan tests' tables, runner and loop oracle."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from kvcanary_numba import OUT_OF_RANGE_SLOT, VerifyPlan, WritePlan, launch_canary_plan_kernels
from kvcanary_numba.errors import KvCanaryError


@contextlib.contextmanager
def raises_code(code: str):
    """Assert that the block raises KvCanaryError with catalogue code ``code``."""
    with pytest.raises(KvCanaryError) as excinfo:
        yield excinfo
    assert excinfo.value.code == code, f"expected {code}, got {excinfo.value.code}: {excinfo.value}"
    assert str(excinfo.value).endswith(excinfo.value.entry.ending)


#: Columns of the "linear" req_to_token of the plan tests.
PLAN_WIDTH = 16
#: What fresh plans are pre-filled with, to expose unwritten entries.
FILL = -7777
OOR = OUT_OF_RANGE_SLOT


def padded_lut(values) -> np.ndarray:
    """int64 copy of a full-to-SWA LUT with entry 0 set to 0: padding slot 0 stays padding (KVC-P008)."""
    lut = np.array(values, dtype=np.int64)
    lut[0] = 0
    return lut


def linear_rtt(rows: int = 9, width: int = PLAN_WIDTH) -> np.ndarray:
    """req_to_token (int32 [rows, width]) with entry [rp, pos] = rp * width + pos."""
    return (np.arange(rows)[:, None] * width + np.arange(width)[None, :]).astype(np.int32)


def i64(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


# --- the plan tests' runner (public wrapper, NumPy backend) ---------------------


def run_plan(
    rpi,
    prefix,
    ext,
    rtt=None,
    *,
    window=0,
    lut=None,
    vcap=256,
    wcap=None,
    pool=None,
    lens=None,
    offset=0,
    vplan=None,
    wplan=None,
):
    """Plan through the public wrapper; fresh plans are pre-filled with FILL to expose unwritten entries."""
    rpi, prefix, ext = i64(rpi), i64(prefix), i64(ext)
    if vplan is None:
        vplan = VerifyPlan.allocate(verify_capacity=vcap)
        for arr in vplan.arrays().values():
            arr[...] = FILL
    if wplan is None:
        wplan = WritePlan.allocate(write_req_capacity=wcap or max(len(rpi), 1))
        for arr in wplan.arrays().values():
            arr[...] = FILL
    launch_canary_plan_kernels(
        verify_plan_out=vplan,
        write_plan_out=wplan,
        req_pool_indices=rpi,
        prefix_lens=prefix,
        extend_seq_lens=ext,
        req_to_token=linear_rtt() if rtt is None else rtt,
        swa_window_size=window,
        full_to_swa_index_mapping=lut,
        verify_capacity=vplan.verify_capacity,
        req_to_verify_expected_tokens=pool,
        req_to_verify_expected_tokens_valid_lens=lens,
        kv_token_id_vs_position_offset=offset,
        backend="numpy",
    )
    return vplan, wplan


def entries(vplan):
    """The valid verify entries of a plan, as lists."""
    n = int(vplan.verify_num_valid[0])
    return {
        "slots": vplan.verify_slot_indices[:n].tolist(),
        "tokens": vplan.verify_expected_tokens[:n].tolist(),
        "positions": vplan.verify_expected_positions[:n].tolist(),
        "prevs": vplan.verify_prev_slot_indices[:n].tolist(),
    }


# --- an independent, entry-by-entry implementation of the documented plan semantics ---


def loop_plan(rpi, prefix, ext, rtt, *, window=0, lut=None, pool=None, lens=None, offset=0):
    """The plan as a dict of lists (verify entries, write offsets and seeds), one entry at a time."""
    rows, cols = rtt.shape
    table, lut_list = rtt.tolist(), None if lut is None else lut.tolist()

    def slot(rp, p):
        if not (0 <= rp < rows and 0 <= p < cols):
            return OOR
        v = table[rp][p]
        if lut_list is None or v < 0:
            return v
        return lut_list[v] if v < len(lut_list) else OOR

    out = {"slots": [], "tokens": [], "positions": [], "prevs": [], "offsets": [0], "seeds": []}
    for r, rp in enumerate(int(x) for x in rpi):
        pre, e = max(int(prefix[r]), 0), max(int(ext[r]), 0)
        if rp == 0:
            out["offsets"].append(out["offsets"][-1])
            out["seeds"].append(-1)
            continue
        for p in range(max(pre - window, 0) if window > 0 else 0, pre):
            out["slots"].append(slot(rp, p))
            out["positions"].append(p)
            out["prevs"].append(slot(rp, p - 1) if p > 0 else -1)
            token, c = -1, p + offset
            if pool is not None and 0 <= rp < pool.shape[0] and 0 <= c < min(int(lens[r]), pool.shape[1]):
                token = int(pool[rp, c])
            out["tokens"].append(token)
        out["offsets"].append(out["offsets"][-1] + e)
        out["seeds"].append(slot(rp, pre - 1) if e > 0 and pre > 0 else -1)
    return out


def assert_matches_loop(vplan, wplan, want):
    """Plans equal to :func:`loop_plan`'s ``want`` (on overflow: only the count, enable and write plan)."""
    bs = len(want["seeds"])
    total = len(want["slots"])
    if total <= vplan.verify_capacity:
        assert (int(vplan.verify_num_valid[0]), int(vplan.enable[0])) == (total, 1)
        got = entries(vplan)
        for key in ("slots", "tokens", "positions", "prevs"):
            assert got[key] == want[key], key
    else:
        assert (int(vplan.verify_num_valid[0]), int(vplan.enable[0])) == (vplan.verify_capacity, 0)
    assert wplan.write_offsets[: bs + 1].tolist() == want["offsets"]
    assert not wplan.write_offsets[bs + 1 :].any()
    assert wplan.write_seed_slot_indices[:bs].tolist() == want["seeds"]
    assert (wplan.write_seed_slot_indices[bs:] == -1).all()
    assert int(wplan.write_num_valid_reqs[0]) == bs
