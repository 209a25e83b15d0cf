"""Write kernels against the reference on whole scenarios: garbage, the baseline, CPU pipelines, long GPU requests."""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest
from canary_helpers import HEAD, counters, fields, make_context, ring_rows, stamp, write_args, write_plan
from canary_oracles import random_source
from kernel_pairs import KERNEL_DEVICE, run_pair, to_device, to_host, write

from kvcanary_numba import RealKvHashMode
from kvcanary_numba.reference.write import launch_canary_write_kernel as reference_write

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the benchmarks package, as tests/test_benchmarks.py imports it
    sys.path.insert(0, str(ROOT))

from benchmarks.baseline_kernels import launch_write_baseline  # noqa: E402

pytestmark = pytest.mark.simulator

PARTIAL, ALL = RealKvHashMode.PARTIAL, RealKvHashMode.ALL


# --- random garbage ----------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_random_garbage_matches_the_reference(seed, write_path):
    rng = np.random.default_rng(seed)
    sources = [random_source(rng, 48, page_size=4, nbytes=32, hole=16), random_source(rng, 48, nbytes=16)]
    ctx = make_context(
        48, stride=40 + 8 * (seed % 2), sources=sources[: seed % 3], mode=[ALL, PARTIAL][seed % 2], ring_capacity=8
    )
    ctx.enable_chain_position_assert[0] = seed % 2
    fields(ctx)[...] = rng.integers(-2, 60, size=fields(ctx).shape)
    bs, capacity, n = 5, 7, 36
    # Requests run concurrently on the GPU, so no two of them store one slot and no
    # seed is a slot stored in the same launch (that order is a race, as in SGLang).
    seeds = np.where(rng.random(bs) < 0.3, rng.integers(-2, 1, bs), rng.integers(38, 52, bs))
    plan = write_plan(rng.integers(0, 15, bs), seeds, capacity=capacity, num_valid=int(rng.integers(-1, 9)))
    plan.write_offsets[rng.integers(0, capacity + 1)] = rng.integers(-5, n + 5)  # a broken offset
    garbage = lambda values: np.where(rng.random(n) < 0.1, rng.integers(-(2**63), 2**63 - 1, n), values)  # noqa: E731
    slots = garbage(np.where(rng.random(n) < 0.1, rng.integers(-2, 0, n), rng.permutation(np.arange(1, 38))[:n]))
    tokens, positions = garbage(rng.integers(0, 9, n)), garbage(rng.integers(0, 9, n))
    expected = (garbage(rng.integers(0, 9, n)), garbage(rng.integers(0, 9, n))) if seed % 4 < 2 else (None, None)
    write(ctx, plan, tokens, positions, slots, *expected)


# --- the one-thread-per-request baseline ------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_baseline_matches_the_reference(seed):
    rng = np.random.default_rng(100 + seed)
    ctx = make_context(48, sources=[random_source(rng, 48, page_size=2, nbytes=32)], mode=ALL, ring_capacity=512)
    fields(ctx)[...] = rng.integers(0, 9, size=fields(ctx).shape)
    # Distinct slots, and seeds no request stores: requests race on a GPU (as in SGLang).
    candidates = rng.permutation(np.arange(-1, 50))
    lengths = rng.integers(0, 12, 4)
    n = int(lengths.sum())
    slots, seeds = candidates[:n], rng.choice(candidates[n:], 4)
    plan = write_plan(lengths, seeds, capacity=5)
    kwargs = write_args(
        plan, rng.integers(0, 9, n), rng.integers(0, 9, n), slots, rng.integers(0, 9, n), rng.integers(0, 9, n)
    )
    device = to_device(ctx, KERNEL_DEVICE)
    launch_write_baseline(context=device, **{k: to_device(v, KERNEL_DEVICE) for k, v in kwargs.items()})
    reference_write(context=ctx, **kwargs)
    np.testing.assert_array_equal(to_host(device.canary_buf), ctx.canary_buf)
    assert counters(ctx) == tuple(int(to_host(a)[0]) for a in (device.slot_run_counter, device.kernel_run_counter))
    got = sorted(
        tuple(int(v) for v in r)
        for r in to_host(device.violation_ring)[: int(to_host(device.violation_write_index)[0])]
    )
    assert got == sorted(ring_rows(ctx))


# --- plan -> verify -> write pipelines (SGLang's pipeline tests) ----------------------------


def _paired_verify(ctx, plan, check=False, backend="numpy"):
    run_pair(ctx, "verify", plan=plan, check_verify_expected_token=check)


def _paired_write(ctx, plan, *entries, backend="numpy"):
    run_pair(ctx, "write", **write_args(plan, *entries))


def _pipeline_cases():
    """The CPU pipeline tests, with their parametrizations expanded (their asserts then run as they are)."""
    import itertools

    import test_reference_pipeline

    cases = []
    for name, test in vars(test_reference_pipeline).items():
        if not name.startswith("test_"):
            continue
        axes = []
        for mark in getattr(test, "pytestmark", []):
            if mark.name == "parametrize":
                names = [n.strip() for n in mark.args[0].split(",")] if isinstance(mark.args[0], str) else mark.args[0]
                axes.append([dict(zip(names, v if len(names) > 1 else (v,))) for v in mark.args[1]])
        for combo in itertools.product(*axes):
            kwargs = {k: v for part in combo for k, v in part.items()}
            label = "-".join(str(v) for v in kwargs.values())
            cases.append(pytest.param(test, kwargs, id=f"{name[5:]}[{label}]" if label else name[5:]))
    return cases


@pytest.mark.parametrize(("case", "kwargs"), _pipeline_cases())
def test_cpu_pipeline_scenarios_run_the_kernels_too(case, kwargs, monkeypatch):
    # Each verify and write of the scenario also runs on the kernels and must agree with the reference.
    import canary_helpers

    monkeypatch.setattr(canary_helpers, "run_verify", _paired_verify)
    monkeypatch.setattr(canary_helpers, "run_write", _paired_write)
    case(**kwargs)


# --- at scale on a GPU ---------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [RealKvHashMode.NONE, ALL])
@pytest.mark.parametrize(("requests", "length"), [(8, 32768), (300, 700)])
def test_gpu_long_requests_match_the_reference(mode, requests, length, write_path):
    rng = np.random.default_rng(requests)
    total = requests * length
    sources = [random_source(rng, total + 2, page_size=16, nbytes=256)]
    ctx = make_context(total + 2, sources=sources, mode=mode, ring_capacity=1 << 14)
    stamp(ctx, 1, 1, 0, HEAD)  # seeds are -1, 0 or 1, slots never written here (no cross-request race)
    slots = rng.permutation(np.arange(2, total + 2))
    slots[rng.random(total) < 0.01] = -1
    positions = np.tile(np.arange(1, length + 1), requests)
    positions[rng.random(total) < 0.001] += 7
    plan = write_plan([length] * requests, rng.integers(-1, 2, requests))
    write(ctx, plan, rng.integers(0, 1 << 40, total), positions, slots, None, None)
