"""Probe 3 of session 2, as it ran from the repository root (probe 2 was the same with the staged fold
built at TILE_WORDS 8 / 16 / 32): verify fold variants built by patching kernel sources;
`.scratch/verify_old.py` and `.scratch/fp_staged.py` were the kernels of commits 37723c8 and 888d70e."""
import importlib.util, json, sys, types
import numpy as np
import cupy
sys.path.insert(0, ".")
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

from numba import cuda
variants = {"per-lane (before)": load("_verify_old", ".scratch/verify_old.py").KERNELS}
load("_fp_staged", ".scratch/fp_staged.py")
variants["staged"] = load("_v_staged", "kvcanary_numba/kernels/verify.py", [("from .fingerprint import", "from ._fp_staged import")]).KERNELS
variants["hybrid"] = dict(K.KERNELS)
variants["hybrid bounds 256x4"] = {n: cuda.jit(k.py_func, launch_bounds=(256, 4)) for n, k in K.KERNELS.items() if n == K.kernel_name(False, 1)}
entries = 1 << 22
copy = copy_bandwidth()["gbps"]
out = {"copy_gbps": copy, "entries": entries, "cases": []}
for nsrc_bytes in (128, 512):
  for layout in ("contiguous", "random"):
    sets = [verify_case(cupy, entries=entries >> (nsrc_bytes // 256), mode=RealKvHashMode.ALL, bytes_per_token=nsrc_bytes, seed=s,
                        contiguous=layout == "contiguous") for s in range(2)]
    n = entries >> (nsrc_bytes // 256)
    nbytes = verify_bytes(n, RealKvHashMode.ALL, read_bytes=nsrc_bytes)
    for vname, kernels in variants.items():
        for tok in (False,):
            name = K.kernel_name(tok, 1)
            saved = K.KERNELS[name]
            K.KERNELS[name] = kernels[name]
            call = lambda i: launch_canary_verify_kernel(context=sets[i % 2][0], plan=sets[i % 2][1], check_verify_expected_token=tok)
            res = device_times(call, iters=20, host_us=150)
            K.KERNELS[name] = saved
            rows = sum(int(c.violation_write_index.get()[0]) for c, _, _ in sets)
            rec = {"kv_bytes": nsrc_bytes, "layout": layout, "variant": vname, "entries": n, "median_us": res["median_us"], "rows": rows,
                   "regs": compile_kernel(kernels[name], K.SIGNATURES[name][0]).regs_per_thread,
                   "gbps": round(nbytes / res["median_us"] / 1e3, 1)}
            rec["copy_fraction"] = round(rec["gbps"] / copy, 3)
            print(rec, flush=True)
            out["cases"].append(rec)
    del sets
    cupy.get_default_memory_pool().free_all_blocks()
json.dump(out, open(sys.argv[1], "w"), indent=1)
