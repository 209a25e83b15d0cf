"""The kvcanary command line: explain, doctor, bench, demo (in process and as python -m)."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
import sys
from importlib import metadata

import pytest

from kvcanary_numba import cli, doctor
from kvcanary_numba.engine import ALL_FAULT_CLASSES
from kvcanary_numba.errors import REGISTRY

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_explain_prints_every_part_of_the_entry(capsys):
    assert cli.main(["explain", "KVC-P001"]) == 0
    out = capsys.readouterr().out
    entry = REGISTRY["KVC-P001"]
    assert out.startswith("KVC-P001  write_offsets is empty\n")
    for part in (entry.message, entry.before.splitlines()[0], entry.after.splitlines()[0], entry.sglang[0], entry.url):
        assert part in out
    for title in (
        "What it means",
        "Common causes",
        "How to fix",
        "Defensive pattern",
        "Prevention",
        "SGLang message(s)",
    ):
        assert f"\n{title}\n" in out


@pytest.mark.parametrize("spelling", ["kvc-m001", "M001", "m1", " KVC-M001 "])
def test_explain_accepts_short_and_lower_case_codes(spelling, capsys):
    assert cli.main(["explain", spelling]) == 0
    assert capsys.readouterr().out.startswith("KVC-M001  Unknown monitor mode")


def test_explain_unknown_code_exits_2_with_close_matches(capsys):
    assert cli.main(["explain", "KVC-P0O1"]) == 2
    err = capsys.readouterr().err
    assert "unknown error code 'KVC-P0O1'" in err
    assert "Did you mean: " in err and "KVC-P001" in err


def test_explain_without_code_lists_the_catalogue(capsys):
    assert cli.main(["explain"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(REGISTRY) and "KVC-E001  Unknown fault class" in lines


def _doctor_rows(out: str) -> dict[str, str]:
    """``kvcanary doctor``'s rows by key (keys padded to 14 characters, then two spaces)."""
    return {line[:16].strip(): line[16:] for line in out.splitlines() if line.strip()}


def test_doctor_reports_versions_and_runtimes(capsys):
    assert cli.main(["doctor"]) == 0
    rows = _doctor_rows(capsys.readouterr().out)
    for key in (
        "kvcanary_numba",
        "numpy",
        "numba",
        "numba-cuda",
        "cupy",
        "CUDA runtime",
        "CUDA driver",
        "GPU",
        "CUDA simulator",
        "GPU path",
        "demo default",
    ):
        assert key in rows
    assert rows["numpy"] == metadata.version("numpy")
    try:
        assert rows["numba-cuda"] == metadata.version("numba-cuda") == "0.30.4"  # the extras pin it
    except metadata.PackageNotFoundError:  # the CPU install
        assert rows["numba-cuda"].startswith("not installed") and "the kernels need" in rows["GPU path"]


def test_doctor_says_the_kernels_need_numba_cuda(monkeypatch, capsys):
    from kvcanary_numba import _runtime

    monkeypatch.setattr(_runtime, "kernels_unavailable", lambda: _runtime.NO_NUMBA_CUDA)
    assert cli.main(["doctor"]) == 0
    gpu_path = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("GPU path"))
    assert ("unavailable: " + _runtime.NO_NUMBA_CUDA) in gpu_path  # the reason KVC-C008 gives


#: A machine where the GPU path works: CUDA 13 everywhere, one H100.
HEALTHY = doctor.CudaProbe(
    numpy="2.4.6",
    numba_cuda="0.30.4",
    cupy="14.2.0",
    runtimes=(("cuda-bindings 13.0.3", "13.0"), ("numba-cuda 0.30.4", "13.0"), ("CuPy 14.2.0", "13.0")),
    driver="13.0",
    devices=("NVIDIA H100 80GB HBM3 (compute capability 9.0)",),
)


def _kinds(**changes) -> list[str]:
    return [reason.kind for reason in doctor.gpu_path_reasons(dataclasses.replace(HEALTHY, **changes))]


def test_doctor_reasons_are_empty_where_the_gpu_path_works():
    assert _kinds() == []


@pytest.mark.parametrize(
    "changes, kinds",
    [
        (dict(numba_cuda=None, runtimes=(("CuPy 14.2.0", "13.0"),)), ["no-numba-cuda"]),
        (
            dict(
                numpy="2.5.0",
                numba_cuda_error="AttributeError: module 'numpy' has no attribute 'row_stack'",
                runtimes=(("cuda-bindings 13.0.3", "13.0"), ("CuPy 14.2.0", "13.0")),
            ),
            ["numpy-too-new"],
        ),
        (dict(numpy="2.5.0rc1", numba_cuda_error="AttributeError: row_stack"), ["numpy-too-new"]),
        (dict(numba_cuda_error="ImportError: libnvrtc.so.13: cannot open shared object file"), ["numba-cuda-broken"]),
        (dict(cupy=None, runtimes=HEALTHY.runtimes[:2]), ["no-cupy"]),
        (dict(cupy_error="ImportError: CuPy failed to load libcudart.so.13"), ["cupy-broken"]),
        (
            dict(driver=None, driver_error="no NVIDIA driver: libcuda.so.1 is not on the library path", devices=()),
            ["no-driver"],
        ),
        (
            dict(driver_error="the driver (CUDA 13.0) failed to initialise: cuInit returned CUresult 999", devices=()),
            ["driver-error"],
        ),
        (dict(devices=()), ["no-gpu"]),
        (dict(driver="12.8"), ["driver-too-old"]),
        (dict(driver="11.8"), ["driver-too-old"]),
        (dict(runtimes=(("cuda-bindings 13.0.3", "13.0"), ("CuPy 14.2.0", "12.9"))), ["runtime-mismatch"]),
        (dict(runtimes=()), ["no-runtime"]),
        (dict(simulator=True), ["simulator"]),
    ],
)
def test_doctor_names_why_the_gpu_path_is_unavailable(changes, kinds):
    assert _kinds(**changes) == kinds


def test_doctor_reasons_on_a_laptop_with_the_cpu_install():
    # pip install kvcanary_numba: no numba-cuda, no CuPy, no driver; reasons come in REASON_KINDS order.
    kinds = _kinds(numba_cuda=None, cupy=None, runtimes=(), driver=None, devices=())
    assert kinds == ["no-numba-cuda", "no-cupy", "no-driver"]
    assert all(kind in doctor.REASON_KINDS for kind in kinds)


def test_doctor_reasons_for_numpy_25_beside_the_cuda_13_extra():
    # numba-cuda installed but broken by NumPy 2.5: the kernels' runtime still answers through
    # cuda-bindings and CuPy; the only reason is NumPy, not a missing runtime.
    probe = dataclasses.replace(
        HEALTHY,
        numpy="2.5.2",
        numba_cuda_error="AttributeError: row_stack",
        runtimes=(("cuda-bindings 13.0.3", "13.0"), ("CuPy 14.2.0", "13.0")),
    )
    assert [r.kind for r in doctor.gpu_path_reasons(probe)] == ["numpy-too-new"]
    assert "numpy<2.5" in doctor.gpu_path_reasons(probe)[0].text


@pytest.mark.parametrize(
    "driver, extra", [("12.8", "gpu-cu12"), ("12.0", "gpu-cu12"), ("13.0", "gpu"), ("13.2", "gpu"), (None, "gpu")]
)
def test_doctor_suggests_the_extra_the_driver_runs(driver, extra):
    probe = dataclasses.replace(HEALTHY, numba_cuda=None, driver=driver)
    assert doctor.suggested_extra(probe) == extra
    assert f"kvcanary_numba[{extra}]" in doctor.gpu_path_reasons(probe)[0].text


@pytest.mark.parametrize(
    "driver, runtimes, extra",
    [
        (None, ("12.9", "12.9"), "gpu-cu12"),
        ("13.0", ("12.9",), "gpu-cu12"),  # a CUDA 13 driver runs the CUDA 12 stack already installed
        ("13.0", ("12.9", "13.0"), "gpu"),
        (None, (), "gpu"),
        ("12.8", ("13.0",), "gpu-cu12"),  # the driver decides: it cannot run CUDA 13
    ],
)
def test_doctor_suggests_the_extra_of_the_cuda_12_stack_already_installed(driver, runtimes, extra):
    found = tuple((f"source {i}", version) for i, version in enumerate(runtimes))
    probe = dataclasses.replace(HEALTHY, cupy=None, driver=driver, runtimes=found)
    assert doctor.suggested_extra(probe) == extra
    assert any(f"kvcanary_numba[{extra}]" in reason.text for reason in doctor.gpu_path_reasons(probe))


def test_doctor_prints_the_runtime_driver_and_every_reason(monkeypatch, capsys):
    probe = dataclasses.replace(
        HEALTHY, cupy=None, driver="12.8", runtimes=(("cuda-bindings 13.0.3", "13.0"), ("numba-cuda 0.30.4", "13.0"))
    )
    monkeypatch.setattr(doctor, "probe_cuda", lambda: probe)
    assert cli.main(["doctor"]) == 0
    rows = _doctor_rows(capsys.readouterr().out)
    assert rows["CUDA runtime"] == "13.0 (from cuda-bindings 13.0.3, numba-cuda 0.30.4)"
    assert rows["CUDA driver"] == "supports CUDA 12.8"
    assert rows["GPU"] == "NVIDIA H100 80GB HBM3 (compute capability 9.0), 1 device(s)"
    assert rows["GPU path"].startswith("unavailable: CuPy is not installed")
    assert rows[""].startswith("and: the driver supports CUDA 12.8") and "gpu-cu12" in rows[""]


def test_doctor_probe_reads_this_process():
    import numpy as np

    probe = doctor.probe_cuda()
    assert probe.numpy == np.__version__
    assert probe.simulator == (os.environ.get("NUMBA_ENABLE_CUDASIM") == "1")  # conftest sets it
    if probe.driver is None:  # no driver: no device can be listed, and doctor says why
        assert probe.driver_error and not probe.devices
        assert "no-driver" in [r.kind for r in doctor.gpu_path_reasons(probe)]
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        return
    err, value = cudart.cudaRuntimeGetVersion()
    bindings = dict(probe.runtimes).get(f"cuda-bindings {metadata.version('cuda-bindings')}")
    assert bindings == f"{value // 1000}.{value % 1000 // 10}" and int(err) == 0


#: A stand-in libcuda.so.1: driver version, cuInit's result and device count from the environment.
FAKE_LIBCUDA = r"""
#include <stdlib.h>
#include <string.h>
static int env(const char *name, int fallback) { const char *v = getenv(name); return v ? atoi(v) : fallback; }
int cuDriverGetVersion(int *version) { *version = env("FAKE_CUDA_VERSION", 12080); return 0; }
int cuInit(unsigned flags) { return env("FAKE_CUDA_INIT", 0); }
int cuDeviceGetCount(int *count) { *count = env("FAKE_CUDA_DEVICES", 1); return 0; }
int cuDeviceGet(int *device, int ordinal) { *device = ordinal; return 0; }
int cuDeviceGetName(char *name, int len, int device) { strncpy(name, "Fake H100", len); return 0; }
int cuDeviceGetAttribute(int *value, int attribute, int device) { *value = attribute == 75 ? 9 : 0; return 0; }
"""


FAKE_H100 = "Fake H100 (compute capability 9.0)"


@pytest.mark.parametrize(
    "environment, driver, error, devices, kinds",
    [
        # HEALTHY's runtimes are CUDA 13: a CUDA 12.8 driver is too old for them.
        ({}, "12.8", None, (FAKE_H100,), ["driver-too-old"]),
        ({"FAKE_CUDA_VERSION": "13000", "FAKE_CUDA_DEVICES": "2"}, "13.0", None, (FAKE_H100, FAKE_H100), []),
        ({"FAKE_CUDA_VERSION": "13000", "FAKE_CUDA_INIT": "100"}, "13.0", None, (), ["no-gpu"]),  # NO_DEVICE
        ({"FAKE_CUDA_VERSION": "13000", "FAKE_CUDA_INIT": "999"}, "13.0", "CUresult 999", (), ["driver-error"]),
    ],
)
def test_doctor_reads_the_driver_through_libcuda(tmp_path, environment, driver, error, devices, kinds):
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None or sys.platform != "linux":
        pytest.skip("needs a C compiler on Linux to build a stand-in libcuda.so.1")
    (tmp_path / "libcuda.c").write_text(FAKE_LIBCUDA)
    subprocess.run(
        [
            cc,
            "-shared",
            "-fPIC",
            "-Wl,-soname,libcuda.so.1",
            "-o",
            str(tmp_path / "libcuda.so.1"),
            str(tmp_path / "libcuda.c"),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    env = dict(os.environ, LD_LIBRARY_PATH=str(tmp_path), PYTHONPATH=str(ROOT), **environment)
    script = "import json; from kvcanary_numba import doctor; print(json.dumps(doctor._probe_driver()))"
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found_driver, found_error, found_devices = json.loads(proc.stdout)
    assert (found_driver, tuple(found_devices)) == (driver, devices)
    assert found_error is None if error is None else error in found_error
    probe = dataclasses.replace(HEALTHY, driver=found_driver, driver_error=found_error, devices=tuple(found_devices))
    assert [r.kind for r in doctor.gpu_path_reasons(probe)] == kinds


def test_bench_without_the_script_says_so(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(cli, "_BENCH", tmp_path / "missing" / "run.py")
    assert cli.main(["bench"]) == 1
    assert "python -m benchmarks.run" in capsys.readouterr().err


def test_bench_from_a_wheel_points_at_a_checkout(monkeypatch, tmp_path, capsys):
    # An installed wheel: site-packages has no pyproject.toml; a benchmarks/run.py there is another
    # distribution's, never run.
    site = tmp_path / "site-packages"
    (site / "benchmarks").mkdir(parents=True)
    script, ran = site / "benchmarks" / "run.py", tmp_path / "ran"
    script.write_text(f"open({str(ran)!r}, 'w').close()\n")
    monkeypatch.setattr(cli, "_SOURCE_TREE", site)
    monkeypatch.setattr(cli, "_BENCH", script)
    assert cli.main(["bench", "--", "--quick"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(cli.BENCH_FROM_CHECKOUT) and not ran.exists()


def test_bench_passes_arguments_through(monkeypatch, tmp_path):
    script = tmp_path / "run.py"
    out = tmp_path / "args.json"
    script.write_text(f"import json, sys\njson.dump(sys.argv[1:], open({str(out)!r}, 'w'))\nsys.exit(3)\n")
    monkeypatch.setattr(cli, "_BENCH", script)
    monkeypatch.chdir(tmp_path)  # outside the source tree: results default to ./kvcanary-bench-<date>
    assert cli.main(["bench", "--", "--quick", "--op", "verify"]) == 3
    args = json.loads(out.read_text())
    assert args[:4] == ["--quick", "--op", "verify", "--out"] and len(args) == 5


def test_demo_json_reports_a_clean_run_and_the_caught_fault(capsys):
    rc = cli.main(["demo", "--steps", "20", "--faults", "kv_byte_flip", "--json", "--device", "cpu", "--no-progress"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and report["ok"] and report["device"] == "cpu"
    clean, fault = report["runs"]
    assert (clean["fault"], clean["status"], clean["violations"]) == (None, "CLEAN", 0)
    assert fault["fault"] == "kv_byte_flip" and fault["status"] == "CAUGHT"
    assert fault["first_catch"]["reasons"] == ["verify_real_kv_hash"]
    assert fault["first_catch"]["slot_idx"] in fault["injected"][0]["slots"]


def test_demo_rejects_an_unknown_fault_before_running(capsys):
    assert cli.main(["demo", "--faults", "token_flip,bit_rot", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "KVC-E001" in err and "kvcanary explain KVC-E001" in err


def test_python_dash_m_demo_shows_every_fault_class_caught():
    env = dict(os.environ, PYTHONWARNINGS="error")
    proc = subprocess.run(
        [sys.executable, "-m", "kvcanary_numba", "demo", "--steps", "30", "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert any(line.startswith("clean run") and "CLEAN" in line and " 0 violation" in line for line in lines)
    for kind in ALL_FAULT_CLASSES:
        row = next(line for line in lines if line.startswith(kind + " "))
        assert "CAUGHT" in row, row
    assert (
        lines[-1]
        == f"summary: {len(ALL_FAULT_CLASSES)}/{len(ALL_FAULT_CLASSES)} fault classes caught; clean run reported nothing"
    )
    assert "30/30 steps" in proc.stderr  # the progress bar


@pytest.mark.parametrize("steps", ["0", "-3", "many"])
def test_demo_rejects_steps_below_one_as_a_usage_error(steps, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", "--steps", steps, "--no-progress"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--steps" in err and ">= 1" in err


def test_demo_report_explains_each_term_it_uses_once():
    from kvcanary_numba.engine.demo import glossary

    report = "launch_tag=HEAD_K_FULL slot_idx=3 expected_aux=0x1 and TAIL_V_SWA"
    lines = glossary(report)
    assert lines[0] == "terms:" and lines[-1] == ""
    names = [line.split()[0].rstrip(",") for line in lines[1:-1]]
    assert names == ["HEAD_K_FULL", "TAIL_V_SWA", "launch_tag", "slot_idx", "expected_aux"]
    assert glossary("nothing to explain here") == []


def test_bench_results_go_outside_the_source_tree(monkeypatch, tmp_path, capsys):
    import datetime

    now = datetime.datetime(2026, 12, 3, 12, 0, 0)
    outside = tmp_path / "work"
    outside.mkdir()
    assert cli.bench_out_dir(outside, cli._SOURCE_TREE, now) == outside / "kvcanary-bench-20261203-120000"
    inside = cli.bench_out_dir(cli._SOURCE_TREE / "docs", cli._SOURCE_TREE, now)
    assert cli._SOURCE_TREE not in inside.parents and inside.is_dir()
    inside.rmdir()
    # Through main: the script gets --out (printed), unless the caller chose one.
    script, seen = tmp_path / "run.py", tmp_path / "args.json"
    script.write_text(f"import json, sys\njson.dump(sys.argv[1:], open({str(seen)!r}, 'w'))\n")
    monkeypatch.setattr(cli, "_BENCH", script)
    monkeypatch.chdir(outside)
    assert cli.main(["bench", "--", "--quick"]) == 0
    args = json.loads(seen.read_text())
    assert args[:2] == ["--quick", "--out"] and pathlib.Path(args[2]).parent == outside
    assert f"results go to {args[2]}" in capsys.readouterr().err
    assert cli.main(["bench", "--", "--out", "mine"]) == 0
    assert json.loads(seen.read_text()) == ["--out", "mine"]


#: Runs the CPU path with numba.cuda (and numba_cuda) unimportable, as after `pip install .` without extras.
NO_CUDA = """
import importlib.abc, sys

class NoCuda(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "numba_cuda" or name == "numba.cuda" or name.startswith("numba.cuda."):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: CPU-only install)")
        return None

sys.meta_path.insert(0, NoCuda())
import runpy
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__") if sys.argv[0].endswith(".py") else runpy.run_module(
    "kvcanary_numba", run_name="__main__")
"""


def _without_cuda(*args, cwd=None):
    env = dict(os.environ, PYTHONWARNINGS="error", NUMBA_ENABLE_CUDASIM="0")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-c", NO_CUDA, *args], capture_output=True, text=True, timeout=600, env=env, cwd=cwd or ROOT
    )


def test_cpu_path_works_without_numba_cuda():
    quickstart = _without_cuda(str(ROOT / "docs" / "snippets" / "quickstart.py"), cwd=ROOT / "docs" / "snippets")
    assert quickstart.returncode == 0, quickstart.stderr[-3000:]  # plan + verify + write on NumPy, fault caught
    for argv in (
        ["kvcanary", "doctor"],
        ["kvcanary", "explain", "KVC-P001"],
        ["kvcanary", "demo", "--steps", "12", "--device", "cpu", "--faults", "token_flip", "--no-progress"],
    ):
        proc = _without_cuda(*argv)
        assert proc.returncode == 0, (argv, proc.stderr[-3000:])
        if argv[1] == "doctor":
            assert "GPU path        unavailable: the kernels need the numba-cuda package" in proc.stdout
    assert "summary: 1/1 fault classes caught" in proc.stdout


def test_blocker_really_hides_numba_cuda(tmp_path):
    script = tmp_path / "kernels.py"
    script.write_text("import kvcanary_numba.launch.verify\n")  # the launch glue needs numba.cuda
    proc = _without_cuda(str(script))
    assert proc.returncode != 0 and "blocked: CPU-only install" in proc.stderr


def test_cpu_side_chain_constants_match_the_kernels():
    # fast/chain.py keeps the scratch layout without importing the kernels (CPU-only installs).
    from kvcanary_numba.fast import chain
    from kvcanary_numba.fast.kernels import share

    assert (chain.ENTRY_ROWS, chain.SEED_ROWS) == (share.ENTRY_ROWS, share.SEED_ROWS)
    assert all(isinstance(getattr(share, role), type(share.OWN)) for role in ("PUBLISH", "CONSUME"))
