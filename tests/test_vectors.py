"""Replay SGLang's golden vectors (plan -> verify -> write, several steps) on every backend.

One test case per scenario file and backend:

- ``reference``: the NumPy references through the public wrappers (``backend="numpy"``);
- ``simulator``: the Numba-CUDA kernels on NumPy arrays (``backend="cuda"``; under
  ``NUMBA_ENABLE_CUDASIM=1`` without a GPU), ring order free, the reference as oracle;
- ``gpu``: the kernels on CuPy arrays (needs a GPU).

Kernel backends are skipped only while ``kvcanary_numba.launch.<op>`` does not exist;
any other import error fails the test.
"""

from __future__ import annotations

import functools
import importlib
import os

import numpy as np
import pytest
from vectors import Ops, replay, scenario_paths, vectors_folder

from kvcanary_numba import launch_canary_plan_kernels, launch_canary_verify_kernel, launch_canary_write_kernel

#: Scenario names at collection time, from the folder the vectors_dir fixture returns too.
SCENARIOS = [path.name for path in scenario_paths(vectors_folder())]
LAUNCH_MODULES = ("plan", "verify", "write")


def _ops(name: str, backend: str, **extra) -> Ops:
    return Ops(
        name=name,
        plan=functools.partial(launch_canary_plan_kernels, backend=backend),
        verify=functools.partial(launch_canary_verify_kernel, backend=backend),
        write=functools.partial(launch_canary_write_kernel, backend=backend),
        **extra,
    )


REFERENCE = _ops("reference", "numpy")


def _require_launch_modules() -> None:
    """Skip while the CUDA launch glue is not written yet; fail on any other import problem."""
    for module in LAUNCH_MODULES:
        name = f"kvcanary_numba.launch.{module}"
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            pytest.skip(f"{name} does not exist yet")


def _backend_ops(backend: str) -> tuple[Ops, Ops | None]:
    if backend == "reference":
        return REFERENCE, None
    _require_launch_modules()
    if backend == "simulator":
        # Kernels on NumPy arrays exist only under the simulator; on a GPU the gpu case runs them.
        if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
            pytest.skip("the simulator backend needs NUMBA_ENABLE_CUDASIM=1 (on a GPU the gpu case runs the kernels)")
        return _ops("simulator", "cuda", sequential=False), REFERENCE
    import cupy

    gpu = _ops("gpu", "auto", device="cuda", to_device=cupy.asarray, to_host=cupy.asnumpy, sequential=False)
    return gpu, REFERENCE


BACKENDS = [
    pytest.param("reference", id="reference"),
    pytest.param("simulator", id="simulator", marks=pytest.mark.simulator),
    pytest.param("gpu", id="gpu", marks=pytest.mark.gpu),
]


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_vector_replay(vectors_dir, backend, scenario):
    path = vectors_dir / scenario
    assert path.is_file(), f"missing golden vector {path}"
    ops, oracle = _backend_ops(backend)
    assert replay(path, ops, oracle) >= 1


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("backend", BACKENDS[1:])
def test_vector_replay_with_tiled_writes(vectors_dir, backend, scenario, monkeypatch):
    # The kernels' writes on the tiled path (chain_publish, then write_tiled), which a public
    # write of long requests takes (launch.chain.own_tiled); the vectors' writes are short.
    from kvcanary_numba.fast import chain

    monkeypatch.setattr(chain, "OWN_TILED_MIN_TOKENS", 0)
    ops, oracle = _backend_ops(backend)
    assert replay(vectors_dir / scenario, ops, oracle) >= 1


def test_vector_parametrization_is_the_folder_read():
    folder = vectors_folder()
    names = [path.name for path in scenario_paths(folder)]
    assert names, f"no scenario_*.npz in {folder} (set by $KVCANARY_VECTORS, else tests/data/vectors)"
    assert names == SCENARIOS, "parametrization out of date with the vectors folder"


@pytest.mark.parametrize("scenario", SCENARIOS[:2])
def test_vector_replay_catches_a_changed_byte(vectors_dir, scenario, monkeypatch):
    """The replay must fail when one stored byte differs (the harness cannot pass vacuously)."""
    real_load = np.load

    def tampered(path, *args, **kwargs):
        data = dict(real_load(path, *args, **kwargs))
        data["s1_buf_after"] = data["s1_buf_after"].copy()
        data["s1_buf_after"][data["s1_buf_after"].shape[0] - 1, 3] ^= 1
        return data

    monkeypatch.setattr(np, "load", tampered)
    with pytest.raises(AssertionError):
        replay(vectors_dir / scenario, REFERENCE)


def _full_ring_scenario(folder):
    """A scenario with a launch that starts on a full ring, or a skip."""
    import json

    for path in scenario_paths(folder):
        data = np.load(path)
        cap = json.loads(str(data["meta"]))["ring_cap"]
        if any(int(data[f"s{k}_widx_after_verify"]) >= cap for k in range(int(data["steps"]))):
            return path
    pytest.skip(f"no scenario in {folder} fills its ring before a launch")


def _tampering_write(change):
    """Reference write that calls ``change(context)`` after each launch that started on a full ring."""

    def write(*, context, **kwargs):
        full = int(context.violation_write_index[0]) >= context.violation_ring.shape[0]
        launch_canary_write_kernel(context=context, backend="numpy", **kwargs)
        if full:
            change(context)

    return write


def _flip_ring_byte(context):
    context.violation_ring[context.violation_ring.shape[0] - 1, 2] ^= 1 << 8


def _bump_write_index(context):
    context.violation_write_index[0] += 1


@pytest.mark.parametrize("sequential", [True, False], ids=["sequential", "racy"])
@pytest.mark.parametrize("change", [_flip_ring_byte, _bump_write_index], ids=["ring-byte", "write-index"])
def test_vector_full_ring_check_catches_a_change(vectors_dir, sequential, change):
    """After the ring is full, a launch that changes one ring byte or the write index fails the replay,
    also for a racy (non-sequential) backend, which is held to its own ring, not SGLang's."""
    path = _full_ring_scenario(vectors_dir)
    honest = _ops("honest", "numpy", sequential=sequential)
    assert replay(path, honest, REFERENCE) >= 1
    tampered = Ops(
        name="tampered", plan=honest.plan, verify=honest.verify, write=_tampering_write(change), sequential=sequential
    )
    with pytest.raises(AssertionError):
        replay(path, tampered, REFERENCE)


def _shrunk_ring(path, capacity: int, folder):
    """``path`` as SGLang would have recorded it with a ring of ``capacity`` rows.

    SGLang's reference appends rows in order and keeps counting past the capacity, so a
    smaller ring keeps the first ``capacity`` rows and every write index stays the same.
    """
    import json

    data = dict(np.load(path))
    meta = json.loads(str(data["meta"]))
    meta["ring_cap"] = capacity
    data["meta"] = np.array(json.dumps(meta))
    for key in [k for k in data if "_ring_after" in k]:
        data[key] = data[key][:capacity].copy()
    out = folder / f"shrunk_{path.name}"
    np.savez(out, **data)
    return out


def _racy(launch):
    """A reference launch that, when it overflows the ring part-way, keeps the LAST new rows
    (in reverse order) instead of the first: one outcome a GPU's atomic race may produce."""

    def run(*, context, **kwargs):
        cap = context.violation_ring.shape[0]
        before = int(context.violation_write_index[0])
        unbounded = context.replace(
            canary_buf=context.canary_buf.copy(),
            violation_ring=np.zeros((1 << 12, 8), np.int64),
            violation_write_index=np.zeros(1, np.int32),
            slot_run_counter=context.slot_run_counter.copy(),
            kernel_run_counter=context.kernel_run_counter.copy(),
        )
        launch(context=unbounded, backend="numpy", **kwargs)
        launch(context=context, backend="numpy", **kwargs)
        after = int(context.violation_write_index[0])
        if before < cap < after:
            new = unbounded.violation_ring[: after - before]
            context.violation_ring[before:] = new[::-1][: cap - before]

    return run


def test_vector_racy_partial_overflow_then_full_ring_passes(vectors_dir, tmp_path):
    """After a launch overflowed the ring part-way and kept other rows than SGLang's, later
    launches are held to the ring they found (unchanged), not to SGLang's rows."""
    path = vectors_dir / "scenario_005.npz"
    if not path.is_file():
        pytest.skip(f"{path.name} (a ring of 64 rows, 54 recorded) is not in {vectors_dir}")
    shrunk = _shrunk_ring(path, 16, tmp_path)  # step 4's verify goes from 12 to 20 rows: part-way
    assert replay(shrunk, REFERENCE) >= 1  # sequential: exactly SGLang's first 16 rows
    racy = Ops(
        name="racy",
        plan=REFERENCE.plan,
        verify=_racy(launch_canary_verify_kernel),
        write=_racy(launch_canary_write_kernel),
        sequential=False,
    )
    assert replay(shrunk, racy, REFERENCE) >= 1
    sequential_racy = Ops(name="racy", plan=REFERENCE.plan, verify=racy.verify, write=racy.write)
    with pytest.raises(AssertionError, match="ring rows differ"):
        replay(shrunk, sequential_racy)  # held to SGLang's rows, the other kept rows fail


@pytest.mark.simulator
def test_vector_simulator_after_a_partial_overflow(vectors_dir, tmp_path):
    path = vectors_dir / "scenario_005.npz"
    if not path.is_file():
        pytest.skip(f"{path.name} is not in {vectors_dir}")
    ops, oracle = _backend_ops("simulator")
    assert replay(_shrunk_ring(path, 16, tmp_path), ops, oracle) >= 1
