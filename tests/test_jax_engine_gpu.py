"""The JAX example engine with Llama-3.2-1B shapes on a GPU, the canary on its own CuPy stream.

Skipped without a GPU, CuPy, or JAX with CUDA. What the CPU tests check for the tiny model,
here for the larger one, with XLA and the canary on different streams: clean runs stay
silent (no false positive from a read racing XLA's writes), planted faults are caught, in
both orderings (device-side waits and a fence, or host syncs).
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

import pytest

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave GPU memory to CuPy as well
jax = pytest.importorskip("jax")
pytest.importorskip("cupy")

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from examples.jax_engine import (  # noqa: E402
    LLAMA_3_2_1B,
    EngineConfig,
    JaxEngine,
    bench,  # noqa: E402
)
from kvcanary_numba import FailReason  # noqa: E402

pytestmark = pytest.mark.gpu
F = FailReason

#: Eight requests of up to 576 tokens, prefilled in chunks of 256.
CONFIG = EngineConfig(
    page_size=16,
    num_pages=600,
    max_running=8,
    max_context=1024,
    chunk_size=256,
    step_tokens=512,
    min_prompt=128,
    max_prompt=512,
    min_new=8,
    max_new=64,
)


@pytest.fixture(scope="module")
def gpu():
    try:
        return jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("JAX has no GPU backend here")


def _run(gpu, faults=None, *, steps, donate=True, **options) -> JaxEngine:
    engine = JaxEngine(LLAMA_3_2_1B, CONFIG.with_(donate=donate), faults=faults, device=gpu)
    canary = engine.attach_canary(health_interval=0, **options)
    assert canary.gpu and canary.stream is not None
    engine.run(steps)
    return engine


@pytest.mark.parametrize("order", ["stream", "block"])
def test_llama_shapes_run_clean_on_the_gpu(gpu, order):
    engine = _run(gpu, steps=80, order=order)
    assert engine.canary.violations == []
    assert engine.canary.monitor.stats()["protected_tokens"] > 0 and engine.sched.finished > 0


@pytest.mark.parametrize(
    "fault, bits",
    [
        ("table_slip", F.VERIFY_CHAIN_HASH_MISMATCH),
        ("slot_reuse", F.VERIFY_POSITION_MISMATCH | F.VERIFY_CHAIN_HASH_MISMATCH),
        ("token_flip", F.WRITE_TOKEN_MISMATCH),
    ],
)
def test_planted_fault_is_caught_on_the_gpu(gpu, fault, bits):
    engine = _run(gpu, {fault: 6}, steps=40)
    (record,) = engine.faults
    found = engine.canary.violations
    assert any(v.slot_idx in record.slots and v.bits & bits for v in found), (record, found[:4])
    assert min(v.step for v in found) >= record.step


@pytest.mark.parametrize("donate", [True, False], ids=["donated", "functional"])
def test_kv_byte_flip_is_caught_on_the_gpu(gpu, donate):
    engine = _run(gpu, {"kv_flip": 6}, steps=40, donate=donate, real_kv=True)
    (record,) = engine.faults
    found = engine.canary.violations
    assert any(v.slot_idx in record.slots and v.bits & F.VERIFY_REAL_KV_HASH_MISMATCH for v in found)
    assert min(v.step for v in found) >= record.step


def test_real_kv_run_is_clean_on_the_gpu(gpu):
    assert _run(gpu, steps=80, real_kv=True).canary.violations == []


def test_bench_replays_the_canary_graph_on_the_gpu(gpu, tmp_path):
    assert bench.main(["--tiny", "--quick", "--steps", "3", "--rounds", "1", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "jax_engine_bench.json").read_text())["rows"]
    assert {(r["verification"], r["arm"]) for r in rows} == {
        ("-", "off"),
        ("full", "on"),
        ("full", "graph"),
        ("budgeted", "on"),
        ("budgeted", "graph"),
    }
    assert all(r["violations"] == 0 for r in rows)
