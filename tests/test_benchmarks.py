"""The benchmark suite on a CPU: ``--quick --cpu`` runs end to end and writes the documented
JSON; its inputs are clean, its baselines really verify, its byte models and target checks
compute what NOTES.md says. No timing is asserted."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import run as bench_run  # noqa: E402
from benchmarks.baselines import cupy_verify, python_verify  # noqa: E402
from benchmarks.bench_kernels import plan_bytes, verify_bytes, write_bytes  # noqa: E402
from benchmarks.report import SCHEMA_VERSION, evaluate_targets  # noqa: E402
from benchmarks.workloads import MonitorWorkload, verify_case, write_case  # noqa: E402
from kvcanary_numba import (
    RealKvHashMode,  # noqa: E402
    launch_canary_verify_kernel,  # noqa: E402
    launch_canary_write_kernel,  # noqa: E402
)

NONE, PARTIAL, ALL = RealKvHashMode.NONE, RealKvHashMode.PARTIAL, RealKvHashMode.ALL
SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


@pytest.fixture(scope="module")
def quick_cpu_run(tmp_path_factory) -> tuple[int, pathlib.Path]:
    out = tmp_path_factory.mktemp("bench")
    status = bench_run.main(["--quick", "--cpu", "--out", str(out), "--name", "ci"])
    return status, out


def test_quick_cpu_run_writes_the_documented_json(quick_cpu_run):
    status, out = quick_cpu_run
    assert status == 0
    doc = json.loads((out / "ci.json").read_text())
    assert doc["schema"] == SCHEMA_VERSION
    meta = doc["meta"]
    assert meta["name"] == "ci" and meta["gpu"] is False and meta["quick"] is True
    assert meta["errors"] == [] and set(meta["sections"]) == {"cpu", "validation", "public-cpu"}
    for key in ("date", "python", "numpy", "seconds", "skipped", "plots"):
        assert key in meta
    assert {t["target"] for t in doc["targets"]} >= {"plan bs=4096: device time"}
    for target in doc["targets"]:
        assert set(target) == {"target", "value", "threshold", "better", "unit", "met", "note"}
    records = doc["results"]
    assert {r["op"] for r in records} == {"cpu verify", "validation", "public call host (NumPy)"}
    public = {r["variant"] for r in records if r["op"] == "public call host (NumPy)"}
    assert {"public verify, 1 entry", "CPU path verify alone, 1 entry"} <= public
    for r in records:
        assert isinstance(r["variant"], str) and r["median_us"] > 0
        assert any(k in r for k in ("entries", "n"))
    cpu = [r for r in records if r["op"] == "cpu verify"]
    assert len(cpu) == 4 and all(r["clean"] for r in cpu)  # both paths found the clean data clean
    assert all(r["speedup"] > 1 for r in cpu if "speedup" in r)
    text = (out / "ci.md").read_text()
    assert "## Targets" in text and "| cpu verify |" not in text and "## cpu verify" in text


def test_cli_bench_passes_arguments_to_the_script(tmp_path):
    from kvcanary_numba import cli

    assert cli.main(["bench", "--", "--quick", "--cpu", "--only", "validation", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "cpu-quick.json").read_text())
    assert {r["op"] for r in doc["results"]} == {"validation"}


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_pin_runs_on_one_core_and_records_it(tmp_path):
    saved = os.sched_getaffinity(0)
    core = min(saved)
    try:
        assert (
            bench_run.main(
                [
                    "--cpu",
                    "--quick",
                    "--only",
                    "validation",
                    "--pin",
                    str(core),
                    "--out",
                    str(tmp_path),
                    "--name",
                    "pinned",
                ]
            )
            == 0
        )
        assert os.sched_getaffinity(0) == {core}
    finally:
        os.sched_setaffinity(0, saved)
    assert json.loads((tmp_path / "pinned.json").read_text())["meta"]["pinned_core"] == core
    with pytest.raises(SystemExit):  # a core this process may not use: a usage error, affinity unchanged
        bench_run.main(["--cpu", "--only", "validation", "--pin", str(max(saved) + 1), "--out", str(tmp_path)])
    assert os.sched_getaffinity(0) == saved


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_pin_leaves_the_parallel_cpu_section_every_core(tmp_path, monkeypatch):
    # The NumPy path's parallel loops on one core measured 7x slower (H100, 2026-12-05): under --pin the
    # cpu section runs first, with the affinity the process had; the others run pinned.
    saved = os.sched_getaffinity(0)
    core = min(saved)
    seen = []
    fake = {
        "cpu": lambda run: seen.append(("cpu", os.sched_getaffinity(0))),
        "validation": lambda run: seen.append(("validation", os.sched_getaffinity(0))),
    }
    monkeypatch.setattr(bench_run, "_sections", lambda names: [(n, fake[n]) for n in names])
    try:
        assert (
            bench_run.main(
                [
                    "--cpu",
                    "--quick",
                    "--only",
                    "validation,cpu",
                    "--pin",
                    str(core),
                    "--out",
                    str(tmp_path),
                    "--name",
                    "order",
                ]
            )
            == 0
        )
    finally:
        os.sched_setaffinity(0, saved)
    assert seen == [("cpu", saved), ("validation", {core})]
    assert json.loads((tmp_path / "order.json").read_text())["meta"]["unpinned_sections"] == ["cpu"]


def test_source_sha1_names_the_sources_on_disk(tmp_path, monkeypatch):
    bench = tmp_path / "benchmarks"
    (tmp_path / "kvcanary_numba" / "launch").mkdir(parents=True)
    bench.mkdir()
    (tmp_path / "kvcanary_numba" / "launch" / "x.py").write_text("a = 1\n")
    (bench / "run.py").write_text("b = 2\n")
    (bench / "notes.md").write_text("not a source\n")
    monkeypatch.setattr(bench_run, "HERE", bench)
    first = bench_run.source_sha1()
    assert len(first) == 12 and int(first, 16) >= 0
    (bench / "notes.md").write_text("changed\n")
    assert bench_run.source_sha1() == first
    (tmp_path / "kvcanary_numba" / "launch" / "x.py").write_text("a = 2\n")
    assert bench_run.source_sha1() != first


def test_unknown_section_is_a_usage_error(tmp_path):
    with pytest.raises(SystemExit) as exc:
        bench_run.main(["--cpu", "--only", "nope", "--out", str(tmp_path)])
    assert exc.value.code == 2


# --- inputs and baselines -------------------------------------------------------


@pytest.mark.parametrize("mode", [NONE, PARTIAL, ALL])
def test_verify_cases_are_clean_and_every_baseline_agrees(mode):
    ctx, plan, meta = verify_case(np, entries=300, mode=mode, bytes_per_token=32, chain_len=64)
    assert meta["chains"] == 5 and plan.verify_slot_indices.shape == (300,)
    launch_canary_verify_kernel(context=ctx, plan=plan, check_verify_expected_token=True, backend="numpy")
    assert int(ctx.violation_write_index[0]) == 0
    assert python_verify(ctx, plan, 300) == 0
    assert not cupy_verify(np, ctx, plan, 300).any()


@pytest.mark.parametrize(
    ("fault", "failing"), [("token", [71]), ("prev_hash", [70, 71]), ("position", [70, 71]), ("real_kv", [70])]
)
def test_baselines_catch_what_the_reference_catches(fault, failing):
    ctx, plan, _ = verify_case(np, entries=128, mode=ALL, bytes_per_token=32, chain_len=64)
    slot = int(plan.verify_slot_indices[70])
    words = ctx.canary_buf.view(np.int64)
    if fault == "real_kv":
        ctx.real_kv_sources[0].tensor[slot, 5] ^= 0x10
    else:  # a record field of entry 70; its successor's chain hash covers token, position and prev_hash
        words[slot, ("token", "position", "prev_hash").index(fault)] ^= 4
    launch_canary_verify_kernel(context=ctx, plan=plan, check_verify_expected_token=False, backend="numpy")
    assert int(ctx.violation_write_index[0]) == len(failing)
    assert sorted(ctx.violation_ring[: len(failing), 1]) == sorted(int(plan.verify_slot_indices[i]) for i in failing)
    assert python_verify(ctx, plan, 128) == len(failing)
    assert np.flatnonzero(cupy_verify(np, ctx, plan, 128)).tolist() == failing


def test_write_cases_restamp_identical_records():
    ctx, plan, inputs = write_case(np, requests=3, tokens=5, mode=ALL, bytes_per_token=32)
    launch_canary_write_kernel(context=ctx, plan=plan, **inputs, backend="numpy")
    first = ctx.canary_buf.copy()
    assert (first.view(np.int64)[1:, 3] != 0).all()  # every slot written, with its fingerprint
    launch_canary_write_kernel(context=ctx, plan=plan, **inputs, backend="numpy")
    np.testing.assert_array_equal(ctx.canary_buf, first)
    assert int(ctx.violation_write_index[0]) == 0


def test_monitor_workload_steps_are_clean_and_repeatable():
    w = MonitorWorkload(np, requests=3, prefix=6, extend=2, max_steps=2, bytes_per_token=32)
    w.prefill()
    w.step(advance=False)
    buffers = {k: b.copy() for k, b in w.monitor.groups[0].buffers.items()}
    w.step(advance=False)  # the same step again: nothing changes
    for key, buf in w.monitor.groups[0].buffers.items():
        np.testing.assert_array_equal(buf, buffers[key])
    w.step()
    w.step()
    w.monitor.flush()
    assert w.monitor.violations == [] and w.length == 10
    assert w.monitor.stats()["protected_tokens"] > 0


# --- byte models and targets ---------------------------------------------------


def test_byte_models_count_the_documented_minimum():
    assert verify_bytes(1, NONE) == 3 * 8 + 32
    assert verify_bytes(1, PARTIAL) == 56 + 16
    assert verify_bytes(1, ALL, read_bytes=128) == 56 + 128
    assert verify_bytes(10, NONE, check_token=True) == 10 * 64
    assert write_bytes(1, 0, ALL, read_bytes=128) == 24 + 32 + 128
    assert write_bytes(0, 1, NONE) == 24 + 32
    assert plan_bytes(1, 0) == 40 and plan_bytes(0, 1) == 36


def test_targets_read_the_records_they_name():
    records = [
        {"op": "verify", "variant": "NONE", "entries": 1 << 22, "copy_fraction": 0.9, "load_ceiling_fraction": 0.97},
        {"op": "verify", "variant": "ALL", "entries": 1 << 24, "copy_fraction": 0.7, "load_ceiling_fraction": 0.85},
        {"op": "verify", "variant": "ALL pure loads", "entries": 1 << 24, "copy_fraction": 0.99},
        {"op": "verify", "variant": "ALL", "entries": 1 << 20, "copy_fraction": 0.1},  # too small to count
        {"op": "verify", "variant": "NONE contiguous", "entries": 1 << 22, "copy_fraction": 0.85},
        {"op": "verify", "variant": "ALL contiguous", "entries": 1 << 22, "copy_fraction": 0.95},
        {"op": "write", "variant": "ALL r=8", "tokens_per_request": 32768, "median_us": 100.0},
        {"op": "write", "variant": "baseline thread/request ALL r=8", "tokens_per_request": 32768, "median_us": 500.0},
        {"op": "plan", "variant": "offsets only, prefix=128", "bs": 4096, "median_us": 99.0},
        {"op": "plan", "variant": "decode prefix=128", "bs": 4096, "median_us": 25.0},
        {"op": "plan", "variant": "offsets only, prefix=128", "bs": 65536, "median_us": 20.0},
        {"op": "plan", "variant": "decode prefix=128", "bs": 65536, "median_us": 90.0, "ok": True},
        {"op": "step plan+verify+write host", "variant": "graph replay", "median_us": 20.0},
    ]
    targets = {t["target"].split(":")[0]: t for t in evaluate_targets(records)}
    contiguous = targets["verify >= 4M entries, NONE and ALL, contiguous slots"]
    assert contiguous["value"] == 0.85 and contiguous["met"] is True
    random = targets["verify >= 4M entries, NONE and ALL, random slots"]
    assert random["value"] == 0.7 and random["met"] is False
    ceiling = targets["verify >= 4M entries, NONE and ALL, random slots, against pure loads"]
    assert ceiling["value"] == 0.85 and ceiling["met"] is False and "no hashing" in ceiling["note"]
    write = targets["write 8 x 32k ALL"]
    assert write["value"] == 5.0 and write["met"] is True
    assert targets["plan bs=4096"]["met"] is True
    assert targets["plan bs=65536 works (entries and enable read back)"]["met"] is True
    assert targets["step host time, replayed from a CUDA graph"]["met"] is False
    assert targets["step host time, eager with prepared launches (the monitor's GPU path)"]["met"] is None
    assert targets["CPU verify"]["met"] is None


@pytest.mark.simulator
@pytest.mark.skipif(not SIMULATED, reason="NumPy arrays through the kernels")
def test_naive_dispatcher_launch_runs_the_recorded_kernel_on_the_callers_arrays():
    from benchmarks.baselines import naive_launch
    from kvcanary_numba.fast.recording import recording

    ctx, plan, _ = verify_case(np, entries=64, mode=ALL, bytes_per_token=32, chain_len=32)
    words = ctx.canary_buf.view(np.int64)
    words[int(plan.verify_slot_indices[40]), 1] += 1  # one planted position fault (and its successor's link)
    with recording() as rec:
        launch_canary_verify_kernel(context=ctx, plan=plan, check_verify_expected_token=True, backend="cuda")
    assert int(ctx.kernel_run_counter[0]) == 0  # recorded, not run
    naive_launch(rec.launches[0])()
    assert int(ctx.kernel_run_counter[0]) == 1 and int(ctx.slot_run_counter[0]) == 64
    assert sorted(ctx.violation_ring[:2, 1]) == sorted(plan.verify_slot_indices[[40, 41]])


def test_sanitizer_script_runs_every_kernel_on_garbage(tmp_path):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM=os.environ.get("NUMBA_ENABLE_CUDASIM", "1"))
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "sanitizer_check.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "all launches completed" in done.stdout
    assert "rows mode=2:" in done.stdout


def test_load_ceiling_expectation_is_the_xor_of_every_word_a_verify_reads():
    from benchmarks.ceiling import expected_xor

    for mode, kv_words in ((NONE, 0), (PARTIAL, 2), (ALL, 4)):
        ctx, plan, _ = verify_case(np, entries=48, mode=mode, bytes_per_token=32, chain_len=16)
        slots = plan.verify_slot_indices[:40]
        words = [
            slots,
            plan.verify_expected_positions[:40],
            plan.verify_prev_slot_indices[:40],
            ctx.canary_buf.view(np.int64)[slots].ravel(),
        ]
        if kv_words:
            words.append(ctx.real_kv_sources[0].tensor.view(np.int64)[slots, :kv_words].ravel())
        expected = 0
        for word in np.concatenate(words).tolist():
            expected ^= word & (2**64 - 1)
        assert expected_xor(ctx, plan, 40) == expected


@pytest.mark.gpu
def test_load_ceiling_kernel_reads_each_word_once():
    cupy = pytest.importorskip("cupy")
    from benchmarks.ceiling import expected_xor, verify_loads

    for mode in (NONE, PARTIAL, ALL):
        ctx, plan, _ = verify_case(cupy, entries=5000, mode=mode, bytes_per_token=128, chain_len=1000)
        out = verify_loads(ctx, plan, 4999)
        assert int(np.bitwise_xor.reduce(out.get())) == expected_xor(ctx, plan, 4999)


# --- the A/B protocol's scripts ----------------------------------------------------

AB_SCRIPTS = ("ab_common.py", "ab_monitor.py", "ab_public.py", "ab_cpu.py")


@pytest.mark.parametrize("script", AB_SCRIPTS)
def test_ab_scripts_use_only_the_public_api(script):
    # They measure an old tree too: only names both trees export, never benchmarks.* or a private module.
    import ast

    tree = ast.parse((ROOT / "benchmarks" / script).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            continue
        for name in names:
            assert not name.startswith("benchmarks"), (script, name)
            assert name == "kvcanary_numba" or not name.startswith("kvcanary_numba"), (script, name)


def _ab_line(args: list[str]) -> dict:
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1
    return json.loads(lines[0])


def test_ab_scripts_measure_the_tree_they_are_given_and_tabulate(tmp_path):
    cpu = _ab_line(["benchmarks/ab_cpu.py", str(ROOT), "new (round 1)", "--calls", "20"])
    assert cpu["script"] == "ab_cpu" and pathlib.Path(cpu["package"]) == ROOT / "kvcanary_numba"
    assert set(cpu["violations"].values()) == {0}  # clean inputs: every call found nothing
    assert (
        "public plan+verify+write, 1 entry" in cpu["rows"] and "monitor decode 16 x 1, prefix 256: step" in cpu["rows"]
    )
    assert all(row["median"] > 0 and row["n"] > 0 for row in cpu["rows"].values())
    public = _ab_line(["benchmarks/ab_public.py", str(ROOT), "smoke", "--smoke"])
    assert public["violations"] == 0 and {"verify / synced", "plan+verify+write / queued"} <= set(public["rows"])
    monitor = _ab_line(["benchmarks/ab_monitor.py", str(ROOT), "smoke", "--smoke"])
    assert monitor["violations"] == {"decode": 0, "prefill": 0}
    assert "decode prepared / idle: pre+post" in monitor["rows"]
    from benchmarks import ab_table

    base = {**cpu, "tree": "old", "label": "old (round 1)"}
    text = ab_table.table([base, cpu, {"tree": "old", "label": "old (round 2)", "failed": True}], base="old")
    assert "Failed processes: old (round 2)" in text
    assert f"### {ROOT} against old" in text and "| public verify, 1 entry |" in text and "| within |" in text


def test_ab_table_verdicts_and_older_probe_lines():
    from benchmarks import ab_table

    def line(tree, label, value):
        return {"tree": tree, "label": label, "rows": {"step": {"median": value}}}

    rows = [line(".base", "b1", 10.0), line(".base", "b2", 11.0), line(".", "n1", 11.5), line(".", "n2", 12.0)]
    assert "| step | 10.50 | 1.00 | 11.75 | 0.50 | +1.25 | slower (+1.25 > 1.00) |" in ab_table.table(rows)
    assert "| within |" in ab_table.table(rows, tolerance=2.0)
    assert "| faster |" in ab_table.table([*rows[:2], line(".", "n", 8.0)])
    older = [
        {"tree": ".base (round 1)", "rows": 0, "prepared / bench": {"host": {"median": 30.0}}},
        {"tree": ". (round 1)", "rows": 0, "prepared / bench": {"host": {"median": 29.0}}},
    ]
    assert "| prepared / bench: pre+post | 30.00 | 0.00 | 29.00 | 0.00 | -1.00 | faster |" in ab_table.table(older)


def test_gpu_session_parses_and_handles_every_documented_step():
    import re

    script = ROOT / "benchmarks" / "gpu_session.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    text = script.read_text()
    header = text.split("# Steps:", 1)[1].split("\n#\n", 1)[0]
    documented = re.findall(r"^#   ([a-z0-9]+) ", header, flags=re.M)
    handled = re.findall(r"^    ([a-z0-9]+)\)", text, flags=re.M)
    assert set(documented) == set(handled) and len(documented) == 19, (documented, handled)
    for gone in ("probes/", "candidate", "KVCANARY_VERIFY_REPLAYS"):
        assert gone not in text


def test_verify_replays_plugin_sets_the_fast_wing_switch():
    from benchmarks import verify_replays
    from kvcanary_numba.fast import replay

    saved = replay.VERIFY_REPLAYS
    try:
        replay.VERIFY_REPLAYS = False
        verify_replays.pytest_sessionstart(None)
        assert replay.VERIFY_REPLAYS is True
    finally:
        replay.VERIFY_REPLAYS = saved
