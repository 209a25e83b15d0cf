"""The example of ranks combining verdicts (``examples/ranks/``), run as a user runs it.

The CPU variant: N processes whose verdict words a coordinator merges through pipes. A fault on
one rank stops every rank at the same step and none hangs; a clean run stops none; without the
verdict the corrupted rank stops alone and the others are left waiting (the hang the verdict
exists to prevent, reported by the coordinator's deadline, not hung). Every run has a deadline.

The NCCL variant needs CuPy's NCCL binding and one GPU per rank: GPU-marked, one rank on one GPU,
and every GPU of the host (skipped with fewer than two).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "ranks"


def _run(script: str, *args: str, timeout: int = 300) -> tuple[int, dict]:
    # The package of this tree in every rank's process, ahead of what the caller's path holds (kept:
    # it may carry the NumPy the kernels need).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE / script), *args], capture_output=True, text=True, timeout=timeout, env=env
    )
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr[-3000:]
    return proc.returncode, json.loads(lines[-1])


def _by_rank(summary: dict) -> dict[int, dict]:
    return {int(rank): r for rank, r in summary["results"].items()}


@pytest.mark.parametrize(("ranks", "fault_rank", "fault_step"), [(3, 1, 5), (2, 0, 3), (3, 2, 9)])
def test_a_fault_on_one_rank_stops_every_rank_at_the_same_step(ranks, fault_rank, fault_step):
    code, summary = _run(
        "cpu_ranks.py",
        *("--ranks", str(ranks), "--fault-rank", str(fault_rank), "--fault-step", str(fault_step)),
        *("--steps", "30", "--timeout", "120"),
    )
    assert code == 0 and summary["problems"] == [] and summary["ranks"] == ranks
    (step,) = summary["stopped_at"]  # one step for every rank
    results = _by_rank(summary)
    (planted,) = results[fault_rank]["faults"]
    assert planted[0] == "kv_byte_flip" and step is not None and planted[1] <= step < 30
    assert [results[r]["faults"] == [] for r in range(ranks)] == [r != fault_rank for r in range(ranks)]
    # Only the corrupted rank found rows of its own; every rank names it as the one that found them.
    assert [results[r]["own_rows"] > 0 for r in range(ranks)] == [r == fault_rank for r in range(ranks)]
    assert all(r["found_by"] == fault_rank and r["stopped_at"] == step for r in results.values())
    assert all(
        f"kv-canary rank {r}: every rank stops after {step + 1} step(s)" in results[r]["message"] for r in results
    )


def test_a_clean_run_stops_no_rank():
    code, summary = _run("cpu_ranks.py", "--ranks", "3", "--steps", "24", "--timeout", "120")
    assert code == 0 and summary["problems"] == [] and summary["ranks"] == 3
    assert summary["stopped_at"] == [None]
    assert all(r["own_rows"] == 0 and r["found_by"] is None for r in _by_rank(summary).values())


def test_without_the_verdict_the_corrupted_rank_leaves_the_others_waiting():
    code, summary = _run("cpu_ranks.py", "--ranks", "2", "--fault-rank", "0", "--no-verdict", "--timeout", "120")
    assert code == 2 and summary["ranks"] == 1  # rank 0 alone came back; rank 1 waits for a merge
    assert _by_rank(summary)[0]["own_rows"] > 0
    assert "ranks [0] stopped, ranks [1] still waiting" in summary["problems"][0]


def test_a_silent_rank_is_reported_by_the_deadline_not_waited_for():
    # A rank that never reaches its collective (a hang inside the engine): the coordinator's
    # deadline names it and every process is ended; the run returns within the deadline.
    code, summary = _run("cpu_ranks.py", "--ranks", "2", "--hang-rank", "1", "--hang-step", "2", "--timeout", "5")
    assert code == 2 and "rank 1 sent nothing for 5.0 s (hung)" in summary["problems"][0]


def _nccl_or_skip(ranks: int) -> None:
    cupy = pytest.importorskip("cupy")
    try:
        from cupy.cuda import nccl
    except ImportError:
        pytest.skip("CuPy was built without NCCL (cupy.cuda.nccl)")
    if not nccl.available:
        pytest.skip("CuPy's NCCL binding has no NCCL library")
    if cupy.cuda.runtime.getDeviceCount() < ranks:
        pytest.skip(f"needs {ranks} GPUs (one per rank)")


@pytest.mark.gpu
def test_gpu_nccl_one_rank_stops_on_its_fault_one_call_later():
    _nccl_or_skip(1)
    code, summary = _run("nccl_ranks.py", "--ranks", "1", "--fault-rank", "0", "--fault-step", "4", "--timeout", "240")
    assert code == 0 and summary["problems"] == [] and summary["ranks"] == 1, summary
    (step,) = summary["stopped_at"]
    assert step is not None and step >= 4


@pytest.mark.gpu
def test_gpu_nccl_ranks_one_per_gpu_stop_together():
    _nccl_or_skip(2)
    import cupy

    ranks = cupy.cuda.runtime.getDeviceCount()
    code, summary = _run(
        "nccl_ranks.py", "--ranks", str(ranks), "--fault-rank", str(ranks - 1), "--timeout", "240", timeout=600
    )
    assert code == 0 and summary["problems"] == [] and summary["ranks"] == ranks
    (step,) = summary["stopped_at"]
    assert step is not None
    clean_code, clean = _run("nccl_ranks.py", "--ranks", str(ranks), "--steps", "16", "--timeout", "240", timeout=600)
    assert clean_code == 0 and clean["problems"] == [] and clean["stopped_at"] == [None]
