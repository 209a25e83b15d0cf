"""Threads: first calls made at the same moment, the parallel CPU fingerprint on every threading
layer, public calls sharing launch scratch, one monitor stepped from two threads (issue 33).

Each first-call case runs in fresh processes (a module imported once per process is what two
threads race on): two threads wait at a barrier, then make their first public call, and every
result must equal the NumPy specification's.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import threading

import numpy as np
import pytest
from first_calls import CALLS, differences, public_call, specified
from helpers import raises_code
from monitor_helpers import DECODE, PREFILL, Driver, token_bytes
from test_reliability_state import snapshot

from kvcanary_numba import KvCanaryError
from kvcanary_numba.monitor import CanaryMonitor, StepBatch

TESTS = pathlib.Path(__file__).resolve().parent
ROOT = TESTS.parent

#: Run in a fresh interpreter: ``argv[1]`` the backend, ``argv[2]`` where the arrays live (``cpu``,
#: ``cuda``: CuPy, ``numba``: Numba device arrays), the rest one call name per thread. ``monitor``
#: steps a CPU monitor; ``cuda_monitor`` builds a GPU monitor (its first import of CuPy).
_CHILD = """
import json, sys, threading
sys.path[:0] = [{tests!r}, {root!r}]
import first_calls
from monitor_helpers import DECODE, PREFILL, Driver

backend, device, names = sys.argv[1], sys.argv[2], sys.argv[3:]
barrier, got, errors = threading.Barrier(len(names)), {{}}, []

def first_call(i, name):
    barrier.wait()
    try:
        if name == "monitor":
            d = Driver(backend=backend)
            d.step(PREFILL)
            d.step(DECODE)
            got[i] = [] if not d.monitor.violations else ["violations"]
        elif name == "cuda_monitor":
            from kvcanary_numba.monitor import CanaryMonitor, KvGroup
            CanaryMonitor(full=KvGroup(kind="full", num_slots=16), write_req_capacity=2, device="cuda")
            got[i] = []
        else:
            got[i] = first_calls.public_call(name, i, backend, device=device)
    except BaseException as exc:
        errors.append(f"{{name}}: {{type(exc).__name__}}: {{exc}}")

threads = [threading.Thread(target=first_call, args=(i, n)) for i, n in enumerate(names)]
for t in threads:
    t.start()
for t in threads:
    t.join()
calls = [(i, n) for i, n in enumerate(names) if i in got and n in first_calls.CALLS]
bad = [f"{{n}} differs: {{d}}" for i, n in calls if (d := first_calls.differences(got[i], first_calls.specified(n, i)))]
bad += [f"{{n}}: {{got[i]}}" for i, n in enumerate(names) if n not in first_calls.CALLS and got.get(i)]
print(json.dumps(errors + bad))
"""

_NAMES = [*CALLS, "monitor"]
#: Pairs of first calls, one process each: every name against the next one, and against itself.
PAIRS = [(a, _NAMES[(i + 1) % len(_NAMES)]) for i, a in enumerate(_NAMES)] + [(a, a) for a in ("plan", "write")]


def _fresh_processes(backend: str, device: str, pairs, *, env: dict | None = None) -> dict:
    """pair -> what went wrong in the fresh process that ran it (nothing: ``[]``), two processes at a time."""
    code = _CHILD.format(tests=str(TESTS), root=str(ROOT))
    # ROOT first, the caller's path kept (an install of NumPy beside the system's, as on the GPU image).
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    environ = {**os.environ, "PYTHONPATH": path, **(env or {})}
    argv = [sys.executable, "-W", "ignore", "-c", code, backend, device]
    out, pending = {}, list(pairs)
    while pending:
        running = [
            (
                pair,
                subprocess.Popen(
                    [*argv, *pair], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ, cwd=ROOT
                ),
            )
            for pair in pending[:2]
        ]
        del pending[:2]
        for pair, proc in running:
            stdout, stderr = proc.communicate(timeout=600)
            lines = stdout.strip().splitlines()
            out[pair] = (
                json.loads(lines[-1])
                if proc.returncode == 0 and lines
                else [f"exit {proc.returncode}: {stderr[-2000:]}"]
            )
    return out


def test_two_threads_first_calls_on_numpy_in_fresh_processes():
    problems = _fresh_processes("numpy", "cpu", PAIRS)
    assert all(not p for p in problems.values()), {k: v for k, v in problems.items() if v}


@pytest.mark.simulator
@pytest.mark.slow
def test_two_threads_first_calls_on_the_kernels_in_fresh_processes():
    # The first kernel call of a process imports the launch glue, the kernels and numba.cuda.
    problems = _fresh_processes("cuda", "cpu", PAIRS, env={"NUMBA_ENABLE_CUDASIM": "1"})
    assert all(not p for p in problems.values()), {k: v for k, v in problems.items() if v}


@pytest.mark.gpu
def test_two_threads_first_calls_on_a_gpu_in_fresh_processes():
    # CuPy arrays; and Numba device arrays while another thread's monitor imports CuPy for the first
    # time (a call that took a half-imported CuPy for a loaded one failed on its missing names).
    pairs = [pair for pair in PAIRS if "monitor" not in pair]
    problems = _fresh_processes("auto", "cuda", pairs, env={"NUMBA_ENABLE_CUDASIM": "0"})
    numba_pairs = [(name, "cuda_monitor") for name in CALLS]
    problems.update(_fresh_processes("auto", "numba", numba_pairs, env={"NUMBA_ENABLE_CUDASIM": "0"}))
    assert all(not p for p in problems.values()), {k: v for k, v in problems.items() if v}


@pytest.mark.simulator
@pytest.mark.parametrize("name", ["plan", "write"])
def test_public_kernel_calls_of_two_threads_do_not_interleave_their_launches(name):
    # A plan's kernels hand offsets to each other through launch scratch of the stream; two threads'
    # plans on one stream interleaved there and one got the other's entries.
    device = "cuda" if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1" else "cpu"
    barrier, bad = threading.Barrier(2), []

    def calls(first: int):
        barrier.wait()
        for seed in range(first, first + 8, 2):
            got = public_call(name, seed, "cuda", device=device)
            bad.extend(f"seed {seed}: {key}" for key in differences(got, specified(name, seed)))

    threads = [threading.Thread(target=calls, args=(first,)) for first in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert bad == []


def test_a_module_still_being_imported_is_not_taken_for_a_loaded_one(monkeypatch):
    import importlib.machinery
    import types

    from kvcanary_numba._runtime import imported

    half = types.ModuleType("half_imported")
    half.__spec__ = importlib.machinery.ModuleSpec("half_imported", None)
    half.__spec__._initializing = True  # what importlib sets while the module's code runs
    monkeypatch.setitem(sys.modules, "half_imported", half)
    assert imported("half_imported") is None
    half.__spec__._initializing = False
    assert imported("half_imported") is half
    assert imported("numpy") is np
    assert imported("no_such_module_here") is None


# --- the parallel CPU loops on every threading layer --------------------------------------------------

#: Four threads, released together into their first calls, then more: fingerprints and verifies
#: long enough to take the parallel loops; each result against the NumPy specification.
_PARALLEL_CHILD = """
import json, sys, threading
import numba
import numpy as np
from kvcanary_numba import CanaryContext, CanaryLaunchTag, RealKvHashMode, RealKvSource, VerifyPlan
from kvcanary_numba import compute_real_kv_hash, launch_canary_verify_kernel
from kvcanary_numba.fast.cpu.fingerprint import SERIAL_FOLD_SLOTS
from kvcanary_numba.reference import fingerprint, verify

n = 2 * SERIAL_FOLD_SLOTS + 17
rng = np.random.default_rng(5)
source = RealKvSource(tensor=rng.integers(0, 256, (n, 32)).astype(np.uint8), page_size=1, num_bytes_per_token=32,
                      read_bytes=32)
slots = rng.integers(-2, n + 2, n).astype(np.int64)

def context():
    return CanaryContext(canary_buf=rng.integers(0, 256, (n, 32)).astype(np.uint8), kernel_kind=CanaryLaunchTag.TAIL_K_FULL,
        violation_ring=np.zeros((n, 8), np.int64), violation_write_index=np.zeros(1, np.int32),
        slot_run_counter=np.zeros(1, np.int64), kernel_run_counter=np.zeros(1, np.int64),
        real_kv_sources=(source,), real_kv_hash_mode=RealKvHashMode.ALL)

ctx = context()
plan = VerifyPlan(verify_slot_indices=rng.integers(0, n, n).astype(np.int64), verify_expected_tokens=slots.copy(),
    verify_expected_positions=slots.copy(), verify_prev_slot_indices=slots.copy(),
    verify_num_valid=np.array([n], np.int32), enable=np.array([1], np.int32))
want_hash = np.zeros(n, np.int64)
fingerprint.compute_real_kv_hash(real_kv_sources=(source,), real_kv_hash_mode=RealKvHashMode.ALL, slot_indices=slots,
                                 out=want_hash)
verify.launch_canary_verify_kernel(context=ctx, plan=plan, check_verify_expected_token=True)
want_rows = sorted(map(tuple, ctx.violation_ring.tolist()))

barrier, bad = threading.Barrier(4), []
def calls(i):
    barrier.wait()
    for _ in range(3):
        if i % 2:
            out = np.zeros(n, np.int64)
            compute_real_kv_hash(real_kv_sources=(source,), real_kv_hash_mode=RealKvHashMode.ALL, slot_indices=slots,
                                 out=out, backend="numpy")
            bad.extend(["fingerprint"] if not np.array_equal(out, want_hash) else [])
        else:
            mine = ctx.replace(violation_ring=np.zeros((n, 8), np.int64), violation_write_index=np.zeros(1, np.int32),
                               slot_run_counter=np.zeros(1, np.int64), kernel_run_counter=np.zeros(1, np.int64))
            launch_canary_verify_kernel(context=mine, plan=plan, check_verify_expected_token=True, backend="numpy")
            bad.extend(["verify"] if sorted(map(tuple, mine.violation_ring.tolist())) != want_rows else [])

threads = [threading.Thread(target=calls, args=(i,)) for i in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps({"layer": numba.threading_layer(), "bad": bad}))
"""


@pytest.mark.parametrize("layer", ["workqueue", "default"])
def test_parallel_cpu_loops_from_four_threads_on_a_threading_layer(layer):
    # workqueue, the layer left without TBB and OpenMP, aborted the process on a second parallel region.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NUMBA_THREADING_LAYER": layer}
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", _PARALLEL_CHILD], capture_output=True, text=True, timeout=600, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["bad"] == []
    if layer == "workqueue":
        assert result["layer"] == "workqueue"


# --- one monitor, two threads -------------------------------------------------------------------------


def _hooks(d: Driver) -> dict:
    """Every guarded call of the monitor, with arguments that would be valid from an idle monitor."""
    m = d.monitor
    return {
        "pre_forward": lambda: m.pre_forward(d.batch(DECODE)),
        "post_forward": m.post_forward,
        "forward": lambda: m.forward(d.batch(DECODE)).__enter__(),
        "end_step": m.end_step,
        "sweep": lambda: m.sweep([]),
        "flush": m.flush,
        "finish_warmup": m.finish_warmup,
        "backend": lambda: setattr(m, "backend", "numpy"),
        **_moves(m),
    }


def _moves(m) -> dict:
    """The record moves (monitor/moves.py), each guarded like the step hooks."""
    slots, offsets = np.array([3, 4], dtype=np.int64), np.array([0, 2], dtype=np.int64)
    moved = m.take_records(slots)  # taken while idle (its launches count, before the snapshot)
    return {
        "take_records": lambda: m.take_records(slots),
        "put_records": lambda: m.put_records(moved, slots),
        "move_records": lambda: m.move_records(slots, slots[::-1].copy()),
        "verify_records": lambda: m.verify_records(slots, offsets, offsets[:1], offsets[:1] - 1),
        "handoff_digest": lambda: m.handoff_digest(slots, offsets),
    }


def _hold_inside(d: Driver, where: str):
    """Start a thread that stays inside the monitor (``where``: the block of ``forward`` or the
    HEAD launches of ``pre_forward``) until the returned ``leave`` event is set."""
    inside, leave, errors = threading.Event(), threading.Event(), []
    m = d.monitor

    def wait_inside(*args):
        inside.set()
        leave.wait(30)

    def engine():
        try:
            if where == "forward":
                with m.forward(d.batch(DECODE)):
                    wait_inside()
            else:
                head = m.step_plan.head
                m.step_plan.head = lambda *args: (wait_inside(), head(*args))
                m.pre_forward(d.batch(DECODE))
                m.post_forward()
            m.end_step()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    thread = threading.Thread(target=engine)
    thread.start()
    assert inside.wait(30)
    return thread, leave, errors


@pytest.mark.parametrize("where", ["forward", "pre_forward"])
def test_a_second_thread_is_refused_and_changes_nothing(where):
    d = Driver()
    d.step(PREFILL)
    hooks = _hooks(d)
    thread, leave, errors = _hold_inside(d, where)
    try:
        before = snapshot(d.monitor)
        for name, call in hooks.items():
            with raises_code("KVC-M026") as excinfo:
                call()
            assert f"CanaryMonitor.{name}" in str(excinfo.value)
            assert snapshot(d.monitor) == before, f"the refused {name} changed the monitor"
        assert d.monitor.stats()["step"] == 1  # reading is not refused
    finally:
        leave.set()
        thread.join(30)
    assert not errors
    # The first thread's step finished undisturbed: the same state as a monitor stepped in one thread.
    alone = Driver()
    alone.step(PREFILL)
    _hooks(alone)  # the same take between the steps
    alone.step(DECODE)
    assert d.monitor.stats() == alone.monitor.stats()
    assert d.monitor.violations == alone.monitor.violations == []
    np.testing.assert_array_equal(d.monitor.ring, alone.monitor.ring)


def test_handing_a_monitor_to_another_thread_between_calls_is_allowed():
    d = Driver()
    for step in (PREFILL, DECODE):  # each hook of each step on a thread of its own
        batch = d.batch(step)
        for hook in (lambda: d.monitor.pre_forward(batch), d.monitor.post_forward, d.monitor.end_step):
            t = threading.Thread(target=hook)
            t.start()
            t.join()
        for row, tokens in step.items():
            d.requests[row] += tokens
    assert d.monitor.stats()["step"] == 2 and d.monitor.stats()["kernel_runs"] > 0


def test_two_threads_stepping_one_monitor_get_whole_steps_or_refusals():
    # Each thread serves its own request (row 1 or 2, disjoint slots) of one pool; a refused hook is
    # retried. Whatever the interleaving, every step is one thread's, whole: no false violation.
    d = Driver()
    barrier, refused, errors = threading.Barrier(2), [], []

    def retried(call) -> None:
        while not errors:
            try:
                return call()
            except KvCanaryError as exc:
                if exc.code not in ("KVC-M026", "KVC-M005"):  # another thread inside, or its step open
                    errors.append(exc)
                refused.append(exc.code)

    def serve(row: int):
        barrier.wait()
        for position in range(6):
            batch, write_kv = _one_token(d, row, position)
            retried(lambda: _forward(d, batch, write_kv))
            retried(d.monitor.end_step)

    threads = [threading.Thread(target=serve, args=(row,)) for row in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    alone = Driver()  # the same steps from one thread
    for position in range(6):
        for row in (1, 2):
            _forward(alone, *_one_token(alone, row, position))
            alone.monitor.end_step()
    assert d.monitor.violations == alone.monitor.violations == []
    assert d.monitor.stats() == alone.monitor.stats()


def _one_token(d: Driver, row: int, position: int):
    """Request ``row`` appends one token at ``position`` (slots of its own): its batch, and the
    forward's write of its K and V."""
    token, slot = 100 * row + position, 1 + (row - 1) * 7 + position
    d.req_to_token[row, position] = slot
    i64 = lambda values: np.asarray(values, dtype=np.int64)  # noqa: E731
    batch = StepBatch(
        req_pool_indices=i64([row]),
        prefix_lens=i64([position]),
        extend_seq_lens=i64([1]),
        req_to_token=d.req_to_token,
        input_ids=i64([token]),
        positions=i64([position]),
        out_cache_loc=i64([slot]),
    )

    def write_kv():
        d.k[slot], d.v[slot] = token_bytes(token, 0), token_bytes(token, 1)

    return batch, write_kv


def _forward(d: Driver, batch, write_kv) -> None:
    with d.monitor.forward(batch):
        write_kv()


def test_the_monitor_class_documents_its_threads():
    assert "KVC-M026" in CanaryMonitor.__doc__
