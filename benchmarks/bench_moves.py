"""Moved records: their kernels against a plain device copy, and the host-tier check, in one run.

``python benchmarks/bench_moves.py [--cpu | --gpu] [--quick] [--out DIR] [--name NAME]`` writes
``DIR/NAME.json`` (``{"schema", "meta", "targets", "results"}``) and ``DIR/NAME.md``.

GPU rows (CuPy arrays, the package's public functions, CUDA-event medians behind a spin kernel,
``benchmarks/timing.py``), for ``n`` slots of a pool of ``n + 1`` with K and V sources of
128 bytes per token, the slots in a random order (single slots from anywhere in the pool: the
worst case), as pages of 64 slots in a random order (what an engine with a paged pool offloads
and reloads) and in order (a compaction of contiguous slots):

- ``copy``: the baselines, ``cudaMemcpyAsync`` of the same bytes the row's kernel must move
  (``bytes``: read + written), and of 1 GiB (the device's copy bandwidth);
- ``gather`` (take records out; NONE, and PARTIAL with the departure check), ``scatter`` (put
  them back; PARTIAL, landing check), ``move`` (compaction through a scratch pack), ``digest``
  (PARTIAL), ``verify records`` (PARTIAL), ``gather + digest`` (the two calls in a row) and
  ``gather with digest`` (one call, ``compute_handoff_digest(out_records=...)``: one pass over the
  records and the KV, whose bytes are the gather's: what an offload costs); each with
  ``fraction_of_copy`` (its minimum bytes per second over the 1 GiB copy's) and
  ``fraction_of_same_copy`` (the same-bytes copy's time over its own);
- ``gather with digest, runs of 64`` and ``verify records, runs of 64``: the same with a run every
  64 slots (a digest or a check per page of a paged pool: the run lookups, and the digest's
  per-run flushes and atomics, at their most frequent);
- ``touch``: ``benchmarks/baseline_kernels.gather_touch`` (PARTIAL) or ``records_touch`` (NONE),
  the loads and stores of a gather and nothing else, the ceiling of that access pattern; every
  row of the same slots then has ``fraction_of_touch`` (its bytes per second over the touch's).

Random slots read whole 32-byte sectors for 16 bytes of KV: the in-order rows show what the
kernels do without that.

CPU rows (NumPy arrays: the host tier): ``verify records`` and ``digest`` of ``n`` host slots
(NONE, PARTIAL, ALL over K and V of 128 bytes), ``gather`` and ``scatter``, and a NumPy copy of
the records as the baseline: wall-clock medians over a few calls and the process CPU time,
with the machine's usable cores and load average (timings on a loaded machine are not the
machine's).

Targets (docs: SPEC section 5): gather with digest >= 80 % of copy bandwidth for >= 1 M slots; the
host-tier records check of 1 M slots (PARTIAL) <= 0.1 s wall on two cores.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import statistics
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import kvcanary_numba as kc  # noqa: E402

SCHEMA = 1
BYTES_PER_TOKEN = 128
SIZES = {"quick": [1 << 14], "full": [1 << 20, 1 << 22]}
CPU_SIZES = {"quick": [1 << 14], "full": [1 << 20]}
_RECORD, _INDEX = 32, 8
_SHORT_RUN = 64  # slots per run of the many-runs digest and records-check rows (a page of a paged pool)


ORDERS = ("random order", f"pages of {_SHORT_RUN} in random order", "in order")


def pool(xp, n: int, mode, seed: int = 0, order: str = ORDERS[0]):
    """A context of ``n + 1`` slots over K and V sources, one request of ``n`` tokens written by the package's
    write (a valid chain, live fingerprints: every check is clean), and its slots in the ``order`` of ``ORDERS``."""
    rng = np.random.default_rng(seed)
    device = "cpu" if xp is np else "cuda"
    kv = [xp.asarray(rng.integers(0, 256, (n + 1, BYTES_PER_TOKEN), dtype=np.uint8)) for _ in range(2)]
    sources = tuple(
        kc.RealKvSource(tensor=t, page_size=1, num_bytes_per_token=BYTES_PER_TOKEN, read_bytes=BYTES_PER_TOKEN)
        for t in kv
    )
    ctx = kc.CanaryContext.allocate(
        num_slots=n + 1, real_kv_sources=sources, real_kv_hash_mode=mode, ring_capacity=64, device=device
    )
    if order == ORDERS[0]:
        picked = rng.permutation(np.arange(1, n + 1))
    elif order == ORDERS[1]:  # whole pages (n a multiple of the page size), the pages shuffled
        pages = rng.permutation(n // _SHORT_RUN)
        picked = (pages[:, None] * _SHORT_RUN + np.arange(_SHORT_RUN)).ravel() + 1
    else:
        picked = np.arange(1, n + 1)
    slots = xp.asarray(picked.astype(np.int64))
    plan = kc.WritePlan.allocate(write_req_capacity=1, device=device)
    plan.write_offsets[...] = xp.asarray(np.array([0, n], dtype=np.int64))
    plan.write_seed_slot_indices[...] = -1
    plan.write_num_valid_reqs[...] = 1
    kc.launch_canary_write_kernel(
        context=ctx,
        plan=plan,
        input_ids=xp.asarray(rng.integers(0, 32000, n, dtype=np.int64)),
        positions=xp.arange(n, dtype=np.int64),
        out_cache_loc=slots,
        enable_write_input_assert=False,
        expected_input_tokens=None,
        expected_input_positions=None,
    )
    return ctx, slots


def _runs(xp, n: int):
    return xp.asarray(np.array([0, n], dtype=np.int64)), xp.zeros(1, dtype=np.int64), xp.full(1, -1, dtype=np.int64)


# --- GPU rows -----------------------------------------------------------------------


def gpu_rows(mode_name: str) -> list[dict]:
    import cupy

    from benchmarks.baseline_kernels import launch_gather_touch
    from benchmarks.timing import copy_bandwidth, device_times

    rows, big = [], copy_bandwidth()
    rows.append({"op": "copy", "variant": "1 GiB", **big})
    for n in SIZES[mode_name]:
        # NONE in order: records alone, read in order, the copy's own access pattern
        for mode, order in [(m, o) for m in (kc.RealKvHashMode.NONE, kc.RealKvHashMode.PARTIAL) for o in ORDERS]:
            ctx, slots = pool(cupy, n, mode, order=order)
            kv = 0 if mode == kc.RealKvHashMode.NONE else 2 * 16  # PARTIAL: 16 bytes of K and of V per slot
            pack, scratch = cupy.empty((n, 32), np.uint8), cupy.empty((n, 32), np.uint8)
            offsets, starts, prevs = _runs(cupy, n)
            digests = cupy.empty(1, np.int64)
            cases = {
                "gather": (
                    lambda i: kc.gather_canary_records(context=ctx, slot_indices=slots, out_records=pack),
                    n * (_INDEX + 2 * _RECORD + kv),
                ),
                "scatter": (
                    lambda i: kc.scatter_canary_records(context=ctx, records=pack, slot_indices=slots),
                    n * (_INDEX + 2 * _RECORD + kv),
                ),
                "move": (
                    lambda i: kc.move_canary_records(
                        context=ctx, src_slot_indices=slots, dst_slot_indices=slots, scratch_records=scratch
                    ),
                    n * (3 * _INDEX + 4 * _RECORD + kv),  # gather to scratch, then scatter (guarded)
                ),
                "digest": (
                    lambda i: kc.compute_handoff_digest(
                        context=ctx, slot_indices=slots, run_offsets=offsets, out_digests=digests
                    ),
                    n * (_INDEX + _RECORD + kv),
                ),
                "verify records": (_records_check(ctx, slots, offsets, starts, prevs), n * (_INDEX + 2 * _RECORD + kv)),
            }
            cases["gather + digest"] = (
                lambda i: (cases["gather"][0](i), cases["digest"][0](i)),
                cases["gather"][1] + cases["digest"][1],
            )
            cases["gather with digest"] = (
                lambda i: kc.compute_handoff_digest(
                    context=ctx, slot_indices=slots, run_offsets=offsets, out_digests=digests, out_records=pack
                ),
                cases["gather"][1],  # the records and the KV read once, the pack written once
            )
            short = cupy.arange(0, n + 1, _SHORT_RUN, dtype=np.int64)
            short_digests = cupy.empty(short.shape[0] - 1, np.int64)
            cases[f"gather with digest, runs of {_SHORT_RUN}"] = (
                lambda i: kc.compute_handoff_digest(
                    context=ctx, slot_indices=slots, run_offsets=short, out_digests=short_digests, out_records=pack
                ),
                cases["gather"][1],
            )
            short_starts = short[:-1].copy()
            short_prevs = cupy.where(short_starts > 0, slots[cupy.maximum(short_starts - 1, 0)], -1)
            cases[f"verify records, runs of {_SHORT_RUN}"] = (
                _records_check(ctx, slots, short, short_starts, short_prevs),
                cases["verify records"][1],
            )
            # The access pattern's own ceiling: the sectors the gather touches, no work.
            k_rows, v_rows = (s.tensor for s in ctx.real_kv_sources) if kv else (None, None)
            cases["touch"] = (
                lambda i: launch_gather_touch(
                    canary_buf=ctx.canary_buf, slot_indices=slots, out_records=scratch, k_rows=k_rows, v_rows=v_rows
                ),
                n * (_INDEX + 2 * _RECORD + kv),
            )
            group = len(rows)
            for op, (fn, nbytes) in cases.items():
                timed = device_times(fn, iters=20)
                copy = _copy_of(cupy, nbytes)
                gbps = nbytes / (timed["median_us"] * 1e-6) / 1e9
                rows.append(
                    {
                        "op": op,
                        "variant": f"{n} slots, {mode.name}, {order}",
                        "slots": n,
                        "bytes": nbytes,
                        **timed,
                        "gbps": round(gbps, 1),
                        "copy_same_bytes_us": copy["median_us"],
                        "fraction_of_copy": round(gbps / big["gbps"], 3),
                        "fraction_of_same_copy": round(copy["median_us"] / timed["median_us"], 3),
                    }
                )
            touch = next(r for r in rows[group:] if r["op"] == "touch")
            for r in rows[group:]:
                r["fraction_of_touch"] = round(r["gbps"] / touch["gbps"], 3)
            _require_clean(int(ctx.violation_write_index.get()[0]))
            _require_same_pack(cases["gather"][0], cases["gather with digest"][0], pack, scratch)
    return rows


def _records_check(ctx, slots, offsets, starts, prevs):
    """A timed call of ``verify_canary_records`` over the runs ``offsets`` (with their starts and predecessors)."""
    return lambda i: kc.verify_canary_records(
        context=ctx, slot_indices=slots, run_offsets=offsets, run_start_positions=starts, run_prev_slots=prevs
    )


def _require_clean(rows: int) -> None:
    if rows:  # a timing of a check that finds faults would time the ring, not the check
        raise RuntimeError(f"the benchmark's pool must check clean, {rows} violation rows were recorded")


def _require_same_pack(gather, gather_with_digest, pack, scratch) -> None:
    """The fused pass packs what the plain gather packs: a kernel that skipped its work would time
    faster and still record no rows."""
    gather(0)
    scratch[...] = pack
    pack.fill(0)
    gather_with_digest(0)
    if not bool((pack == scratch).all()):
        raise RuntimeError("gather with digest packed other records than the gather")


def _copy_of(cupy, nbytes: int) -> dict:
    from benchmarks.timing import device_times

    src = cupy.ones(max(nbytes // 2, 8) // 8, dtype=np.int64)
    dst = cupy.empty_like(src)
    stream = cupy.cuda.get_current_stream()
    kind = cupy.cuda.runtime.memcpyDeviceToDevice
    return device_times(
        lambda i: cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, src.nbytes, kind, stream.ptr), iters=20
    )


# --- CPU rows -------------------------------------------------------------------------


def _wall(fn, repeats: int) -> dict:
    wall, cpu = [], []
    fn()  # warm-up (allocations, the thread pool)
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return {
        "median_s": round(statistics.median(wall), 4),
        "min_s": round(min(wall), 4),
        "cpu_s": round(statistics.median(cpu), 4),
        "repeats": repeats,
    }


def cpu_rows(mode_name: str) -> list[dict]:
    rows = []
    for n in CPU_SIZES[mode_name]:
        for mode in kc.RealKvHashMode:
            ctx, slots = pool(np, n, mode)
            offsets, starts, prevs = _runs(np, n)
            out = np.zeros(1, np.int64)
            check = lambda: kc.verify_canary_records(
                context=ctx,
                slot_indices=slots,
                run_offsets=offsets,  # noqa: E731
                run_start_positions=starts,
                run_prev_slots=prevs,
            )
            digest = lambda: kc.compute_handoff_digest(
                context=ctx,
                slot_indices=slots,
                run_offsets=offsets,  # noqa: E731
                out_digests=out,
            )
            rows.append(
                {"op": "host verify records", "variant": f"{n} slots, {mode.name}", "slots": n, **_wall(check, 5)}
            )
            rows.append({"op": "host digest", "variant": f"{n} slots, {mode.name}", "slots": n, **_wall(digest, 5)})
            _require_clean(int(ctx.violation_write_index[0]))
        ctx, slots = pool(np, n, kc.RealKvHashMode.PARTIAL)
        pack = np.zeros((n, 32), np.uint8)
        gather = lambda: kc.gather_canary_records(context=ctx, slot_indices=slots, out_records=pack)  # noqa: E731
        scatter = lambda: kc.scatter_canary_records(context=ctx, records=pack, slot_indices=slots)  # noqa: E731
        records = ctx.canary_buf[:n]
        copy = lambda: np.copyto(pack, records)  # noqa: E731
        for op, fn in (("host gather", gather), ("host scatter", scatter), ("host copy of the records", copy)):
            rows.append({"op": op, "variant": f"{n} slots, PARTIAL", "slots": n, **_wall(fn, 5)})
    return rows


# --- the run ----------------------------------------------------------------------------------


def targets(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        if r["op"] == "gather with digest" and r.get("slots", 0) >= 1 << 20:
            out.append(
                {
                    "target": f"gather with digest, {r['variant']}: fraction of copy bandwidth",
                    "value": r["fraction_of_copy"],
                    "threshold": 0.8,
                    "better": "higher",
                    "met": r["fraction_of_copy"] >= 0.8,
                }
            )
        if r["op"] == "host verify records" and r["slots"] >= 1 << 20 and r["variant"].endswith("PARTIAL"):
            out.append(
                {
                    "target": f"host-tier verify records, {r['slots']} slots (s, wall)",
                    "value": r["median_s"],
                    "threshold": 0.1,
                    "better": "lower",
                    "met": r["median_s"] <= 0.1,
                }
            )
    return out


def markdown(doc: dict) -> str:
    meta = doc["meta"]
    lines = [f"# Moved records ({meta['date']}, {meta['device']}, {meta['cores']} cores, load {meta['load']})", ""]
    lines += ["| op | variant | median | fraction of copy / CPU time | of touch |", "|---|---|---|---|---|"]
    for r in doc["results"]:
        if "median_us" in r:
            lines.append(
                f"| {r['op']} | {r['variant']} | {r['median_us']} µs | {r.get('fraction_of_copy', r.get('gbps', ''))} "
                f"| {r.get('fraction_of_touch', '')} |"
            )
        else:
            lines.append(f"| {r['op']} | {r['variant']} | {r['median_s']} s | {r['cpu_s']} s CPU | |")
    lines += ["", "| target | value | threshold | met |", "|---|---|---|---|"]
    lines += [f"| {t['target']} | {t['value']} | {t['threshold']} | {t['met']} |" for t in doc["targets"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="only the CPU rows")
    parser.add_argument("--gpu", action="store_true", help="only the GPU rows (an A/B of the kernels)")
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds)")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--name", default="moves")
    args = parser.parse_args(argv)
    mode_name = "quick" if args.quick else "full"
    gpu = not args.cpu and kc.gpu_available()
    results = ([] if args.gpu else cpu_rows(mode_name)) + (gpu_rows(mode_name) if gpu else [])
    meta = {
        "name": args.name,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "gpu": gpu,
        "quick": args.quick,
        "device": _device(gpu),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "load": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }
    doc = {"schema": SCHEMA, "meta": meta, "targets": targets(results), "results": results}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(doc, indent=1))
    (out / f"{args.name}.md").write_text(markdown(doc))
    print(markdown(doc))
    return 0


def _device(gpu: bool) -> str:
    if not gpu:
        return platform.processor() or platform.machine()
    import cupy

    return cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()


if __name__ == "__main__":
    sys.exit(main())
