"""The monitor's prepared steps (``kvcanary_numba.fast.steps``) against the eager step plan; graph
matching in the hooks; on a GPU, raw launches and CUDA-graph replays."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import raises_code
from monitor_helpers import ROWS, WIDTH, Driver, gpu_monitor_run, monitor_records

from kvcanary_numba import RealKvHashMode, RealKvSource
from kvcanary_numba.fast import driver as fast_driver
from kvcanary_numba.fast.capture import CapturedStep
from kvcanary_numba.fast.kernels import scatter_lens as kernels_scatter, translate as kernels_translate
from kvcanary_numba.fast.steps import PreparedPhase, compile_monitor_kernels
from kvcanary_numba.launch import _launch as _common
from kvcanary_numba.monitor import StepBatch
from kvcanary_numba.monitor.steps import BATCH_ROLES

SIMULATED = _common.ON_SIMULATOR


# --- the monitor fast path (simulator) ---------------------------------------------


def _driver(kind: str, **options) -> Driver:
    """``reference``: NumPy references; ``eager``: the step plan on the kernels; ``fast``: prepared steps."""
    if kind != "reference":
        options.update(backend="cuda", prepared=kind == "fast")  # the kernels on NumPy arrays (simulator)
    return Driver(**options)


_STEPS = [
    ({1: [(11, 1), (12, 2)], 2: [(21, 5)]}, None),
    ({1: [(13, 3)], 2: [(22, 6)]}, None),
    ({1: [(14, 4)], 2: [(23, 7)]}, "flip"),  # same shapes as the step before: rebinding only
    ({1: [(15, 8)], 2: [(24, 9)]}, None),
]


_TOKENS = {"check_verify_expected_token": True, "max_requests": ROWS, "max_context_len": WIDTH}


def _run(driver: Driver) -> Driver:
    for new, fault in _STEPS:
        if fault == "flip":
            driver.k[2, 0] ^= 1  # a KV byte of slot 2 changes after its write
        driver.step(new)
    driver.monitor.flush()
    return driver


@pytest.mark.parametrize("has_v", [True, False])
def test_eager_compilation_names_every_kernel_a_monitor_step_launches(has_v, monkeypatch):
    """Decode steps launch the endpoint kernels (K and V) or the serial ones (K only: the core verify
    and the fast wing's chain-sharing write), long steps chain_publish and the tiled writes (fused for
    K and V): all of them must be compiled (and loaded) before a CUDA graph is captured."""
    from kvcanary_numba.fast.kernels import chain, endpoints, tiled_endpoints, write_shared, write_tiled
    from kvcanary_numba.kernels import plan, verify

    compiled = []
    monkeypatch.setattr(fast_driver, "bound_kernel", lambda kernel, signature: compiled.append(kernel))
    if has_v:
        step = [
            endpoints.KERNELS[n]
            for src in (0, 1)
            for n in (endpoints.verify_name(False, src), endpoints.write_name(False, src))
        ]
    else:
        step = [
            m.KERNELS[name(False, src)]
            for src in (0, 1)
            for m, name in ((verify, verify.kernel_name), (write_shared, write_shared.kernel_name))
        ]
    tiled = tiled_endpoints if has_v else write_tiled
    tiled_name = tiled.kernel_name
    expected = [
        *plan.KERNELS.values(),
        *step,
        chain.KERNELS["chain_publish"],
        *(tiled.KERNELS[tiled_name(False, src)] for src in (0, 1)),
    ]
    assert compile_monitor_kernels(Driver(has_v=has_v).monitor) == len(expected)
    assert sorted(map(id, compiled)) == sorted(map(id, expected))


def test_eager_compilation_adds_the_input_launches_of_the_head_phase(monkeypatch):
    """The expected-token check adds the scatter-and-lengths kernel, an SWA group the slot
    translation: HEAD's first launches on the prepared path (and in a captured graph)."""
    compiled = []
    monkeypatch.setattr(fast_driver, "bound_kernel", lambda kernel, signature: compiled.append(id(kernel)))

    def kernels(**options) -> set:
        compiled.clear()
        compile_monitor_kernels(Driver(**options).monitor)
        return set(compiled)

    plain, tokens, swa = kernels(), kernels(**_TOKENS), kernels(swa_window=2)
    lens, slots = id(kernels_scatter.KERNELS["scatter_lens"]), id(kernels_translate.KERNELS["translate"])
    assert lens in tokens and slots in swa and not {lens, slots} & plain
    assert slots not in tokens and lens not in swa


def _assert_like_reference(runs: dict) -> None:
    """The eager and fast runs left the reference run's rows (as a multiset), status words and
    records in every buffer."""
    ref = runs["reference"].monitor
    for kind in ("eager", "fast"):
        m = runs[kind].monitor
        assert sorted(runs[kind].rows()) == sorted(runs["reference"].rows()), kind
        np.testing.assert_array_equal(m.status.words, ref.status.words, err_msg=kind)
        for g, g_ref in zip(m.groups, ref.groups):
            for key, buf in g.buffers.items():
                np.testing.assert_array_equal(monitor_records(buf), monitor_records(g_ref.buffers[key]), err_msg=key)


@pytest.mark.simulator
@pytest.mark.skipif(not SIMULATED, reason="drives NumPy arrays through the kernels")
@pytest.mark.parametrize(
    "options",
    [{}, {"swa_window": 2, "has_v": False}, _TOKENS, {"swa_window": 2, "has_v": False, **_TOKENS}],
    ids=["full_kv", "full_plus_swa", "full_kv_tokens", "full_plus_swa_tokens"],
)
def test_fast_path_steps_equal_eager_kernel_and_reference_steps(options):
    runs = {kind: _run(_driver(kind, **options)) for kind in ("reference", "eager", "fast")}
    ref = runs["reference"].monitor
    # The flipped byte stays flipped: the TAIL verifies of steps 3 and 4 both report it.
    assert [r[:2] for r in runs["reference"].rows()] == [("TAIL_K_FULL", 2)] * 2
    _assert_like_reference(runs)
    # Steps 1, 3, 4 share their shapes: prepared once; step 2 differs (the flat token list grows
    # every step: no part of the key).
    assert runs["fast"].monitor.fast.prepared == 2
    if "max_requests" in options:  # the expected-token pool and valid lengths, as the eager path left them
        for kind in ("eager", "fast"):
            m = runs[kind].monitor
            np.testing.assert_array_equal(m.token_pool, ref.token_pool, err_msg=kind)
            np.testing.assert_array_equal(m.valid_lens, ref.valid_lens, err_msg=kind)
        head = runs["fast"].monitor.fast.bound.head
        assert head.launches[0].signature == kernels_scatter.SIGNATURES["scatter_lens"][0]  # HEAD's first launch


@pytest.mark.simulator
@pytest.mark.skipif(not SIMULATED, reason="drives NumPy arrays through the kernels")
def test_fast_path_steps_make_no_public_scatter_and_no_array_operation(monkeypatch):
    from kvcanary_numba.monitor import groups, steps

    driver = _driver("fast", swa_window=2, has_v=False, **_TOKENS)
    plan = driver.monitor.step_plan
    calls, prepare = [], plan.prepare_inputs
    monkeypatch.setattr(steps, "scatter_req_token_ids", lambda **kw: calls.append("public scatter"))
    monkeypatch.setattr(groups, "translate_slots", lambda *a, **kw: calls.append("array translation"))
    monkeypatch.setattr(
        plan, "prepare_inputs", lambda batch, eager=True: calls.append(eager) or prepare(batch, eager=eager)
    )
    _run(driver)
    # Every step: inputs left to HEAD's first launches (token scatter and lengths, SWA translation).
    assert calls == [False] * len(_STEPS) and driver.monitor.fast.prepared == 2
    names = [launch.kernel for launch in driver.monitor.fast.bound.head.launches[:2]]
    assert names == [kernels_scatter.scatter_lens_kernel, kernels_translate.translate_kernel]


def _run_in_place(driver: Driver) -> Driver:
    """:func:`_run`'s decode steps 2-4 on ONE batch object refilled in place (the flat token list,
    which grows, is reassigned): after the first of them the fast path binds nothing."""
    from monitor_helpers import token_bytes

    driver.step(_STEPS[0][0])
    batch = None
    for new, fault in _STEPS[1:]:
        step = driver.batch(new)
        if batch is None:
            batch = step
        else:
            for name in (
                "req_pool_indices",
                "prefix_lens",
                "extend_seq_lens",
                "input_ids",
                "positions",
                "out_cache_loc",
                "token_offsets",
            ):
                getattr(batch, name)[...] = getattr(step, name)
            batch.token_ids_flat = step.token_ids_flat
        if fault == "flip":
            driver.k[2, 0] ^= 1
        with driver.monitor.forward(batch):
            for token, slot in zip(batch.input_ids, batch.out_cache_loc):
                driver.k[slot], driver.v[slot] = token_bytes(int(token), 0), token_bytes(int(token), 1)
                if hasattr(driver, "swa_k"):
                    driver.swa_k[driver.lut[slot]] = token_bytes(int(token), 2)
        for row, tokens in new.items():
            driver.requests[row] += tokens
        driver.monitor.end_step()
    driver.monitor.flush()
    return driver


@pytest.mark.simulator
@pytest.mark.skipif(not SIMULATED, reason="drives NumPy arrays through the kernels")
def test_a_batch_refilled_in_place_launches_what_eager_steps_launch(monkeypatch):
    # Steady state: the phases bound at the first of these steps launch again (no input views are
    # built: the valid lengths and SWA slots are the same views); the SWA slots and the tokens
    # are still translated and scattered by HEAD's first launches every step.
    options = {"swa_window": 2, "has_v": False, **_TOKENS}
    runs = {kind: _run_in_place(_driver(kind, **options)) for kind in ("reference", "eager")}
    binds = []
    bind = PreparedPhase.bind
    monkeypatch.setattr(PreparedPhase, "bind", lambda self, roles: binds.append(1) or bind(self, roles))
    runs["fast"] = _run_in_place(_driver("fast", **options))
    assert len(binds) == 4  # HEAD and TAIL at step 1, and at step 2 (the in-place batch); never again
    ref = runs["reference"].monitor
    assert [r[:2] for r in runs["reference"].rows()] == [("TAIL_K_FULL", 2)] * 2
    _assert_like_reference(runs)
    for kind in ("eager", "fast"):
        np.testing.assert_array_equal(runs[kind].monitor.token_pool, ref.token_pool, err_msg=kind)


@pytest.mark.simulator
@pytest.mark.skipif(not SIMULATED, reason="drives NumPy arrays through the kernels")
def test_fast_path_checks_changed_per_step_arrays_with_the_public_codes():
    driver = _run(_driver("fast"))
    m = driver.monitor
    batch = driver.batch({1: [(16, 10)], 2: [(25, 11)]})
    bad = StepBatch(**{f: getattr(batch, f) for f in batch.__dataclass_fields__})
    bad.positions = batch.positions.astype(np.float64)  # reassigned after construction (which checks too)
    with raises_code("KVC-C002"):
        m.pre_forward(bad)
    bad = StepBatch(**{f: getattr(batch, f) for f in batch.__dataclass_fields__})
    bad.out_cache_loc = np.zeros(4, dtype=np.int64)[::2]
    with raises_code("KVC-C006"):  # the failed pre_forward left the monitor idle: checked again
        m.pre_forward(bad)


@pytest.mark.simulator
def test_a_phase_with_a_per_call_argument_that_has_no_role_is_refused():
    # The glue views ``out`` from a per-call array (not persistent): without a role, every step
    # would launch on the first step's pointer. Building the phase says so instead.
    from kvcanary_numba import compute_real_kv_hash
    from kvcanary_numba.fast.recording import recording

    xp = np if SIMULATED else __import__("cupy")
    tensor = xp.zeros((8, 32), dtype=np.uint8)
    sources = (RealKvSource(tensor=tensor, page_size=1, num_bytes_per_token=32, read_bytes=32),)
    slots, out = xp.arange(3, dtype=np.int64), xp.zeros(3, dtype=np.int64)
    with recording() as rec:
        compute_real_kv_hash(
            real_kv_sources=sources, real_kv_hash_mode=RealKvHashMode.ALL, slot_indices=slots, out=out, backend="cuda"
        )
    with pytest.raises(RuntimeError, match="argument 1 of .* per-call array that is not a role"):
        PreparedPhase(rec.launches, {"slot_indices": slots})
    phase = PreparedPhase(rec.launches, {"slot_indices": slots, "out": out})
    assert sorted(phase.bindings) == ["out", "slot_indices"]


def _graph_monitor(batch, driver: Driver, ran: list):
    """``driver``'s monitor with a stand-in graph of ``batch`` and stand-in prepared steps, each
    logging what ran: the hooks' choice between them is what is tested."""
    from types import SimpleNamespace

    m = driver.monitor
    stand_in = SimpleNamespace(launch=lambda: ran.append("graph"))
    m.graph = CapturedStep(batch, stand_in, SimpleNamespace(launch=lambda: None), roles=BATCH_ROLES)
    m.fast = SimpleNamespace(pre=lambda b: ran.append("prepared"), post=lambda: None)
    return m


def _hooks(m, batch) -> None:
    m.pre_forward(batch)
    m.post_forward()
    m.end_step()


def test_graph_replays_only_the_captured_batch_fields():
    # A field reassigned after capture would replay the old pointer: the prepared path runs instead.
    driver = Driver()
    batch = driver.batch({1: [(11, 1)]})
    ran: list = []
    m = _graph_monitor(batch, driver, ran)
    _hooks(m, batch)
    batch.positions = batch.positions[:]  # another view of the same memory: the same argument
    _hooks(m, batch)
    batch.positions = batch.positions.copy()  # same values, other memory
    _hooks(m, batch)
    assert ran == ["graph", "graph", "prepared"] and m.graph.replays == 2


def test_a_graph_does_not_replay_on_other_token_arrays():
    # With the expected-token check, the captured HEAD graph scatters from the captured token
    # arrays: another flat token list (other memory, or another length) takes the prepared path.
    driver = Driver()
    batch = driver.batch({1: [(11, 1)], 2: [(21, 5)]})
    ran: list = []
    m = _graph_monitor(batch, driver, ran)
    _hooks(m, batch)
    batch.token_ids_flat = batch.token_ids_flat[:-1]  # the same memory, one token fewer
    _hooks(m, batch)
    batch.token_ids_flat = m.graph.captured("token_ids_flat")
    batch.token_offsets = batch.token_offsets.copy()
    _hooks(m, batch)
    assert ran == ["graph", "prepared", "prepared"]


def test_the_hooks_replay_a_graph_only_while_the_batch_holds_its_arrays():
    # The monitor's hooks skip the per-field graph match for a batch whose fields are the ones
    # last checked and matched: a field reassigned (and back) must still be seen at the next step.
    from types import SimpleNamespace

    driver = Driver()
    monitor = driver.monitor
    batch = driver.batch({1: [(11, 1)]})
    ran = []
    graph = CapturedStep(
        batch,
        SimpleNamespace(launch=lambda: ran.append("head")),
        SimpleNamespace(launch=lambda: ran.append("tail")),
        roles=BATCH_ROLES,
    )
    monitor.graph = graph
    captured_positions = batch.positions

    def step():
        monitor.pre_forward(batch)
        monitor.post_forward()
        monitor.end_step()
        return graph.replays

    assert [step(), step()] == [1, 2] and ran == ["head", "tail"] * 2
    batch.positions = captured_positions.copy()  # same values, other memory: not what the graph holds
    assert step() == 2 and ran == ["head", "tail"] * 2
    batch.positions = captured_positions
    assert [step(), step()] == [3, 4] and ran == ["head", "tail"] * 4
    batch.positions = np.zeros(3, dtype=np.int64)  # a field of another length: checked, refused
    with raises_code("KVC-C004"):
        monitor.pre_forward(batch)


@pytest.mark.parametrize("options", [{}, {"backend": "cuda", "prepared": True}], ids=["numpy", "prepared"])
def test_graph_capture_needs_a_gpu_monitor(options):
    if options and not SIMULATED:
        pytest.skip("prepared steps on NumPy arrays: simulator only")
    driver = Driver(**options)
    batch = driver.batch({1: [(11, 1)]})
    with raises_code("KVC-C008"):
        driver.monitor.capture_graph(batch)


# --- GPU: raw launches, fast path and graphs against eager launches ------------------


def _gpu_run(kind: str, steps: int = 6) -> tuple[dict, object]:
    """Decode steps of a small pool on the GPU (``eager`` / ``fast`` / ``graph``), a KV byte
    flipped before step 3 (request 2, position 5); returns host copies of everything the canary
    keeps, and the monitor."""
    return gpu_monitor_run(kind, requests=4, prefix=40, bytes_per_token=32, steps=steps, flips=[("k", 2, 5, 0)])


@pytest.mark.gpu
def test_gpu_fast_path_and_graph_replays_equal_eager_steps():
    runs = {kind: _gpu_run(kind)[0] for kind in ("eager", "fast", "graph")}
    assert runs["eager"]["violations"].shape[0] >= 1  # the flipped byte was caught
    for kind in ("fast", "graph"):
        for name, array in runs["eager"].items():
            np.testing.assert_array_equal(runs[kind][name], array, err_msg=f"{kind}: {name}")


@pytest.mark.gpu
@pytest.mark.parametrize("loop", ["python", "compiled", "compiled one-buffer"])
def test_gpu_fast_path_steps_equal_eager_steps_on_every_launch_loop(monkeypatch, loop):
    # The per-launch Python loop, the compiled launch loop and readback (the default), and the
    # compiled loop passing each kernel's parameters as one buffer (_driver.PARAM_BUFFER).
    monkeypatch.setattr(fast_driver, "DRIVER_CALLS", "python" if loop == "python" else "compiled")
    monkeypatch.setattr(fast_driver, "PARAM_BUFFER", loop.endswith("one-buffer"))
    driver = fast_driver.Driver()  # a fresh driver: the loop switch is read when it selects
    driver.select()  # now: launches packed before this test use it too
    monkeypatch.setattr(fast_driver, "driver", driver)
    eager, _ = _gpu_run("eager")
    fast, m = _gpu_run("fast")
    tables = [phase.table for phases in m.fast.phase_pairs for phase in phases]
    assert tables and all(t.compiled == (loop != "python") for t in tables)
    assert (m.readback.native is not None) == (loop != "python")
    if loop.endswith("one-buffer"):
        assert any(row[4] for t in tables for row in t.table)  # the driver reported our layout somewhere
    for name, array in eager.items():
        np.testing.assert_array_equal(fast[name], array, err_msg=f"{loop}: {name}")


@pytest.mark.gpu
def test_gpu_prepared_launches_are_raw_and_graph_replays_are_counted():
    _, m = _gpu_run("graph", steps=4)
    launches = [launch for phases in m.fast.phase_pairs for phase in phases for launch in phase.launches]
    assert launches and all(launch.raw for launch in launches), [l.fallback_reason for l in launches]
    assert m.graph is not None and m.graph.replays == 4
    krc = m.status.words.get()[1:13]
    np.testing.assert_array_equal(krc, m.health.host)  # every launch the host counted ran once on the device


@pytest.mark.gpu
def test_gpu_eager_steps_replay_what_the_glue_would_launch(monkeypatch):
    # Public calls and endpoint glue calls (fast/glue_memo.py) of eager monitor steps are packed,
    # then replayed; with VERIFY_REPLAYS every replay first re-derives its launches from the glue
    # and raises StaleLaunch on a difference.
    from kvcanary_numba.fast import replay as _kernel_launch

    verified = []
    verify = _kernel_launch._verify

    def record(launches, run, kwargs, stream):
        verified.append(getattr(run, "func", run).__name__)  # the plan glue is a partial (its scratch)
        verify(launches, run, kwargs, stream)

    monkeypatch.setattr(_kernel_launch, "VERIFY_REPLAYS", True)
    monkeypatch.setattr(_kernel_launch, "_verify", record)
    eager, _ = _gpu_run("eager")
    # Later steps replayed the plan call and both endpoint glues (the batch is refilled in place).
    assert {"launch_canary_plan_kernels", "_verifies", "_writes"} <= set(verified)
    fast, _ = _gpu_run("fast")
    for name, array in fast.items():
        np.testing.assert_array_equal(eager[name], array, err_msg=name)
