"""N ranks as N processes with one GPU each, their verdict words combined by NCCL (CuPy's binding).

Each rank runs a toy engine on its GPU (``rank % number of GPUs``) with a monitor built with
``verdict=True``; after every step it all-reduces its verdict word with ``ncclMax`` on the current
stream and hands the merged word (still on the device) to ``monitor.apply_verdict``, which reads it
one call later. A KV byte flipped on one rank stops every rank at the same step, so no rank is
left in an ``allReduce`` the others never join. The parent waits for the ranks with a deadline and
kills them if one hangs.

Run: ``python examples/ranks/nccl_ranks.py --ranks 2 --fault-rank 1`` (NCCL puts one rank on each
GPU: ``--ranks`` at most the number of GPUs; ``--ranks 1`` runs on one GPU). The last line printed
is a JSON summary; the exit status is 0 when every rank stopped at the same step (or none did, with
no fault), 1 when they disagree, 2 when a rank hung, died or did not start.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import pathlib
import queue
import sys

HERE = pathlib.Path(__file__).resolve().parent


def _rank_main(rank: int, world: int, unique_id, results, options: dict) -> None:
    sys.path.insert(0, str(HERE))
    import cupy
    from cupy.cuda import nccl
    from rank_loop import run_rank

    try:
        cupy.cuda.Device(rank % cupy.cuda.runtime.getDeviceCount()).use()
        comm = nccl.NcclCommunicator(world, unique_id, rank)
        merged = cupy.empty(16, dtype=cupy.int32)

        def allreduce_max(word):
            stream = cupy.cuda.get_current_stream()
            comm.allReduce(word.data.ptr, merged.data.ptr, word.size, nccl.NCCL_INT32, nccl.NCCL_MAX, stream.ptr)
            return merged  # on the device: the monitor copies it in this stream's order

        outcome = run_rank(rank, allreduce_max=allreduce_max, device="cuda", **options)
        cupy.cuda.get_current_stream().synchronize()
        comm.destroy()
        results.put(("done", rank, outcome))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which reports it
        results.put(("died", rank, f"{type(exc).__name__}: {exc}"))
        raise


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--fault-rank", type=int, default=None, help="rank whose KV gets one flipped byte")
    parser.add_argument("--fault-step", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds the whole run may take")
    args = parser.parse_args(argv)
    options = dict(steps=args.steps, fault_rank=args.fault_rank, fault_step=args.fault_step, seed=args.seed)
    from cupy.cuda import nccl

    if not nccl.available:  # CuPy without its NCCL library
        print(json.dumps({"ranks": 0, "stopped_at": [], "problems": ["cupy.cuda.nccl has no NCCL library"]}))
        return 2
    unique_id = nccl.get_unique_id()  # the parent makes it; every rank joins the same communicator
    context = mp.get_context("spawn")  # a CUDA context does not survive fork
    results = context.Queue()
    procs = [
        context.Process(target=_rank_main, args=(rank, args.ranks, unique_id, results, options), daemon=True)
        for rank in range(args.ranks)
    ]
    for p in procs:
        p.start()
    done, problems = {}, []
    while len(done) + len(problems) < args.ranks:
        try:
            kind, rank, payload = results.get(timeout=args.timeout)
        except queue.Empty:
            problems.append(f"ranks {sorted(set(range(args.ranks)) - set(done))} silent for {args.timeout} s (hung)")
            break
        if kind == "done":
            done[rank] = payload
        else:
            problems.append(f"rank {rank} died: {payload}")
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            problems.append(f"pid {p.pid} did not exit (hung in a collective?)")
            p.kill()
    for rank in sorted(done):
        r = done[rank]
        said = "ran to the end" if r["stopped_at"] is None else f"stopped at step {r['stopped_at']}"
        print(f"rank {rank}: {said} (rows of its own: {r['own_rows']}, faults planted: {r['faults']})")
    stops = {r["stopped_at"] for r in done.values()}
    summary = {"ranks": len(done), "stopped_at": sorted(stops, key=str), "problems": problems, "results": done}
    print(json.dumps(summary, sort_keys=True))
    if problems or len(done) != args.ranks:
        return 2
    return 0 if len(stops) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
