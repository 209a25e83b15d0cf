"""The reliability page shows the committed fuzz run; the CI step and the fuzz scripts do what it says (issue 14)."""

from __future__ import annotations

import json
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import fuzz_cuda, fuzz_summary  # noqa: E402

PAGE = ROOT / "docs" / "concepts" / "reliability.md"
RESULTS = ROOT / "benchmarks" / "results" / "fuzz"


def _goal_table() -> dict[str, tuple[int, int]]:
    """Rows ``| label | numpy | sim |`` of the page's first table."""
    text = PAGE.read_text(encoding="utf-8")
    table = text.split("## The goal figure", 1)[1].split("\n\n**", 1)[0]
    rows = re.findall(r"^\| ([^|]+?) \| (\d+) \| (\d+) \|$", table, flags=re.M)
    return {label: (int(a), int(b)) for label, a, b in rows}


def test_goal_figure_is_the_committed_run():
    rows = _goal_table()
    runs = [json.loads((RESULTS / f"fuzz-{b}.json").read_text()) for b in ("numpy", "sim")]
    assert rows.pop("calls tried") == tuple(r["cases"] for r in runs)
    assert rows == {k: tuple(r["outcomes"][k] for r in runs) for k in rows}
    assert set(rows) == {k for k in runs[0]["outcomes"] if k not in ("SKIPPED", "HARNESS")}


def test_committed_runs_have_no_defect_and_the_ci_budget():
    for backend, n in (("numpy", 3000), ("sim", 200)):
        run = json.loads((RESULTS / f"fuzz-{backend}.json").read_text())
        assert run["exit_status"] == 0 and run["defects"] == 0 and run["cases"] == n and run["seed"] == 1
        assert all(run["outcomes"][k] == 0 for k in fuzz_summary.DEFECTS)
        assert f"--backend {backend} --n {n} --seed 1" in run["command"]


def test_ci_runs_the_harness_with_those_settings_before_the_readme_command():
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    lines = [line.strip() for line in script.splitlines() if line.strip() and not line.startswith("#")]
    assert lines[-1] == 'python -m pip install -e ".[dev,docs]" && python -m pytest'
    assert 'for lane in "numpy 3000" "sim 200"; do' in script
    assert 'python "$FUZZ" --backend "$1" --n "$2" --seed 1 --jobs 2 --lenient-signature' in script
    assert 'python benchmarks/fuzz_gate.py "$records"' in script
    assert 'if [ -f "$FUZZ" ]' in script and "skipped: harness not found" in script


def test_summary_counts_outcomes_and_keeps_signature_errors_apart():
    records = [
        dict(target="f", outcome="OK"),
        dict(target="f", outcome="CODED", code="KVC-C002"),
        dict(target="g", outcome="CODED", code="KVC-C004"),
        dict(target="g", outcome="OTHER", signature=True),
        dict(target="g", outcome="PARTIAL_WRITE"),
    ]
    summary = fuzz_summary.summarize(records)
    assert summary["cases"] == 5 and summary["defects"] == 1 and summary["codes"] == 2
    assert summary["outcomes"]["OTHER"] == 0 and summary["outcomes"]["OTHER (call signature)"] == 1
    assert summary["by_target"] == {
        "f": {"CODED": 1, "OK": 1},
        "g": {"CODED": 1, "OTHER (call signature)": 1, "PARTIAL_WRITE": 1},
    }


def test_cuda_fuzz_skips_cleanly_without_the_harness(tmp_path, capsys):
    assert fuzz_cuda.main(["--harness", str(tmp_path / "missing.py")]) == 0
    assert "skipped: harness not found" in capsys.readouterr().out


def test_cuda_fuzz_wraps_dataclasses_and_keeps_everything_else():
    np = pytest.importorskip("numpy")
    from kvcanary_numba import VerifyPlan

    class FakeMover(fuzz_cuda.Mover):
        def device(self, host):
            return ("dev", host.shape)

    mover = FakeMover(cupy=None)
    plan = mover.convert(VerifyPlan.allocate(verify_capacity=3))
    assert plan.verify_slot_indices == ("dev", (3,)) and plan.enable == ("dev", (1,))
    assert mover.convert([np.zeros(2), 5, None, "x"]) == [("dev", (2,)), 5, None, "x"]
    assert mover.convert(np.zeros(2, dtype=object)).dtype == object  # objects stay on the host


def test_the_fuzz_gate_lets_through_only_what_the_api_documents():
    from benchmarks import fuzz_gate

    def case(outcome, target, mutation, arg, **more):
        return dict(index=0, outcome=outcome, target=target, mutation=mutation, arg=arg, detail="-", **more)

    documented = [
        case("WRONG", "launch_canary_verify_kernel", "kw:missing", "check_verify_expected_token"),
        case("WRONG", "launch_canary_plan_kernels", "kw:missing", "swa_window_size"),
        case("WRONG", "CanaryMonitor", "batch.dtype:int32", "prefix_lens"),
        case("WRONG", "launch_canary_write_kernel", "dtype:int32", "out_cache_loc"),
    ]
    defects = [
        case("WRONG", "launch_canary_verify_kernel", "kw:missing", "context"),  # required
        case("WRONG", "CanaryMonitor", "batch.dtype:int32", "req_to_token"),  # not an index field
        case("WRONG", "launch_canary_verify_kernel", "dtype:int32", "out_cache_loc"),  # not the write
        case("PARTIAL_WRITE", "launch_canary_verify_kernel", "kw:missing", "check_verify_expected_token"),
        case("OTHER", "launch_canary_write_kernel", "shape", "positions"),
    ]
    ignored = [
        case("OTHER", "scatter_req_token_ids", "kw:positional", "-", signature=True),
        case("CODED", "x", "y", "z"),
    ]
    allowed, found = fuzz_gate.gate(documented + defects + ignored)
    assert [r for r, _ in allowed] == documented and found == defects
