"""Memory that moves under a source or a batch array: checked again before any launch reads it.

A ``RealKvSource`` is frozen, its tensor is not: NumPy's ``shape``, ``dtype`` and ``strides``
can be set in place, ``object.__setattr__`` rewrites a field (NumPy refuses to ``resize`` an
array the validation memo holds a weak reference to; CuPy and PyTorch moves are in
``test_sources_gpu.py``).
Every validated call checks a source again as it is (KVC-R011 for one that broke its rules);
the monitor compares its sources with what it checked before each TAIL and follows a change
that still passes or refuses one that does not, before anything is launched. A batch refilled
in place is checked again when a field's layout changed. Property tests pick the attribute that
moves and when; a planted corrupted cached slot is never missed, and nothing but a coded error
or a report comes out (an out-of-bounds read would raise IndexError on NumPy and under the
simulator).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from helpers import raises_code
from hypothesis import HealthCheck, given, settings, strategies as st
from launch_fakes import CaiArray
from monitor_helpers import BYTES, DECODE, PREFILL, Driver, token_bytes
from test_monitor_eager import replaying  # noqa: F401 - the fixture
from test_reliability_state import assert_rejected_without_change

from kvcanary_numba import (
    KvCanaryError,
    RealKvHashMode,
    RealKvSource,
    compute_real_kv_hash,
    fingerprint as core_fingerprint,
)
from kvcanary_numba.fast.bound import BoundArrays, holds_test, layout_key
from kvcanary_numba.fast.capture import CapturedStep
from kvcanary_numba.launch import _launch as _common

SIMULATED = _common.ON_SIMULATOR
NEXT = {1: [(105, 7)]}


def _strides(array: np.ndarray, strides: tuple) -> None:
    with warnings.catch_warnings():  # deprecated in NumPy 2.4, still possible: what is tested
        warnings.simplefilter("ignore", DeprecationWarning)
        array.strides = strides


def _set(source: RealKvSource, name: str, value) -> None:
    object.__setattr__(source, name, value)


#: name -> (move(source), undo(source) or None: the source's tensor becomes a view of the memory as it was,
#: code of the refusal or None: the monitor follows the move).
MOVES = {
    "shape: rows too narrow": (
        lambda s: setattr(s.tensor, "shape", (32, 16)),
        lambda s: setattr(s.tensor, "shape", (16, 32)),
        "KVC-R011",
    ),
    "shape: too few rows": (
        lambda s: setattr(s.tensor, "shape", (8, 64)),
        lambda s: setattr(s.tensor, "shape", (16, 32)),
        "KVC-R007",
    ),
    "dtype: uint16": (
        lambda s: setattr(s.tensor, "dtype", np.uint16),
        lambda s: setattr(s.tensor, "dtype", np.uint8),
        None,
    ),
    "dtype: int64": (
        lambda s: setattr(s.tensor, "dtype", np.int64),
        lambda s: setattr(s.tensor, "dtype", np.uint8),
        None,
    ),
    "strides: rows repeat": (lambda s: _strides(s.tensor, (0, 1)), None, None),
    "strides: rows off the grid": (lambda s: _strides(s.tensor, (8, 1)), None, "KVC-R011"),
    "field: page_size": (lambda s: _set(s, "page_size", 2), lambda s: _set(s, "page_size", 1), "KVC-R011"),
    "field: num_bytes_per_token": (
        lambda s: _set(s, "num_bytes_per_token", 16),
        lambda s: _set(s, "num_bytes_per_token", 32),
        "KVC-R011",
    ),
    "field: read_bytes": (lambda s: _set(s, "read_bytes", 16), lambda s: _set(s, "read_bytes", 32), "KVC-M023"),
    "field: tensor elsewhere": (lambda s: _set(s, "tensor", s.tensor.copy()), None, None),
    "field: tensor not an array": (lambda s: _set(s, "tensor", "kv"), None, "KVC-C001"),
}


#: A refused move, one followed onto other memory, one followed onto another geometry.
_SAMPLE = ("shape: rows too narrow", "field: tensor elsewhere", "dtype: int64")


def _source(d: Driver) -> RealKvSource:
    return d.monitor.groups[0].sources["K"][0]


def _write(d: Driver, batch, rows: np.ndarray) -> None:
    for token, slot in zip(batch.input_ids, batch.out_cache_loc):
        rows[slot], d.v[slot] = token_bytes(int(token), 0), token_bytes(int(token), 1)


def _moved_step(d: Driver, name: str, when: str) -> None:
    """Flip a K byte of cached slot 3, move the K source by ``name`` (between steps or between the
    hooks), run a step: refused with its code before any launch (then undone and finished), or
    followed; either way slot 3 is reported."""
    move, undo, code = MOVES[name]
    source = _source(d)
    rows = d.k[:]  # a view with the original geometry: the forward writes through it
    d.k[3, 0] ^= 1
    batch = d.batch(DECODE)
    if when == "between steps":
        move(source)
    d.monitor.pre_forward(batch)
    _write(d, batch, rows)
    if when == "before post_forward":
        move(source)
    if code is not None:
        assert_rejected_without_change(d.monitor, d.monitor.post_forward, code)
        undo(source) if undo is not None else _set(source, "tensor", rows)
        d.monitor.post_forward()
    else:
        d.monitor.post_forward()
    d.monitor.end_step()
    d.monitor.flush()
    caught = {slot for tag, slot, _, reasons in d.rows() if tag == "TAIL_K_FULL" and "verify_real_kv_hash" in reasons}
    assert 3 in caught
    if name.startswith("dtype") or name == "field: tensor elsewhere" or code is not None:
        assert caught == {3}  # the same bytes of every slot: nothing else reported


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(MOVES)), when=st.sampled_from(["between steps", "before post_forward"]))
def test_a_source_moved_in_place_is_followed_or_refused_and_never_misses_a_fault(name, when):
    d = Driver()
    d.step(PREFILL)
    _moved_step(d, name, when)


@pytest.mark.simulator
@pytest.mark.skipif(not SIMULATED, reason="drives NumPy arrays through the kernels")
@pytest.mark.parametrize(
    "kind, name",
    [("prepared", name) for name in sorted(MOVES)] + [(kind, name) for kind in ("eager", "raw") for name in _SAMPLE],
)
def test_kernel_paths_check_a_moved_source_before_the_tail(name, kind, request):
    if kind == "raw":
        request.getfixturevalue("replaying")
    d = Driver(backend="cuda", prepared=kind != "eager")
    d.step(PREFILL)
    d.step(NEXT)  # the decode shape prepared on the source as built (DECODE below has its shapes)
    _moved_step(d, name, "before post_forward")


# --- the public calls ----------------------------------------------------------------------------


def _fingerprint(sources, call=compute_real_kv_hash):
    out = np.zeros(4, dtype=np.int64)
    call(real_kv_sources=sources, real_kv_hash_mode=RealKvHashMode.ALL, slot_indices=np.arange(4), out=out)
    return out


@pytest.mark.parametrize("name", [n for n, (_, _, code) in MOVES.items() if code == "KVC-R011"])
@pytest.mark.parametrize("call", [compute_real_kv_hash, core_fingerprint.compute_real_kv_hash], ids=["fast", "core"])
def test_a_public_call_checks_a_source_again_after_an_earlier_call_passed(name, call):
    kv = np.arange(16 * 32, dtype=np.uint8).reshape(16, 32)
    source = RealKvSource(tensor=kv, page_size=1, num_bytes_per_token=32, read_bytes=32)
    before = _fingerprint((source,), call)  # the call passed: the validation memo knows its arguments
    move, undo, _ = MOVES[name]
    view = kv[:]
    move(source)
    with raises_code("KVC-R011") as excinfo:
        _fingerprint((source,), call)
    assert excinfo.value.fields["argument"] == "real_kv_sources[0]"
    undo(source) if undo is not None else _set(source, "tensor", view)
    np.testing.assert_array_equal(_fingerprint((source,), call), before)


def test_a_source_tensor_that_became_dlpack_only_is_read_through_a_view_or_refused():
    class DlpackOnly:  # what a JAX CPU array looks like to the package
        def __init__(self, array):
            self.array = array

        def __dlpack__(self, **kwargs):
            return self.array.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.array.__dlpack_device__()

    kv = np.arange(16 * 32, dtype=np.uint8).reshape(16, 32)
    source = RealKvSource(tensor=kv, page_size=1, num_bytes_per_token=32, read_bytes=32)
    before = _fingerprint((source,))
    _set(source, "tensor", DlpackOnly(kv))
    # The public calls read DLPack-only arrays through views (as the constructor does) ...
    np.testing.assert_array_equal(_fingerprint((source,)), before)
    np.testing.assert_array_equal(_fingerprint((source,), core_fingerprint.compute_real_kv_hash), before)
    # ... the monitor's launches read a source's tensor as it is: refused before the TAIL.
    d = Driver()
    d.step(PREFILL)
    batch = d.batch(DECODE)
    d.monitor.pre_forward(batch)
    _write(d, batch, d.k)
    _set(_source(d), "tensor", DlpackOnly(d.k))
    with raises_code("KVC-R011") as excinfo:
        d.monitor.post_forward()
    assert excinfo.value.fields["cause"] == "KVC-C001"


# --- batch arrays changed in place ---------------------------------------------------------------

#: (field, move in place, code): a batch field the monitor checked, changed under the same object.
BATCH_MOVES = [
    ("positions", lambda a: setattr(a, "dtype", np.float64), "KVC-C002"),
    ("out_cache_loc", lambda a: setattr(a, "shape", (1, 1)), "KVC-C003"),
    ("input_ids", lambda a: setattr(a, "dtype", np.uint64), "KVC-C002"),
    ("req_to_token", lambda a: setattr(a, "dtype", np.float32), "KVC-C002"),
    ("req_to_token", lambda a: _strides(a, (4, 16)), "KVC-C006"),
    ("prefix_lens", lambda a: setattr(a, "shape", (1, 1)), "KVC-C003"),
]


@pytest.mark.parametrize("hook", ["pre_forward", "post_forward"])
@pytest.mark.parametrize("field, move, code", BATCH_MOVES, ids=[f"{f}-{c}" for f, _, c in BATCH_MOVES])
def test_a_batch_field_changed_in_place_is_checked_again(field, move, code, hook):
    d = Driver()
    d.step(PREFILL)
    batch = d.batch(DECODE)
    m = d.monitor
    m.pre_forward(batch)  # checked once: the hooks skip the array checks while nothing moved
    if hook == "pre_forward":
        _write(d, batch, d.k)
        m.post_forward()
        m.end_step()
    array = getattr(batch, field)
    move(array)
    call = (lambda: m.pre_forward(batch)) if hook == "pre_forward" else m.post_forward
    assert_rejected_without_change(m, call, code)


def test_bound_arrays_and_a_graph_see_arrays_changed_in_place():
    a, b = np.zeros(4, dtype=np.int64), np.zeros((2, 8), dtype=np.int32)
    cai = CaiArray((4,), "<i8", ptr=0x2000)
    bound = BoundArrays((a, b, cai), "head", "tail")
    assert bound.holds((a, b, cai))
    a.dtype = np.float64  # same shape, other dtype
    assert not bound.holds((a, b, cai))
    a.dtype = np.int64
    _strides(b, (0, 4))
    assert not bound.holds((a, b, cai))
    bound = BoundArrays((a, b, cai), "head", "tail")  # bound again, as it is now
    assert bound.holds((a, b, cai))
    cai.__cuda_array_interface__["data"] = (0x3000, False)  # a tensor given other storage
    assert not bound.holds((a, b, cai))
    key = layout_key(cai)
    cai.__cuda_array_interface__["data"] = (0x2000, False)
    assert bound.holds((a, b, cai)) and layout_key(cai) != key

    from types import SimpleNamespace

    batch = SimpleNamespace(x=a, y=cai, z=None)
    holds = holds_test(("x", "y", "z"), (a, cai, None))
    graph = CapturedStep(batch, None, None, roles=("x", "y", "z"))
    assert holds(batch) and graph.matches(batch)
    cai.__cuda_array_interface__["shape"] = (3,)
    assert not holds(batch) and not graph.matches(batch)
    cai.__cuda_array_interface__["shape"] = (4,)
    batch.x = a.copy()  # another object: not the one held; a graph needs its layout (other memory)
    assert not holds(batch) and not graph.matches(batch)


def test_a_failed_recheck_raises_before_any_launch_and_leaves_the_step_open():
    d = Driver()
    d.step(PREFILL)
    batch = d.batch(DECODE)
    d.monitor.pre_forward(batch)
    _write(d, batch, d.k)
    d.k.shape = (64, 8)  # 8-byte rows: a 32-byte slot would read four rows
    with pytest.raises(KvCanaryError) as excinfo:
        d.monitor.post_forward()
    assert excinfo.value.code == "KVC-R011" and "full.k_sources" in str(excinfo.value)
    d.k.shape = (16, 32)
    d.monitor.post_forward()
    d.monitor.end_step()
    d.monitor.flush()
    assert d.rows() == []
