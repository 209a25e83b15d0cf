"""The example of ranks combining verdicts (``examples/ranks/``): the CPU variant run as a user runs it,
N processes whose words a coordinator merges through pipes. A fault on one rank stops every rank at
the same step and none hangs; a clean run stops none; without the verdict the corrupted rank stops
alone and the others are left waiting (the hang the verdict exists to prevent, reported, not hung).
The NCCL variant needs one GPU per rank: it runs on a GPU host (one rank per GPU)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "ranks"


def _run(script: str, *args: str, timeout: int = 600) -> tuple[int, dict]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # the package of this tree, in every rank's process
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE / script), *args], capture_output=True, text=True, timeout=timeout, env=env
    )
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr[-3000:]
    return proc.returncode, json.loads(lines[-1])


def test_a_fault_on_one_rank_stops_every_rank_at_the_same_step():
    code, summary = _run("cpu_ranks.py", "--ranks", "3", "--fault-rank", "1", "--fault-step", "5", "--timeout", "240")
    assert code == 0 and summary["problems"] == [] and summary["ranks"] == 3
    (step,) = summary["stopped_at"]
    results = {int(rank): r for rank, r in summary["results"].items()}
    assert step is not None and step >= results[1]["faults"][0][1]  # at the flip's step or later
    assert [results[r]["own_rows"] > 0 for r in range(3)] == [False, True, False]
    assert all(r["found_by"] == 1 and r["stopped_at"] == step for r in results.values())


def test_a_clean_run_stops_no_rank():
    code, summary = _run("cpu_ranks.py", "--ranks", "2", "--steps", "24", "--timeout", "240")
    assert code == 0 and summary["problems"] == [] and summary["stopped_at"] == [None]


def test_without_the_verdict_the_corrupted_rank_leaves_the_others_waiting():
    code, summary = _run("cpu_ranks.py", "--ranks", "2", "--fault-rank", "0", "--no-verdict", "--timeout", "240")
    assert code == 2 and summary["ranks"] == 1
    assert "stopped, ranks [1] still waiting" in summary["problems"][0]


@pytest.mark.gpu
def test_gpu_nccl_ranks_one_per_gpu():
    import cupy

    ranks = cupy.cuda.runtime.getDeviceCount()
    code, summary = _run("nccl_ranks.py", "--ranks", str(ranks), "--fault-rank", str(ranks - 1), "--timeout", "300")
    assert code == 0 and summary["problems"] == [] and summary["ranks"] == ranks
    assert len(summary["stopped_at"]) == 1 and summary["stopped_at"][0] is not None
