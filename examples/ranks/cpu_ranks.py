"""N ranks as N processes on the CPU, their verdict words combined through pipes.

The NumPy-path stand-in of ``nccl_ranks.py``: a coordinator in the parent process receives one
word per rank per step, merges them (``merge_verdicts``: the element-wise max an all-reduce
computes) and sends the merged word back to every rank. A rank that left the loop while the
others wait for a merge is the hang a real collective would turn into; the coordinator reports
it instead of waiting forever.

Run: ``python examples/ranks/cpu_ranks.py --ranks 3 --fault-rank 1``. The last line printed is a
JSON summary; the exit status is 0 when every rank stopped at the same step (or none did, with no
fault), 1 when they disagree, 2 when a rank hung or died. ``--no-verdict`` builds the monitors
without the verdict: the corrupted rank raises alone and the others are left waiting (status 2).
``--hang-rank R --hang-step S`` makes rank R stop answering before its collective of step S (an
engine hung elsewhere): the coordinator's deadline reports it and every process is ended.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import pathlib
import sys
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent


def _rank_main(rank: int, conn, options: dict, hang_at: int | None = None) -> None:
    sys.path.insert(0, str(HERE))
    from rank_loop import run_rank

    calls = 0

    def allreduce_max(word) -> np.ndarray:
        nonlocal calls
        calls += 1
        if calls == hang_at:  # --hang-rank: this rank never joins this step's collective
            time.sleep(3600)
        conn.send(("word", np.asarray(word).tobytes()))
        kind, payload = conn.recv()
        if kind != "merged":
            raise SystemExit(f"rank {rank}: the coordinator gave up: {payload}")
        return np.frombuffer(payload, dtype=np.int32).copy()

    try:
        conn.send(("done", run_rank(rank, allreduce_max=allreduce_max, **options)))
    except BaseException as exc:  # noqa: BLE001 - reported to the coordinator, which reports it
        conn.send(("died", f"{type(exc).__name__}: {exc}"))
        raise


def coordinate(conns, timeout: float) -> tuple[dict, list[str]]:
    """Merge one word per rank per round until every rank is done; returns (results, problems)."""
    from kvcanary_numba.monitor import merge_verdicts

    results, problems, rounds = {}, [], 0
    while len(results) < len(conns) and not problems:
        words = {}
        for rank, conn in enumerate(conns):
            if rank in results:
                continue
            if not conn.poll(timeout):
                problems.append(f"rank {rank} sent nothing for {timeout} s (hung)")
                break
            kind, payload = conn.recv()
            if kind == "word":
                words[rank] = np.frombuffer(payload, dtype=np.int32)
            elif kind == "done":
                results[rank] = payload
            else:
                problems.append(f"rank {rank} died: {payload}")
        if problems:
            break
        if words and results:  # some ranks left the loop while others wait for this merge: a hang
            problems.append(f"round {rounds}: ranks {sorted(results)} stopped, ranks {sorted(words)} still waiting")
            break
        if words:
            merged = merge_verdicts(list(words.values())).tobytes()
            for rank in words:
                conns[rank].send(("merged", merged))
            rounds += 1
    for rank, conn in enumerate(conns):
        if rank not in results:
            try:
                conn.send(("abort", "; ".join(problems)))
            except (BrokenPipeError, OSError):
                pass
    return results, problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--fault-rank", type=int, default=None, help="rank whose KV gets one flipped byte")
    parser.add_argument("--fault-step", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a rank may stay silent")
    parser.add_argument(
        "--no-verdict", action="store_true", help="each rank raises alone (the hang the verdict prevents)"
    )
    parser.add_argument("--hang-rank", type=int, default=None, help="a rank that stops answering")
    parser.add_argument("--hang-step", type=int, default=2, help="the step whose collective it never joins")
    args = parser.parse_args(argv)
    options = dict(steps=args.steps, fault_rank=args.fault_rank, fault_step=args.fault_step, seed=args.seed)
    options["verdict"] = not args.no_verdict
    context = mp.get_context("spawn")
    pipes = [context.Pipe() for _ in range(args.ranks)]
    procs = [
        context.Process(
            target=_rank_main,
            args=(rank, child, options, args.hang_step + 1 if rank == args.hang_rank else None),
            daemon=True,
        )
        for rank, (_, child) in enumerate(pipes)
    ]
    for p in procs:
        p.start()
    results, problems = coordinate([parent for parent, _ in pipes], args.timeout)
    for rank, p in enumerate(procs):
        p.join(timeout=2 if problems else 30)
        if p.is_alive():  # a hung rank (told to abort, it cannot listen): ended here, never waited for
            problems.append(f"rank {rank} (pid {p.pid}) did not exit: killed")
            p.kill()
            p.join()
    for rank in sorted(results):
        r = results[rank]
        said = "ran to the end" if r["stopped_at"] is None else f"stopped at step {r['stopped_at']}"
        print(f"rank {rank}: {said} (rows of its own: {r['own_rows']}, faults planted: {r['faults']})")
    stops = {r["stopped_at"] for r in results.values()}
    summary = {"ranks": len(results), "stopped_at": sorted(stops, key=str), "problems": problems, "results": results}
    print(json.dumps(summary, sort_keys=True))
    if problems or len(results) != args.ranks:
        return 2
    return 0 if len(stops) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
