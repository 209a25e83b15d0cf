"""Kernel benchmarks: the copy roofline, verify, write and plan sweeps (GPU).

Bandwidth is counted from the *minimum* bytes each kernel must move (byte
models below, documented in ``benchmarks/NOTES.md``), not from what it happens
to move, so a kernel that over-fetches scores lower.
"""

from __future__ import annotations

import numpy as np

from kvcanary_numba import (
    RealKvHashMode,
    launch_canary_plan_kernels,
    launch_canary_verify_kernel,
    launch_canary_write_kernel,
    launch_plan_offsets_kernel,
)
from kvcanary_numba.constants import PARTIAL_READ_BYTES

from .baselines import cupy_verify
from .ceiling import verify_loads
from .timing import copy_bandwidth, device_times
from .workloads import plan_case, serial_public_writes, verify_case, write_case

__all__ = ["plan_bytes", "roofline", "verify_bytes", "verify_sweep", "write_bytes", "write_sweep", "plan_sweep"]

MODES = {"NONE": RealKvHashMode.NONE, "PARTIAL": RealKvHashMode.PARTIAL, "ALL": RealKvHashMode.ALL}
#: Real-KV bytes per token of the benchmark sources (ALL mode reads all of them).
KV_BYTES = 128
#: Case sizes of each sweep, ``quick`` and ``full`` (dry runs and tests may shrink them).
SIZES = {
    "verify": {"quick": [1 << 16, 1 << 18], "full": [1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24]},
    # (requests, tokens per request) shapes, and those also run in NONE mode and against the baseline
    "write": {
        "quick": ([(1, 1), (1, 128), (8, 1), (8, 128)], {(8, 128)}),
        "full": (
            [(r, t) for r in (1, 8, 64, 256) for t in (1, 128, 4096, 32768)],
            {(8, 32768), (1, 32768), (64, 4096), (256, 128), (256, 1)},
        ),
    },
    "plan": {"quick": [1, 16, 256], "full": [1, 16, 256, 4096, 16384, 65536]},
}
#: Input sets are rotated until they jointly exceed this (the H200's L2 is 50 MB).
ROTATE_BYTES = 200 << 20
RECORD = 32  # canary record bytes
WORD = 8


def _kv_read(mode: RealKvHashMode, read_bytes: int) -> int:
    return {RealKvHashMode.NONE: 0, RealKvHashMode.PARTIAL: PARTIAL_READ_BYTES}.get(mode, read_bytes)


def verify_bytes(entries: int, mode: RealKvHashMode, read_bytes: int = KV_BYTES, check_token: bool = False) -> int:
    """Minimum bytes of a clean verify: per entry the plan's slot, position and predecessor
    (+ expected token), the slot's 32-byte record (the predecessor's record is the previous
    entry's, already read) and the real-KV bytes folded (0 / 16 / read_bytes)."""
    plan = 3 * WORD + (WORD if check_token else 0)
    return entries * (plan + RECORD + _kv_read(mode, read_bytes))


def write_bytes(tokens: int, requests: int, mode: RealKvHashMode, read_bytes: int = KV_BYTES) -> int:
    """Minimum bytes of a write: per token input_ids, positions, out_cache_loc read and the
    record stored, plus the KV bytes folded; per request its offsets, seed and seed record."""
    return tokens * (3 * WORD + RECORD + _kv_read(mode, read_bytes)) + requests * (3 * WORD + RECORD)


def plan_bytes(bs: int, entries: int) -> int:
    """Minimum bytes of a plan: per request rpi, prefix, extend read and offset, seed written;
    per verify entry its req_to_token slot read (int32; the predecessor is the same row's
    previous element) and the four int64 plan fields written."""
    return bs * 5 * WORD + entries * (4 + 4 * WORD)


def _rotation(set_bytes: int, cap: int = 4) -> int:
    return int(min(cap, max(1, -(-ROTATE_BYTES // max(set_bytes, 1)))))


def _free() -> None:
    """Give the pooled device memory of the last case back between cases (the launch layer keeps
    no device views: a packed launch keeps pointers only)."""
    import cupy

    cupy.get_default_memory_pool().free_all_blocks()


def roofline(run) -> dict:
    """Device-to-device copy bandwidth of this GPU (bytes read + written per second)."""
    nbytes = (64 << 20) if run.quick else (1 << 30)
    result = copy_bandwidth(nbytes, iters=5 if run.quick else 10)
    run.add({"op": "copy", "variant": "cudaMemcpy D2D", "size": nbytes, **result})
    return result


def verify_sweep(run) -> None:
    sizes = SIZES["verify"][run.mode]
    for entries in sizes:
        for name in MODES:
            run.case("verify", f"{name} {entries}", lambda: _verify(run, name, entries), reserve=60, cleanup=_free)
    # Consecutive slots per chain (a fresh pool, a paged allocator): records and KV bytes
    # are read in whole bursts, unlike the random permutation above.
    for entries in sizes if run.quick else [n for n in sizes if n >= 1 << 22]:
        for name in ("NONE", "ALL"):
            run.case(
                "verify",
                f"{name} contiguous {entries}",
                lambda: _verify(run, name, entries, contiguous=True),
                reserve=60,
                cleanup=_free,
            )


def _verify(run, name: str, entries: int, contiguous: bool = False) -> None:
    import cupy

    mode = MODES[name]
    nbytes = verify_bytes(entries, mode)
    sets = [
        verify_case(cupy, entries=entries, mode=mode, bytes_per_token=KV_BYTES, seed=s, contiguous=contiguous)
        for s in range(_rotation(nbytes))
    ]

    def call(i):
        ctx, plan, _ = sets[i % len(sets)]
        launch_canary_verify_kernel(context=ctx, plan=plan, check_verify_expected_token=False)

    result = device_times(call, iters=run.iters, host_us=150)
    rows = sum(int(ctx.violation_write_index.get()[0]) for ctx, _, _ in sets)
    variant = f"{name} contiguous" if contiguous else name
    record = {
        "op": "verify",
        "variant": variant,
        "entries": entries,
        **result,
        "bytes": nbytes,
        **run.bandwidth(nbytes, result),
        "input_sets": len(sets),
        "rows": rows,
    }
    if name != "PARTIAL" and (run.quick or entries >= 1 << 22):
        ceiling = _load_ceiling(run, variant, entries, nbytes, sets)
        record["load_ceiling_fraction"] = round(ceiling["median_us"] / result["median_us"], 3)
    run.add(record)
    if contiguous:
        return
    # A random 32-byte record read costs the 64-byte DRAM burst it sits in: the same run under that model.
    burst_bytes = nbytes + entries * 32
    run.add(
        {
            "op": "verify",
            "variant": f"{name} random, 64 B burst model",
            "entries": entries,
            **result,
            "bytes": burst_bytes,
            **run.bandwidth(burst_bytes, result),
            "input_sets": len(sets),
            "rows": rows,
        }
    )
    if name != "PARTIAL" and (run.quick or entries >= 1 << 20):
        _cupy_baseline(run, name, entries, nbytes, sets)


def _load_ceiling(run, variant: str, entries: int, nbytes: int, sets) -> dict:
    """The same reads with no hashing (:mod:`benchmarks.ceiling`): what the memory system allows."""
    outs = [None] * len(sets)

    def call(i):
        ctx, plan, _ = sets[i % len(sets)]
        outs[i % len(sets)] = verify_loads(ctx, plan, entries, out=outs[i % len(sets)])

    result = device_times(call, iters=run.iters, host_us=100)
    run.add(
        {
            "op": "verify",
            "variant": f"{variant} pure loads",
            "entries": entries,
            **result,
            "bytes": nbytes,
            **run.bandwidth(nbytes, result),
            "input_sets": len(sets),
        }
    )
    return result


def _cupy_baseline(run, name: str, entries: int, nbytes: int, sets) -> None:
    """The same verify written with CuPy array operations (baselines.cupy_verify)."""
    import cupy

    ctx, plan, _ = sets[0]
    failing = int(cupy_verify(cupy, ctx, plan, entries).sum())  # 0 on clean data

    def call(i):
        ctx, plan, _ = sets[i % len(sets)]
        cupy_verify(cupy, ctx, plan, entries)

    result = device_times(call, iters=max(3, run.iters // 4), host_us=3000)
    run.add(
        {
            "op": "verify",
            "variant": f"CuPy array ops {name}",
            "entries": entries,
            **result,
            "bytes": nbytes,
            **run.bandwidth(nbytes, result),
            "input_sets": len(sets),
            "rows": failing,
        }
    )


def write_sweep(run) -> None:
    shapes, baseline = SIZES["write"][run.mode]
    for requests, tokens in shapes:
        both = (requests, tokens) in baseline
        for name in ("ALL", "NONE") if both else ("ALL",):
            run.case(
                "write",
                f"{name} {requests}x{tokens}",
                reserve=45,
                cleanup=_free,
                body=lambda: _write(run, name, requests, tokens, with_baseline=both and name == "ALL"),
            )


def _write(run, name: str, requests: int, tokens: int, *, with_baseline: bool) -> None:
    import cupy

    from kvcanary_numba.fast.chain import own_tiled

    from .baseline_kernels import launch_write_baseline

    mode = MODES[name]
    nbytes = write_bytes(requests * tokens, requests, mode)
    sets = [
        write_case(cupy, requests=requests, tokens=tokens, mode=mode, bytes_per_token=KV_BYTES, seed=s)
        for s in range(_rotation(nbytes))
    ]
    impls = [("", launch_canary_write_kernel)]
    if with_baseline:
        impls.append(("baseline thread/request ", launch_write_baseline))
        if own_tiled(requests * tokens, requests):  # the same call on the serial kernel, in the same run
            impls.append(("serial kernel ", _serial_write))
    for prefix, launch in impls:

        def call(i, launch=launch):
            ctx, plan, inputs = sets[i % len(sets)]
            launch(context=ctx, plan=plan, **inputs)

        iters = run.iters if prefix == "" else max(3, run.iters // 4)
        result = device_times(call, iters=iters, host_us=150)
        rows = sum(int(ctx.violation_write_index.get()[0]) for ctx, _, _ in sets)
        run.add(
            {
                "op": "write",
                "variant": f"{prefix}{name} r={requests}",
                "tokens": requests * tokens,
                "requests": requests,
                "tokens_per_request": tokens,
                **result,
                "bytes": nbytes,
                **run.bandwidth(nbytes, result),
                "input_sets": len(sets),
                "rows": rows,
            }
        )


def _serial_write(**kwargs) -> None:
    with serial_public_writes():
        launch_canary_write_kernel(**kwargs)


def plan_sweep(run, prefix: int = 128) -> None:
    for bs in SIZES["plan"][run.mode]:
        run.case("plan", f"bs={bs}", lambda: _plan(run, bs, prefix), cleanup=_free)


def _plan(run, bs: int, prefix: int) -> None:
    import cupy

    entries = bs * prefix
    nbytes = plan_bytes(bs, entries)
    sets = [plan_case(cupy, bs=bs, prefix=prefix, seed=s) for s in range(_rotation(nbytes))]

    def call(i):
        launch_canary_plan_kernels(**sets[i % len(sets)])

    result = device_times(call, iters=run.iters, host_us=250)
    vplan = sets[0]["verify_plan_out"]
    num_valid, enable = int(vplan.verify_num_valid.get()[0]), int(vplan.enable.get()[0])
    run.add(
        {
            "op": "plan",
            "variant": f"decode prefix={prefix}",
            "bs": bs,
            "verify_entries": entries,
            **result,
            "bytes": nbytes,
            **run.bandwidth(nbytes, result),
            "ok": num_valid == entries and enable == 1,
            "input_sets": len(sets),
        }
    )
    # The first of the two launches alone: what the entries kernel adds is the difference.
    scratch = [cupy.zeros(bs + 1, dtype=np.int64) for _ in sets]

    def offsets(i):
        case = sets[i % len(sets)]
        wplan, vplan = case["write_plan_out"], case["verify_plan_out"]
        launch_plan_offsets_kernel(
            req_pool_indices=case["req_pool_indices"],
            prefix_lens=case["prefix_lens"],
            extend_seq_lens=case["extend_seq_lens"],
            req_to_token=case["req_to_token"],
            full_to_swa_index_mapping=None,
            out_verify_offsets_scratch=scratch[i % len(sets)],
            out_write_offsets=wplan.write_offsets,
            out_write_seed_slot_indices=wplan.write_seed_slot_indices,
            out_verify_num_valid=vplan.verify_num_valid,
            out_verify_enable=vplan.enable,
            out_write_num_valid_reqs=wplan.write_num_valid_reqs,
            swa_window_size=0,
            verify_capacity=case["verify_capacity"],
        )

    result = device_times(offsets, iters=run.iters, host_us=250)
    run.add({"op": "plan", "variant": f"offsets only, prefix={prefix}", "bs": bs, **result, "input_sets": len(sets)})
