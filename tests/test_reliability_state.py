"""A rejected call changes nothing: every output, state array and monitor counter is as it was (issue 14).

Each test snapshots every NumPy array and scalar reachable from the monitor (or
from the call's arguments), makes one bad call, and compares byte for byte.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import types

import numpy as np
import pytest
from canary_helpers import make_context
from monitor_helpers import DECODE, PREFILL, Driver, token_bytes

from kvcanary_numba import (
    KvCanaryError,
    RealKvHashMode,
    RealKvSource,
    VerifyPlan,
    WritePlan,
    compute_real_kv_hash,
    launch_canary_plan_kernels,
    launch_canary_verify_kernel,
    launch_canary_write_kernel,
    scatter_req_token_ids,
)

#: Not state: modules (the monitor's ``xp``), functions, classes, loggers.
_OPAQUE = (types.ModuleType, types.FunctionType, types.MethodType, types.BuiltinFunctionType, type, logging.Logger)


def _walk(obj, path, out, seen, depth=0):
    if isinstance(obj, np.ndarray):
        if id(obj) not in seen:
            seen.add(id(obj))
            out[path] = obj.tobytes() if obj.dtype != object else repr(obj.tolist())
        return
    if obj is None or isinstance(obj, (bool, int, float, str, enum.Enum, np.generic)):
        out[path] = obj
        return
    if depth > 8 or id(obj) in seen or isinstance(obj, _OPAQUE) or callable(obj) and not hasattr(obj, "__dict__"):
        return
    seen.add(id(obj))
    if isinstance(obj, dict):
        items = list(obj.items())
    elif isinstance(obj, (list, tuple)):
        out[f"{path}.len"] = len(obj)
        items = list(enumerate(obj))
    else:
        names = list(getattr(obj, "__dict__", {}))
        for klass in type(obj).__mro__:
            names += [s for s in getattr(klass, "__slots__", ()) if isinstance(s, str)]
        items = [(n, getattr(obj, n, None)) for n in names if not n.startswith("__")]
    for key, value in items:
        _walk(value, f"{path}.{key}", out, seen, depth + 1)


def snapshot(obj) -> dict:
    """Path -> bytes (arrays) or value (scalars) of everything reachable from ``obj``."""
    out: dict = {}
    _walk(obj, "root", out, set())
    return out


def assert_rejected_without_change(state, call, code=None):
    before = snapshot(state)
    with pytest.raises(KvCanaryError) as excinfo:
        call()
    after = snapshot(state)
    changed = [p for p in before if p not in after or after[p] != before[p]]
    assert not changed, f"{excinfo.value.code} rejected the call but changed {changed[:8]}"
    if code is not None:
        assert excinfo.value.code == code, str(excinfo.value)
    return excinfo.value


# --- the monitor -------------------------------------------------------------------------------------------

#: One bad value per batch field: (field, value builder from the good array, code).
BAD_FIELDS = [
    ("positions", lambda a: a.astype(np.uint32), "KVC-C002"),
    ("positions", lambda a: a.astype(">i8"), "KVC-C002"),
    ("input_ids", lambda a: np.concatenate([a, a]), "KVC-C004"),
    ("out_cache_loc", lambda a: None, "KVC-C001"),
    ("out_cache_loc", lambda a: a.astype(np.float64), "KVC-C002"),
    ("req_pool_indices", lambda a: a.tolist(), "KVC-C001"),
    ("prefix_lens", lambda a: a[:0], "KVC-C004"),
    ("extend_seq_lens", lambda a: np.asarray(3), "KVC-C003"),
    ("req_to_token", lambda a: a.astype(np.int64), "KVC-C002"),
    ("req_to_token", lambda a: "table", "KVC-C001"),
    ("token_offsets", lambda a: a[:-1], "KVC-S001"),
    ("token_ids_flat", lambda a: a.astype(np.int32), "KVC-C002"),
    ("expected_input_positions", lambda a: None, "KVC-M011"),
    ("req_to_token", lambda a: np.repeat(a, 2, axis=1)[:, ::2], "KVC-C006"),
    ("expected_input_tokens", lambda a: a.astype(np.uint64), "KVC-C002"),
]


def _driver(**options):
    d = Driver(swa_window=2, check_verify_expected_token=True, max_requests=4, max_context_len=16, **options)
    d.step(PREFILL)
    return d


def _decode_batch(d):
    tokens = [t for t, _ in DECODE[1]]
    return d.batch(DECODE, expected=tokens)


def _write_kv(d, batch):
    """The forward: K, V and SWA K bytes of every new token."""
    for token, slot in zip(batch.input_ids, batch.out_cache_loc):
        d.k[slot], d.v[slot] = token_bytes(int(token), 0), token_bytes(int(token), 1)
        d.swa_k[d.lut[slot]] = token_bytes(int(token), 2)


def _end_clean(d):
    """Close the decode step, run one more, and find no violation."""
    d.requests[1] += DECODE[1]
    d.monitor.end_step()
    d.step({1: [(105, 7)]})
    d.monitor.flush()
    assert d.rows() == []


def _finish_clean(d, batch):
    """The monitor runs the step it was given and one more, and reports nothing."""
    with d.monitor.forward(batch):
        _write_kv(d, batch)
    _end_clean(d)


@pytest.mark.parametrize("field, bad, code", BAD_FIELDS, ids=[f"{f}-{c}-{i}" for i, (f, _, c) in enumerate(BAD_FIELDS)])
def test_pre_forward_rejects_a_bad_batch_before_the_first_launch(field, bad, code):
    d = _driver()
    batch = _decode_batch(d)
    good = getattr(batch, field)
    setattr(batch, field, bad(good))  # reassigned after construction: the hook checks again
    assert_rejected_without_change(d.monitor, lambda: d.monitor.pre_forward(batch), code)
    setattr(batch, field, good)
    _finish_clean(d, batch)


@pytest.mark.parametrize(
    "field, bad, code", BAD_FIELDS[:6], ids=[f"{f}-{i}" for i, (f, _, _) in enumerate(BAD_FIELDS[:6])]
)
def test_post_forward_rejects_a_field_reassigned_since_pre_forward(field, bad, code):
    d = _driver()
    batch = _decode_batch(d)
    d.monitor.pre_forward(batch)
    good = getattr(batch, field)
    setattr(batch, field, bad(good))
    assert_rejected_without_change(d.monitor, d.monitor.post_forward, code)
    setattr(batch, field, good)  # the step is still open: fix the batch and finish it
    _write_kv(d, batch)
    d.monitor.post_forward()
    _end_clean(d)


@pytest.mark.parametrize("steps", [1, 2])
def test_an_swa_lut_changed_in_place_is_refused_before_the_first_launch(steps):
    # The plan checks the LUT's padding entry (KVC-P008), but the FULL group plans and launches
    # first: the monitor checks it with the batch, before anything runs, at every step.
    d = _driver()
    batch = _decode_batch(d)
    d.lut[0] = 5
    for _ in range(steps):
        assert_rejected_without_change(d.monitor, lambda: d.monitor.pre_forward(batch), "KVC-P008")
    d.lut[0] = 0
    _finish_clean(d, batch)


@pytest.mark.parametrize("own", ["ring", "canary buffer", "status words"])
def test_a_batch_field_over_the_monitors_own_memory_is_refused_before_the_first_launch(own):
    d = _driver()
    batch = _decode_batch(d)
    n = batch.positions.shape[0]
    memory = {
        "ring": d.monitor.ring.reshape(-1),
        "canary buffer": d.monitor.groups[0].buffers["TAIL", "K"].view(np.int64).reshape(-1),
        "status words": d.monitor.status.words.view(np.int64).reshape(-1),
    }[own]
    good = batch.positions
    view = memory[:n]
    view[:] = good  # the right values, in memory the monitor's launches write
    batch.positions = view
    assert_rejected_without_change(d.monitor, lambda: d.monitor.pre_forward(batch), "KVC-C017")
    batch.positions = good


def test_rejected_sweep_changes_nothing():
    from kvcanary_numba.monitor import SlotChain

    d = _driver()
    big = [SlotChain(slots=list(range(1, 16))), SlotChain(slots=[1, 2])]
    for chains in (big, [SlotChain(slots=[1]), "chain"], None):
        assert_rejected_without_change(d.monitor, lambda: d.monitor.sweep(chains))


# --- the public launches -----------------------------------------------------------------------------------


def _sources(rows=17):
    return (
        RealKvSource(
            tensor=np.arange(rows * 32, dtype=np.uint8).reshape(rows, 32),
            page_size=1,
            num_bytes_per_token=32,
            read_bytes=32,
        ),
    )


def _verify_kwargs():
    ctx = make_context(16, sources=_sources(), mode=RealKvHashMode.ALL)
    plan = VerifyPlan.allocate(verify_capacity=4)
    plan.verify_slot_indices[:] = [1, 2, 3, 20]
    plan.verify_num_valid[0] = 4
    return dict(context=ctx, plan=plan, check_verify_expected_token=False)


def _write_kwargs():
    ctx = make_context(16, sources=_sources(), mode=RealKvHashMode.ALL)
    plan = WritePlan.allocate(write_req_capacity=2)
    plan.write_offsets[:] = [0, 2, 3]
    plan.write_num_valid_reqs[0] = 2
    i64 = lambda v: np.asarray(v, dtype=np.int64)  # noqa: E731
    return dict(
        context=ctx,
        plan=plan,
        input_ids=i64([5, 6, 7]),
        positions=i64([0, 1, 0]),
        out_cache_loc=i64([1, 2, 3]),
        enable_write_input_assert=False,
        expected_input_tokens=None,
        expected_input_positions=None,
    )


def _readonly(a):
    a = a.copy()
    a.setflags(write=False)
    return a


VERIFY_BAD = [
    ("plan", lambda kw: dataclasses.replace(kw["plan"], enable=kw["plan"].enable.astype(np.int64)), "KVC-C002"),
    ("plan", lambda kw: dataclasses.replace(kw["plan"], verify_prev_slot_indices=np.zeros(3, np.int64)), "KVC-C004"),
    ("context", lambda kw: kw["context"].replace(real_kv_sources=_sources(8)), "KVC-R007"),
    ("context", lambda kw: kw["context"].replace(violation_ring=_readonly(kw["context"].violation_ring)), "KVC-C013"),
    (
        "context",
        lambda kw: kw["context"].replace(kernel_run_counter=_readonly(kw["context"].kernel_run_counter)),
        "KVC-C013",
    ),
    ("check_verify_expected_token", lambda kw: 1, "KVC-C010"),
]
WRITE_BAD = [
    ("positions", lambda kw: kw["positions"].astype(np.uint32), "KVC-C002"),
    ("out_cache_loc", lambda kw: kw["out_cache_loc"][:2], "KVC-C004"),
    ("expected_input_tokens", lambda kw: kw["input_ids"], "KVC-W003"),
    ("context", lambda kw: kw["context"].replace(real_kv_sources=_sources(8)), "KVC-R007"),
    ("context", lambda kw: kw["context"].replace(canary_buf=_readonly(kw["context"].canary_buf)), "KVC-C013"),
    (
        "context",
        lambda kw: kw["context"].replace(slot_run_counter=_readonly(kw["context"].slot_run_counter)),
        "KVC-C013",
    ),
]


LAUNCH_CASES = [(launch_canary_verify_kernel, _verify_kwargs, bad) for bad in VERIFY_BAD] + [
    (launch_canary_write_kernel, _write_kwargs, bad) for bad in WRITE_BAD
]


@pytest.mark.parametrize("backend", ["numpy", "cuda"])
@pytest.mark.parametrize(
    "launch, kwargs, bad",
    LAUNCH_CASES,
    ids=[f"{f.__name__.split('_')[2]}-{b[0]}-{b[2]}-{i}" for i, (f, _, b) in enumerate(LAUNCH_CASES)],
)
def test_rejected_verify_or_write_changes_no_argument(launch, kwargs, bad, backend):
    kw = kwargs()
    name, mutate, code = bad
    kw[name] = mutate(kw)
    assert_rejected_without_change(kw, lambda: launch(**kw, backend=backend), code)


@pytest.mark.parametrize("backend", ["numpy", "cuda"])
def test_read_only_outputs_are_rejected_up_front_on_every_backend(backend):
    slots = np.array([1, 2], np.int64)
    kw = dict(
        real_kv_sources=_sources(),
        real_kv_hash_mode=RealKvHashMode.ALL,
        slot_indices=slots,
        out=_readonly(np.full(2, -7, np.int64)),
    )
    assert_rejected_without_change(kw, lambda: compute_real_kv_hash(**kw, backend=backend), "KVC-C013")
    pool = _readonly(np.full((3, 4), -1, np.int32))
    kw = dict(
        flat_in=np.arange(3, dtype=np.int64),
        offsets=np.array([0, 3], np.int64),
        req_pool_indices=np.array([1], np.int64),
        pool_out=pool,
    )
    assert_rejected_without_change(kw, lambda: scatter_req_token_ids(**kw, backend=backend), "KVC-C013")
    vplan, wplan = VerifyPlan.allocate(verify_capacity=4), WritePlan.allocate(write_req_capacity=2)
    vplan = dataclasses.replace(vplan, verify_expected_positions=_readonly(vplan.verify_expected_positions))
    i64 = lambda v: np.asarray(v, dtype=np.int64)  # noqa: E731
    kw = dict(
        verify_plan_out=vplan,
        write_plan_out=wplan,
        req_pool_indices=i64([1]),
        prefix_lens=i64([2]),
        extend_seq_lens=i64([1]),
        req_to_token=np.arange(8, dtype=np.int32).reshape(2, 4),
        swa_window_size=0,
        full_to_swa_index_mapping=None,
        verify_capacity=4,
        req_to_verify_expected_tokens=None,
        req_to_verify_expected_tokens_valid_lens=None,
        kv_token_id_vs_position_offset=0,
    )
    assert_rejected_without_change(kw, lambda: launch_canary_plan_kernels(**kw, backend=backend), "KVC-C013")


def test_read_only_inputs_run_on_the_simulator_as_on_the_cpu():
    sources = _sources()
    slots = _readonly(np.array([1, 5, 16], np.int64))
    outs = []
    for backend in ("numpy", "cuda"):
        out = np.full(3, -7, np.int64)
        compute_real_kv_hash(
            real_kv_sources=sources, real_kv_hash_mode=RealKvHashMode.ALL, slot_indices=slots, out=out, backend=backend
        )
        outs.append(out)
    np.testing.assert_array_equal(outs[0], outs[1])
    assert (outs[0] != -7).all() and len(set(outs[0].tolist())) == 3


@pytest.mark.simulator
@pytest.mark.parametrize("fast", [False, True], ids=["eager", "prepared"])
def test_tail_launches_on_the_arrays_of_pre_forward_on_every_path(fast):
    """A field reassigned to another valid array between the hooks is not what TAIL stamps: the
    step was planned with the arrays of pre_forward, and eager and prepared paths agree on it."""
    from monitor_helpers import monitor_records

    if fast and os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        pytest.skip("the prepared variant feeds NumPy arrays to the kernels: simulator only")
    records = []
    for reassign in (False, True):
        # prepared: NumPy arrays through the kernels under the simulator.
        d = _driver(backend="cuda", prepared=True) if fast else _driver()
        batch = _decode_batch(d)
        d.monitor.pre_forward(batch)
        _write_kv(d, batch)  # the forward writes the planned tokens' KV
        if reassign:
            batch.input_ids = batch.input_ids + 1000  # valid, and different tokens
        d.monitor.post_forward()
        d.monitor.end_step()
        records.append(monitor_records(d.monitor.groups[0].tail[0].context.canary_buf).copy())
    np.testing.assert_array_equal(records[1], records[0])
