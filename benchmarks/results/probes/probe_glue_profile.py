"""Session 4 probe: where the launch glue's host time goes (cProfile of the verify glue, and timings of
the pieces each call repeats). Run from the repository root: python3 probe_glue_profile.py out.txt"""
import cProfile, io, pstats, sys, time
import numpy as np
sys.path.insert(0, ".")
import cupy
from kvcanary_numba import RealKvHashMode
from kvcanary_numba.launch import _common, verify as glue
from benchmarks.workloads import verify_case

lines = []
for mode in (RealKvHashMode.NONE, RealKvHashMode.ALL):
    ctx, plan, _ = verify_case(cupy, entries=1024, mode=mode)
    plan.enable[...] = 0
    call = lambda: glue.launch_canary_verify_kernel(context=ctx, plan=plan, check_verify_expected_token=False)
    for _ in range(200):
        call()
    cupy.cuda.Device().synchronize()
    t = time.perf_counter()
    for _ in range(2000):
        call()
    lines.append(f"{mode.name}: glue {1e6 * (time.perf_counter() - t) / 2000:.1f} us/call")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(2000):
        call()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
    lines.append(s.getvalue())
view = _common.kernel_array(plan.verify_slot_indices, persistent=True)
for name, fn in {"array_layout(cupy)": lambda: _common.array_layout(plan.verify_slot_indices),
                 "array_layout(numba view)": lambda: _common.array_layout(view),
                 "kernel_array(persistent hit)": lambda: _common.kernel_array(plan.verify_slot_indices, persistent=True),
                 "view.__cuda_array_interface__": lambda: view.__cuda_array_interface__,
                 "current stream ptr": lambda: _common._current_stream_ptr()}.items():
    t = time.perf_counter()
    for _ in range(20000):
        fn()
    lines.append(f"{name}: {1e6 * (time.perf_counter() - t) / 20000:.2f} us")
open(sys.argv[1], "w").write("\n".join(lines))
print("\n".join(lines))
