"""The kvcanary command line: explain, doctor, bench, demo (in process and as python -m)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kvcanary_numba import cli
from kvcanary_numba.engine import FAULT_CLASSES
from kvcanary_numba.errors import REGISTRY


def test_explain_prints_every_part_of_the_entry(capsys):
    assert cli.main(["explain", "KVC-P001"]) == 0
    out = capsys.readouterr().out
    entry = REGISTRY["KVC-P001"]
    assert out.startswith("KVC-P001  write_offsets is empty\n")
    for part in (entry.message, entry.before.splitlines()[0], entry.after, entry.sglang[0], entry.url):
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


def test_bench_without_the_script_says_so(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(cli, "_BENCH", tmp_path / "missing" / "run.py")
    assert cli.main(["bench"]) == 1
    assert "not available" in capsys.readouterr().err


def test_bench_passes_arguments_through(monkeypatch, tmp_path):
    script = tmp_path / "run.py"
    out = tmp_path / "args.json"
    script.write_text(f"import json, sys\njson.dump(sys.argv[1:], open({str(out)!r}, 'w'))\nsys.exit(3)\n")
    monkeypatch.setattr(cli, "_BENCH", script)
    assert cli.main(["bench", "--", "--quick", "--op", "verify"]) == 3
    assert json.loads(out.read_text()) == ["--quick", "--op", "verify"]


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
