"""Bad input is rejected with a coded error: size bounds, allocations that do not fit, the toy engine (issue 14)."""

from __future__ import annotations

import contextlib
import resource
import sys

import numpy as np
import pytest
from helpers import raises_code

from kvcanary_numba import CanaryContext, VerifyPlan, WritePlan
from kvcanary_numba.engine import EngineConfig, ToyEngine
from kvcanary_numba.errors import error
from kvcanary_numba.monitor import CanaryMonitor, KvGroup

# --- sizes: documented upper bounds, coded allocation failures ------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda: VerifyPlan.allocate(verify_capacity=2**64),
        lambda: VerifyPlan.allocate(verify_capacity=2**31),
        lambda: WritePlan.allocate(write_req_capacity=np.uint64(2**63)),
        lambda: CanaryContext.allocate(num_slots=16, ring_capacity=2**31),
        lambda: CanaryContext.allocate(num_slots=16, slot_stride_bytes=np.int64(2**62)),
        lambda: CanaryContext.allocate(num_slots=2**31),
        lambda: CanaryMonitor(full=KvGroup(kind="full", num_slots=16), write_req_capacity=2, ring_capacity=2**31),
        lambda: CanaryMonitor(full=KvGroup(kind="full", num_slots=16), write_req_capacity=2, verify_capacity=2**64),
    ],
)
def test_sizes_beyond_their_bound_are_coded_errors(call):
    with raises_code("KVC-C011"):
        call()


@contextlib.contextmanager
def _address_space_limit(extra_bytes: int):
    """Cap this process's address space a little above what it uses now (restored afterwards)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as statm:
        used = int(statm.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (used + extra_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs RLIMIT_AS and /proc")
@pytest.mark.parametrize(
    "call",
    [
        lambda: VerifyPlan.allocate(verify_capacity=2**31 - 1),
        lambda: CanaryContext.allocate(num_slots=2**31 - 1),
        lambda: CanaryMonitor(full=KvGroup(kind="full", num_slots=16), write_req_capacity=2, ring_capacity=2**31 - 1),
    ],
)
def test_an_allocation_that_does_not_fit_is_a_coded_error(call):
    with _address_space_limit(1 << 30), raises_code("KVC-C015") as excinfo:
        call()
    assert excinfo.value.fields["nbytes"] > 1 << 34


def test_allocation_error_message_names_the_size():
    text = str(
        error("KVC-C015", function="f", argument="ring_capacity", got=9, what="ring", nbytes=576, reason="MemoryError")
    )
    assert text.startswith("f: ring_capacity=9 needs a ring of 576 bytes")


# --- toy engine -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        dict(num_layers=2**62),
        dict(num_layers=np.int64(2**62)),
        dict(num_pages=2**31),
        dict(max_running=2**31),
        dict(min_prompt_len=2**31),
        dict(bytes_per_token=2**40),
    ],
)
def test_engine_sizes_have_upper_bounds(kw):
    with raises_code("KVC-C011"):  # at once: before, num_layers=2**62 tried to allocate 2**62 layers
        EngineConfig(**kw)


def test_engine_pool_larger_than_the_toy_limit_is_rejected():
    with raises_code("KVC-E005"):
        EngineConfig(num_layers=1024, num_pages=2**14, bytes_per_token=2**10)


def test_engine_sizes_given_as_numpy_integers_are_stored_as_python_ints():
    # Fuzz seed 4, case 8409: vocab_size=np.int32(2) was kept as given, and the toy model's
    # ``uint64 hash % np.int32(1)`` raised OverflowError on the first step.
    cfg = EngineConfig(seed=np.uint64(85), vocab_size=np.int32(2), num_pages=np.int64(64), swa_window=np.int16(4))
    assert all(type(getattr(cfg, name)) is int for name in EngineConfig.__dataclass_fields__)
    engine = ToyEngine(cfg)
    engine.attach_monitor(mode="raise")
    engine.run(3)
    assert engine.monitor.violations == []


def test_engine_pool_bound_is_exact_for_numpy_integer_sizes():
    # np.int32(2**24) pages of np.int32(2**16) slots wrapped to 0 slots in int32 and passed the 4 GiB bound.
    with raises_code("KVC-E005"):
        EngineConfig(num_pages=np.int32(2**24), page_size=np.int32(2**16), shared_prefix_len=0)


@pytest.mark.parametrize("kw", [dict(config={"seed": 1}), dict(faults=5), dict(faults=None), dict(faults="token_flip")])
def test_engine_arguments_of_the_wrong_type(kw):
    with raises_code("KVC-E004"):
        ToyEngine(**kw)


@pytest.mark.parametrize(
    "kw, code",
    [
        (dict(ring_capacity=0), "KVC-C011"),
        (dict(mode="x"), "KVC-M001"),
        (dict(v_half=1), "KVC-C010"),
        (dict(write_input_assert=None), "KVC-C010"),
        (dict(real_kv_hash_mode=7), "KVC-C011"),
        (dict(health_interval=-3), "KVC-C011"),
    ],
)
def test_rejected_attach_monitor_leaves_the_engine_as_it_was(kw, code):
    engine = ToyEngine(EngineConfig(seed=3))
    before = (engine.monitor, engine.sweep_interval, engine.oracle)
    with raises_code(code):
        engine.attach_monitor(sweep_interval=2, **kw)
    assert (engine.monitor, engine.sweep_interval, engine.oracle) == before
    engine.attach_monitor(mode="raise", sweep_interval=2)
    engine.run(4)
    assert engine.monitor.violations == []


def test_attach_monitor_has_no_hidden_options():
    with pytest.raises(TypeError, match="bogus_option"):
        ToyEngine().attach_monitor(bogus_option=1)
    assert ToyEngine().attach_monitor(ring_capacity=8, warmup_steps=1).ring.shape[0] == 8
