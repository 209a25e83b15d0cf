"""Session 4 probe: the ordinary launch path before and after this session's change, in one process.
"numba launch": each call goes through the compiled kernel's Numba launch and views' layouts come from
their __cuda_array_interface__ (commit 051cd94); "raw launch": one cached PreparedLaunch per kernel
refilled per call, layouts kept on the views. Alternating passes of the benchmark's launch-overhead and
step sections. Run from the repository root: python3 probe_launch_ab.py out.json"""
import json, sys
sys.path.insert(0, ".")
from kvcanary_numba.launch import _array_views, _common, _kernel_launch
from benchmarks import bench_step
from benchmarks.run import Run

new_launch = _common.launch  # the glue looks it up there at call time


def numba_launch(kernel, signature, grid, block, args):
    compiled = _kernel_launch.compile_kernel(kernel, signature)
    stream = _kernel_launch._stream_pair(_kernel_launch._current_stream_ptr())[1]
    compiled.launch(tuple(args), (int(grid), 1, 1), (int(block), 1, 1), stream, 0)


def use(old: bool):
    _common.launch = numba_launch if old else new_launch
    _array_views._LAYOUT = "_no_such_attribute" if old else "_kvcanary_layout"


records = []
for rep in range(3):
    for name, old in (("numba launch", True), ("raw launch", False)):
        use(old)
        run = Run(quick=False, iters=50, budget=600)
        bench_step.launch_overhead(run)
        bench_step.op_step(run)
        for r in run.records:
            r.update(path=name, rep=rep)
            print({k: r.get(k) for k in ("path", "rep", "op", "variant", "median_us", "p90_us")}, flush=True)
        records += run.records
json.dump(records, open(sys.argv[1], "w"), indent=1)
