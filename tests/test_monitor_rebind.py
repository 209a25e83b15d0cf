"""CanaryMonitor.rebind_sources: the canary fingerprints the memory it is pointed at, on every path.

After a rebind a byte flipped in the new buffer is reported and one flipped in the old buffer is
not, whether the rebind comes between steps or between pre_forward and post_forward (as a JAX
engine's functional update needs), on the NumPy monitor, the kernels' step plan, the prepared
steps (simulator) and prepared steps whose raw launches the simulator runs from their packed
parameters (a stale pointer would read the old buffer). A rejected rebind changes nothing; the
monitor keeps no reference to the old arrays; the prepared launches are re-pointed (other
memory), kept (the same memory) or recorded again (other geometry); a captured graph survives
only a rebind onto the memory it launches on.
"""

from __future__ import annotations

import gc
import weakref
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import raises_code
from launch_fakes import CaiArray, launched
from monitor_helpers import BYTES, DECODE, NUM_SLOTS, PREFILL, Driver, source, token_bytes
from test_monitor_eager import replaying  # noqa: F401 - the fixture
from test_reliability_state import assert_rejected_without_change

from kvcanary_numba import FailReason, RealKvSource
from kvcanary_numba.fast.capture import CapturedStep
from kvcanary_numba.launch import _launch as _common
from kvcanary_numba.monitor.steps import BATCH_ROLES

SIMULATED = _common.ON_SIMULATOR
KINDS = ["numpy", "eager", "prepared", "raw"]
#: Decode steps of request row 1 after the prefill (slots 3, 4, 5): one token each.
STEPS = [{1: [(104 + i, 6 + i)]} for i in range(4)]


def _driver(kind: str, request, **options) -> Driver:
    if kind != "numpy":
        if not SIMULATED:
            pytest.skip("drives NumPy arrays through the kernels (simulator)")
        options.update(backend="cuda", prepared=kind != "eager")
        if kind == "raw":
            request.getfixturevalue("replaying")  # raw launches run from their packed parameters
    return Driver(**options)


def _moved(d: Driver) -> tuple[np.ndarray, np.ndarray]:
    """K and V copied to new memory, the monitor rebound to the copies; returns the old arrays."""
    old = d.k, d.v
    d.k, d.v = d.k.copy(), d.v.copy()
    d.monitor.rebind_sources(k_sources=(source(d.k),), v_sources=(source(d.v),))
    return old


def _caught(d: Driver, since: int = 0) -> set[tuple[str, int]]:
    return {(tag, slot) for tag, slot, _, reasons in d.rows(since) if "verify_real_kv_hash" in reasons}


@pytest.mark.simulator
@pytest.mark.parametrize("kind", KINDS)
def test_a_fault_in_the_new_buffer_is_caught_and_one_in_the_old_is_not(kind, request):
    d = _driver(kind, request)
    d.step(PREFILL)
    d.step(STEPS[0])  # the decode shape's launches, prepared on the first buffers
    old_k, old_v = _moved(d)
    d.step(STEPS[1])
    old_k[3, 0] ^= 1  # the old buffers: no longer what the model reads
    old_v[4, 5] ^= 1
    d.step(STEPS[2])
    assert d.rows() == []
    d.k[4, 1] ^= 1  # the new ones
    d.v[5, 2] ^= 1
    d.step(STEPS[3])
    d.monitor.flush()
    assert _caught(d) == {("TAIL_K_FULL", 4), ("TAIL_V_FULL", 5)}
    if kind == "raw":  # the packed launches of the last steps named the new buffers, never the old ones
        pointers = {p for _, ptrs in launched[-12:] for p in ptrs}
        assert d.k.ctypes.data in pointers and old_k.ctypes.data not in pointers


@pytest.mark.simulator
@pytest.mark.parametrize("kind", KINDS)
def test_functional_updates_rebound_before_post_forward(kind, request):
    """The JAX engine's order: HEAD, the forward writes a new buffer, the sources follow it, TAIL."""
    d = _driver(kind, request)
    d.step(PREFILL)
    pools = [d.k]
    for i, new in enumerate(STEPS):
        batch = d.batch(new)
        d.monitor.pre_forward(batch)
        d.k, d.v = d.k.copy(), d.v.copy()  # a functional update: every step a new buffer
        for token, slot in zip(batch.input_ids, batch.out_cache_loc):
            d.k[slot], d.v[slot] = token_bytes(int(token), 0), token_bytes(int(token), 1)
        pools.append(d.k)
        if i == 3:
            pools[-2][3, 0] ^= 1  # last step's buffer: stale now
            d.k[5, 0] ^= 1  # this step's
        d.monitor.rebind_sources(k_sources=(source(d.k),), v_sources=(source(d.v),))
        d.monitor.post_forward()
        d.requests[1] += new[1]
        d.monitor.end_step()
    d.monitor.flush()
    assert _caught(d) == {("TAIL_K_FULL", 5)}
    assert len({p.ctypes.data for p in pools}) == len(pools)  # the pool really moved every step


@pytest.mark.simulator
@pytest.mark.parametrize("kind", KINDS)
def test_the_monitor_keeps_no_reference_to_rebound_arrays(kind, request):
    d = _driver(kind, request)
    d.step(PREFILL)
    refs = [weakref.ref(a) for a in _moved(d)]
    d.step(STEPS[0])
    gc.collect()
    assert [r() for r in refs] == [None, None]


def test_a_rejected_rebind_changes_nothing():
    d = Driver(swa_window=2)
    d.step(PREFILL)
    m, k = d.monitor, d.k.copy()
    narrow = RealKvSource(tensor=k, page_size=1, num_bytes_per_token=BYTES, read_bytes=BYTES // 2)
    reshaped = source(np.zeros((NUM_SLOTS, BYTES), dtype=np.uint8))
    reshaped.tensor.shape = (2 * NUM_SLOTS, BYTES // 2)  # after it was built: rows too narrow now
    elsewhere = RealKvSource(
        tensor=CaiArray((NUM_SLOTS, BYTES), "|u1", ptr=0x100000), page_size=1, num_bytes_per_token=BYTES, read_bytes=16
    )
    v = (source(d.v.copy()),)
    cases = [
        (dict(k_sources=(source(k), source(k)), v_sources=v), "KVC-M023"),  # one K source was built
        (dict(k_sources=(source(k),), v_sources=()), "KVC-M023"),  # and one V source
        (dict(k_sources=(narrow,), v_sources=v), "KVC-M023"),  # ALL mode: 32 bytes per slot, not 16
        (dict(k_sources=(source(k[:8]),), v_sources=v), "KVC-R007"),  # 8 of 16 slots
        (dict(k_sources=(k,), v_sources=v), "KVC-R009"),
        (dict(k_sources=source(k), v_sources=v), "KVC-R009"),
        (dict(k_sources=(reshaped,), v_sources=v), "KVC-R011"),
        (dict(k_sources=(elsewhere,), v_sources=v), "KVC-C007"),
        (dict(k_sources=(source(k),), v_sources=v, group="bogus"), "KVC-C009"),
        (dict(k_sources=(source(k),), v_sources=(source(k),), group="swa"), "KVC-M023"),  # K only
    ]
    for kwargs, code in cases:
        assert_rejected_without_change(m, lambda: m.rebind_sources(**kwargs), code)
    assert m.groups[0].sources["K"][0].tensor is d.k and m.sources.unchanged()
    batch = d.batch(DECODE)
    with m.forward(batch):
        for token, slot in zip(batch.input_ids, batch.out_cache_loc):
            d.k[slot], d.v[slot] = token_bytes(int(token), 0), token_bytes(int(token), 1)
            d.swa_k[d.lut[slot]] = token_bytes(int(token), 2)
    assert_rejected_without_change(m, lambda: m.rebind_sources(k_sources=(source(k),), v_sources=v), "KVC-M005")
    m.end_step()
    m.rebind_sources(k_sources=(source(d.swa_k.copy()),), group="swa")  # K only: no V sources
    assert d.rows() == []


def test_a_monitor_without_swa_has_no_swa_group_to_rebind():
    d = Driver()
    with raises_code("KVC-C009"):
        d.monitor.rebind_sources(k_sources=(source(d.k),), v_sources=(source(d.v),), group="swa")


# --- what happens to prepared launches and a captured graph ----------------------------------------


def _prepared(request) -> Driver:
    d = _driver("prepared", request)
    d.step(PREFILL)
    d.step(STEPS[0])
    return d


def _tail_spans(d: Driver) -> set[int]:
    """ids of the arrays the prepared TAIL launches' source views name."""
    out = set()

    def visit(arg):
        if isinstance(arg, tuple):
            for item in arg:
                visit(item)
        elif isinstance(arg, _common.View) and arg.builder == "span":
            out.add(id(arg.source))

    for _, tail in d.monitor.fast.phase_pairs:
        for launch in tail.launches:
            visit(tuple(launch.args))
    return out


@pytest.mark.simulator
def test_prepared_launches_follow_a_rebind(request):
    d = _prepared(request)
    fast = d.monitor.fast
    phases, recorded = fast.phase_pairs, fast.prepared
    assert _tail_spans(d) == {id(d.k), id(d.v)}
    _moved(d)  # other memory, same geometry: re-pointed in place
    assert fast.phase_pairs == phases and fast.prepared == recorded
    assert _tail_spans(d) == {id(d.k), id(d.v)}
    same = d.k[:]  # another object over the same memory: kept, now naming the new object
    d.monitor.rebind_sources(k_sources=(source(same),), v_sources=(source(d.v),))
    assert fast.phase_pairs == phases and _tail_spans(d) == {id(same), id(d.v)}
    wide = np.zeros((NUM_SLOTS, 2 * BYTES), dtype=np.uint8)  # other geometry: recorded again
    wide[:, :BYTES] = d.k
    d.monitor.rebind_sources(k_sources=(source(wide),), v_sources=(source(d.v),))
    assert fast.phase_pairs == [] and fast.bound is None
    d.k = wide[:, :BYTES]
    d.step(STEPS[1])
    assert fast.prepared == recorded + 1 and _tail_spans(d) == {id(wide), id(d.v)} and d.rows() == []


def _stand_in_graph(d: Driver, batch, ran: list) -> CapturedStep:
    """A captured step of ``batch`` whose HEAD runs the prepared HEAD and whose TAIL only logs (it
    would launch the pointers of its capture)."""
    m = d.monitor
    head = SimpleNamespace(launch=lambda: (ran.append("graph head"), m.fast.pre(batch)))
    graph = CapturedStep(batch, head, SimpleNamespace(launch=lambda: ran.append("graph tail")), roles=BATCH_ROLES)
    m.graph = graph
    return graph


@pytest.mark.simulator
@pytest.mark.parametrize("where", ["same memory", "other memory"])
def test_a_captured_graph_survives_only_a_rebind_onto_its_memory(request, where):
    d = _prepared(request)
    batch = d.batch(STEPS[1])
    ran: list = []
    graph = _stand_in_graph(d, batch, ran)
    d.monitor.pre_forward(batch)
    for token, slot in zip(batch.input_ids, batch.out_cache_loc):
        d.k[slot], d.v[slot] = token_bytes(int(token), 0), token_bytes(int(token), 1)
    d.k[3, 0] ^= 1  # a cached slot, in the memory the TAIL must read
    if where == "same memory":
        d.monitor.rebind_sources(k_sources=(source(d.k[:]),), v_sources=(source(d.v),))
    else:
        _moved(d)
    d.monitor.post_forward()
    d.monitor.end_step()
    d.monitor.flush()
    if where == "same memory":
        assert d.monitor.graph is graph and ran == ["graph head", "graph tail"]
    else:  # the pending TAIL ran on the step plan, on the new memory; the graph is gone
        assert d.monitor.graph is None and ran == ["graph head"]
        assert _caught(d) == {("TAIL_K_FULL", 3)}


def test_fail_reason_of_a_rebound_fault_is_the_real_kv_bit():
    d = Driver()
    d.step(PREFILL)
    _moved(d)
    d.k[4, 0] ^= 1
    d.step(STEPS[0])
    d.monitor.flush()
    (row,) = d.monitor.violations
    assert row.slot_idx == 4 and row.bits == FailReason.VERIFY_REAL_KV_HASH_MISMATCH
