"""Probe: entries per lane of the plan entries kernel's tiles (2 / 4 / 8), whole plan device time."""
import json, sys, types
import numpy as np, cupy
sys.path.insert(0, ".")
from kvcanary_numba.launch import plan as glue
from kvcanary_numba import launch_canary_plan_kernels
from benchmarks.timing import device_times
from benchmarks.workloads import plan_case

src = open("kvcanary_numba/kernels/plan.py").read()
mods = {}
for per_lane in (2, 4, 8):
    text = src.replace("ENTRIES_PER_TILE = 8 * WARP_SIZE", f"ENTRIES_PER_TILE = {per_lane} * WARP_SIZE")
    m = types.ModuleType(f"kvcanary_numba.kernels._plan{per_lane}"); m.__package__ = "kvcanary_numba.kernels"
    exec(compile(text, "plan.py", "exec"), m.__dict__); mods[per_lane] = m
new = glue.kernels
out = []
for bs in (256, 4096, 16384, 65536):
    sets = [plan_case(cupy, bs=bs, prefix=128, seed=s) for s in range(4)]
    for per_lane, mod in mods.items():
        glue.kernels = mod
        res = device_times(lambda i: launch_canary_plan_kernels(**sets[i % 4]), iters=30, host_us=300)
        v = sets[0]["verify_plan_out"]
        ok = int(v.verify_num_valid.get()[0]) == bs * 128 and bool((v.verify_slot_indices[:bs*128].get() > 0).all())
        rec = {"bs": bs, "entries_per_lane": per_lane, "whole_us": res["median_us"], "p90_us": res["p90_us"], "ok": ok}
        print(rec, flush=True); out.append(rec)
    glue.kernels = new
json.dump(out, open(sys.argv[1], "w"), indent=1)
