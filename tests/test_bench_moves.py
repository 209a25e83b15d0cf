"""``benchmarks/bench_moves.py`` on a CPU: ``--quick --cpu`` runs and writes its JSON and table; its pools
check clean (a timing of a check that finds faults would time the ring). No timing is asserted."""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from conftest import SIMULATOR  # noqa: E402

import kvcanary_numba as kc  # noqa: E402
from benchmarks import bench_moves  # noqa: E402


def test_quick_cpu_run_writes_json_and_markdown(tmp_path):
    assert bench_moves.main(["--quick", "--cpu", "--out", str(tmp_path), "--name", "m"]) == 0
    doc = json.loads((tmp_path / "m.json").read_text())
    assert doc["schema"] == bench_moves.SCHEMA and doc["meta"]["gpu"] is False and doc["meta"]["quick"] is True
    ops = {r["op"] for r in doc["results"]}
    assert ops == {
        "host verify records",
        "host digest",
        "host gather",
        "host scatter",
        "host copy of the records",
    }
    assert all(r["median_s"] >= 0 and r["slots"] == bench_moves.CPU_SIZES["quick"][0] for r in doc["results"])
    assert (tmp_path / "m.md").read_text().startswith("# Moved records")


def test_the_benchmark_pool_is_one_clean_request_in_a_random_order():
    ctx, slots = bench_moves.pool(np, 300, kc.RealKvHashMode.ALL)
    assert sorted(slots.tolist()) == list(range(1, 301)) and slots.tolist() != list(range(1, 301))
    offsets, starts, prevs = bench_moves._runs(np, 300)
    kc.verify_canary_records(
        context=ctx, slot_indices=slots, run_offsets=offsets, run_start_positions=starts, run_prev_slots=prevs
    )
    assert int(ctx.violation_write_index[0]) == 0


def test_the_paged_order_moves_whole_pages_in_a_shuffled_order():
    page = bench_moves._SHORT_RUN
    ctx, slots = bench_moves.pool(np, 8 * page, kc.RealKvHashMode.NONE, order=bench_moves.ORDERS[1])
    pages = slots.reshape(8, page)
    assert sorted(slots.tolist()) == list(range(1, 8 * page + 1))
    np.testing.assert_array_equal(pages - pages[:, :1], np.broadcast_to(np.arange(page), (8, page)))
    assert np.all((pages[:, 0] - 1) % page == 0) and pages[:, 0].tolist() != sorted(pages[:, 0].tolist())
    in_order, _ = bench_moves.pool(np, 8 * page, kc.RealKvHashMode.NONE, order=bench_moves.ORDERS[2])
    assert int(in_order.violation_write_index[0]) == 0


def test_targets_read_the_rows_they_name():
    rows = [
        {
            "op": "gather with digest",
            "variant": f"{1 << 20} slots, PARTIAL, random order",
            "slots": 1 << 20,
            "fraction_of_copy": 0.85,
        },
        {
            "op": "gather + digest",
            "variant": f"{1 << 20} slots, NONE, in order",
            "slots": 1 << 20,
            "fraction_of_copy": 1,
        },
        {"op": "host verify records", "variant": f"{1 << 20} slots, PARTIAL", "slots": 1 << 20, "median_s": 0.2},
        {"op": "host verify records", "variant": f"{1 << 20} slots, ALL", "slots": 1 << 20, "median_s": 0.05},
    ]
    got = {t["target"]: (t["value"], t["met"]) for t in bench_moves.targets(rows)}
    assert got == {
        f"gather with digest, {1 << 20} slots, PARTIAL, random order: fraction of copy bandwidth": (0.85, True),
        f"host-tier verify records, {1 << 20} slots (s, wall)": (0.2, False),
    }


@pytest.mark.simulator
@pytest.mark.skipif(not SIMULATOR, reason="NumPy arrays through the kernel (the GPU runs it in the bench)")
def test_the_touch_baseline_loads_what_a_partial_gather_reads():
    # The ceiling row is only a ceiling if it touches the same bytes: each entry's record and the first
    # 16 bytes of its K and V rows, stored into the pack row (XOR-ed, so that no load is dropped).
    from benchmarks.baseline_kernels import launch_gather_touch

    ctx, slots = bench_moves.pool(np, 40, kc.RealKvHashMode.PARTIAL)
    k_rows, v_rows = (s.tensor for s in ctx.real_kv_sources)
    out = np.zeros((40, 32), np.uint8)
    launch_gather_touch(canary_buf=ctx.canary_buf, slot_indices=slots, out_records=out, k_rows=k_rows, v_rows=v_rows)
    records = ctx.canary_buf.view(np.int64)[slots]
    kv = np.concatenate([k_rows.view(np.int64)[slots, :2], v_rows.view(np.int64)[slots, :2]], axis=1)
    np.testing.assert_array_equal(out.view(np.int64), records ^ kv)


@pytest.mark.simulator
@pytest.mark.skipif(not SIMULATOR, reason="NumPy arrays through the kernel (the GPU runs it in the bench)")
def test_the_records_touch_baseline_is_a_plain_gather_of_the_records():
    # The NONE rows' ceiling: without K and V rows the touch copies each entry's record, nothing else.
    from benchmarks.baseline_kernels import launch_gather_touch

    ctx, slots = bench_moves.pool(np, 12, kc.RealKvHashMode.NONE)
    out = np.zeros((12, 32), np.uint8)
    launch_gather_touch(canary_buf=ctx.canary_buf, slot_indices=slots, out_records=out)
    np.testing.assert_array_equal(out, ctx.canary_buf[slots])
    assert np.any(out)


def test_a_fused_pass_that_packs_other_records_than_the_gather_stops_the_benchmark():
    pack, scratch = np.zeros((8, 32), np.uint8), np.zeros((8, 32), np.uint8)

    def gather(i):
        pack[...] = np.arange(32, dtype=np.uint8)

    def skips_the_last_entry(i):
        gather(i)
        pack[-1] = 0

    bench_moves._require_same_pack(gather, gather, pack, scratch)
    with pytest.raises(RuntimeError, match="other records"):
        bench_moves._require_same_pack(gather, skips_the_last_entry, pack, scratch)
