"""The kvcanary command line: explain, doctor, bench, demo (in process and as python -m)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from kvcanary_numba import cli
from kvcanary_numba.engine import FAULT_CLASSES
from kvcanary_numba.errors import REGISTRY

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_explain_prints_every_part_of_the_entry(capsys):
    assert cli.main(["explain", "KVC-P001"]) == 0
    out = capsys.readouterr().out
    entry = REGISTRY["KVC-P001"]
    assert out.startswith("KVC-P001  write_offsets is empty\n")
    for part in (entry.message, entry.before.splitlines()[0], entry.after.splitlines()[0], entry.sglang[0], entry.url):
        assert part in out
    for title in ("What it means", "Common causes", "How to fix", "Defensive pattern", "Prevention", "SGLang message(s)"):
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


def test_doctor_reports_versions_and_backends(capsys):
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    for key in ("kvcanary_numba", "numpy", "numba ", "numba-cuda", "cupy", "GPU", "CUDA simulator", "demo default"):
        assert key in out
    assert "0.30.4" in out  # numba-cuda is pinned


def test_doctor_says_the_kernels_need_numba_cuda(monkeypatch, capsys):
    from kvcanary_numba import _runtime

    monkeypatch.setattr(_runtime, "kernels_available", lambda: False)
    assert cli.main(["doctor"]) == 0
    gpu_path = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("GPU path"))
    assert gpu_path.endswith("unavailable: " + _runtime.NO_NUMBA_CUDA)  # the reason KVC-C008 gives


def test_bench_without_the_script_says_so(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(cli, "_BENCH", tmp_path / "missing" / "run.py")
    assert cli.main(["bench"]) == 1
    assert "not available" in capsys.readouterr().err


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
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert any(line.startswith("clean run") and "CLEAN" in line and " 0 violation" in line for line in lines)
    for kind in FAULT_CLASSES:
        row = next(line for line in lines if line.startswith(kind + " "))
        assert "CAUGHT" in row, row
    assert lines[-1] == f"summary: {len(FAULT_CLASSES)}/{len(FAULT_CLASSES)} fault classes caught; clean run reported nothing"
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
    return subprocess.run([sys.executable, "-c", NO_CUDA, *args], capture_output=True, text=True,
                          timeout=600, env=env, cwd=cwd or ROOT)  # fmt: skip


def test_cpu_path_works_without_numba_cuda():
    quickstart = _without_cuda(str(ROOT / "docs" / "snippets" / "quickstart.py"), cwd=ROOT / "docs" / "snippets")
    assert quickstart.returncode == 0, quickstart.stderr[-3000:]  # plan + verify + write on NumPy, fault caught
    for argv in (["kvcanary", "doctor"], ["kvcanary", "explain", "KVC-P001"],
                 ["kvcanary", "demo", "--steps", "12", "--device", "cpu", "--faults", "token_flip", "--no-progress"]):
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
    # launch/chain.py keeps the scratch layout without importing the kernels (CPU-only installs).
    from kvcanary_numba.kernels import share
    from kvcanary_numba.fast import chain

    assert (chain.ENTRY_ROWS, chain.SEED_ROWS) == (share.ENTRY_ROWS, share.SEED_ROWS)
    assert all(isinstance(getattr(share, role), type(share.OWN)) for role in ("PUBLISH", "CONSUME"))
