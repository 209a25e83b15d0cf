"""Session 3 probe: the verify real-KV kernel before (run 5) and after loading each entry's record ahead
of the fold, plus two variants of the new kernel built by patching its source: launch bounds of 5 blocks
of 256 per SM, and the next tile's slots loaded one tile ahead. Run from the repository root with
`.scratch/verify_run5.py` (kernels/verify.py of commit aec08ee): python3 probe_verify_session3.py out.json"""
import json, sys, types
import numpy as np
import cupy
sys.path.insert(0, ".")
from numba import cuda
from kvcanary_numba import RealKvHashMode
from kvcanary_numba.kernels import verify as K
from kvcanary_numba.launch._launch import compile_kernel
from kvcanary_numba import launch_canary_verify_kernel
from benchmarks.timing import device_times, copy_bandwidth
from benchmarks.workloads import verify_case
from benchmarks.bench_kernels import verify_bytes

def load(name, path, patches=()):
    src = open(path).read()
    for a, b in patches:
        assert a in src, a
        src = src.replace(a, b)
    mod = types.ModuleType("kvcanary_numba.kernels." + name); mod.__package__ = "kvcanary_numba.kernels"
    mod.__file__ = path
    exec(compile(src, path, "exec"), mod.__dict__)
    sys.modules[mod.__name__] = mod
    return mod

PREFETCH = [(
    "        for t in range(int64(tid // WARP_SIZE), (active + _WARP - ONE) // _WARP, warps):\n"
    "            i = t * _WARP + lane\n"
    "            slot = token = position = prev = ZERO\n"
    "            if i < active:\n"
    "                slot = slots[i]\n",
    "        j = int64(tid // WARP_SIZE) * _WARP + lane\n"
    "        next_slot = slots[j] if j < active else ZERO\n"
    "        for t in range(int64(tid // WARP_SIZE), (active + _WARP - ONE) // _WARP, warps):\n"
    "            i = t * _WARP + lane\n"
    "            slot = next_slot\n"
    "            j = i + warps * _WARP\n"
    "            next_slot = slots[j] if j < active else ZERO\n"
    "            token = position = prev = ZERO\n"
    "            if i < active:\n")]
ALL = K.kernel_name(False, 1)
NONE = K.kernel_name(False, 0)
PREFETCH_RUN5 = [(
    "            i = t * _WARP + lane\n"
    "            slot = slots[i] if i < active else ZERO\n",
    "            i = t * _WARP + lane\n"
    "            slot = next_slot\n"
    "            j = i + warps * _WARP\n"
    "            next_slot = slots[j] if j < active else ZERO\n"), (
    "        for t in range(int64(tid // WARP_SIZE), (active + _WARP - ONE) // _WARP, warps):\n",
    "        j = int64(tid // WARP_SIZE) * _WARP + lane\n"
    "        next_slot = slots[j] if j < active else ZERO\n"
    "        for t in range(int64(tid // WARP_SIZE), (active + _WARP - ONE) // _WARP, warps):\n")]
variants = {
    "run5": load("_verify_run5", ".scratch/verify_run5.py").KERNELS,
    "record first": dict(K.KERNELS),
    "record first + bounds 256x5": {ALL: cuda.jit(K.KERNELS[ALL].py_func, launch_bounds=(256, 5))},
    "record first + slot prefetch": load("_verify_pf", "kvcanary_numba/kernels/verify.py", PREFETCH).KERNELS,
    "run5 + slot prefetch": load("_verify_run5_pf", ".scratch/verify_run5.py", PREFETCH_RUN5).KERNELS,
}
_pf = variants["record first + slot prefetch"]
variants["record first + slot prefetch + bounds 256x4"] = {ALL: cuda.jit(_pf[ALL].py_func, launch_bounds=(256, 4))}
variants["record first + bounds 256x4"] = {ALL: cuda.jit(K.KERNELS[ALL].py_func, launch_bounds=(256, 4))}
import os
if os.environ.get("VARIANTS"):  # a later run of the same probe: only the variants named
    variants = {k: v for k, v in variants.items() if k in os.environ["VARIANTS"].split(",")}
copy = copy_bandwidth()["gbps"]
out = {"copy_gbps": copy, "cases": []}
cases = [(RealKvHashMode.ALL, 1 << 22, "contiguous"), (RealKvHashMode.ALL, 1 << 22, "random"),
         (RealKvHashMode.ALL, 1 << 24, "random"), (RealKvHashMode.NONE, 1 << 22, "random"),
         (RealKvHashMode.NONE, 1 << 22, "contiguous")]
if os.environ.get("CASES"):
    cases = cases[: int(os.environ["CASES"])]
for mode, n, layout in cases:
    sets = [verify_case(cupy, entries=n, mode=mode, seed=s, contiguous=layout == "contiguous") for s in range(2)]
    nbytes = verify_bytes(n, mode, read_bytes=128)
    name = ALL if mode == RealKvHashMode.ALL else NONE
    for vname, kernels in variants.items():
        if name not in kernels:
            continue
        saved = K.KERNELS[name]
        K.KERNELS[name] = kernels[name]
        call = lambda i: launch_canary_verify_kernel(context=sets[i % 2][0], plan=sets[i % 2][1], check_verify_expected_token=False)
        res = device_times(call, iters=20, host_us=150)
        K.KERNELS[name] = saved
        rows = sum(int(c.violation_write_index.get()[0]) for c, _, _ in sets)
        rec = {"mode": mode.name, "layout": layout, "entries": n, "variant": vname, "median_us": res["median_us"],
               "rows": rows, "regs": compile_kernel(kernels[name], K.SIGNATURES[name][0]).regs_per_thread,
               "gbps": round(nbytes / res["median_us"] / 1e3, 1)}
        rec["copy_fraction"] = round(rec["gbps"] / copy, 3)
        print(rec, flush=True)
        out["cases"].append(rec)
    del sets
    cupy.get_default_memory_pool().free_all_blocks()
json.dump(out, open(sys.argv[1], "w"), indent=1)
