"""Session 4 probe: the verify real-KV kernel with L2 (or L1) prefetches issued before the fold for what
`_check_entry` loads after it (the slot's record; the plan's positions and predecessors; the next tile's
slots). Prefetches hold no register, unlike the session-3 "record first" change. Variants are built by
patching kernels/verify.py's source. Run from the repository root: python3 probe_verify_prefetch.py out.json"""
import json, os, sys, types
import numpy as np
sys.path.insert(0, ".")
from kvcanary_numba.kernels import verify as K

LOOP = ("            fold = slot != ZERO and uint64(slot) < uint64(num_slots)\n")
REC = LOOP + "            if fold:\n                prefetch_l2(buf, slot)\n"
PLAN = ("            if i < active:\n                prefetch_l2(expected_positions, i)\n"
        "                prefetch_l2(prev_slots, i)\n")
NEXT = ("            if i + warps * _WARP < active:\n                prefetch_l2(slots, i + warps * _WARP)\n")
PREFETCH = '''
from numba import types as _types
from numba.cuda.extending import intrinsic as _intrinsic
from numba.cuda import cgutils as _cgutils
from llvmlite import ir as _ir


@_intrinsic
def prefetch_l2(typingctx, array, index):
    # Ask the cache for the line of array[index] (row index of a 2-D array); nothing is returned.
    sig = _types.void(array, index)

    def codegen(context, builder, signature, args):
        array_type = signature.args[0]
        data = context.make_array(array_type)(context, builder, value=args[0])
        indices = [args[1]] + [_ir.Constant(args[1].type, 0)] * (array_type.ndim - 1)
        pointer = _cgutils.get_item_pointer(context, builder, array_type, data, indices, wraparound=False)
        builder.asm(_ir.FunctionType(_ir.VoidType(), [pointer.type]), "prefetch.global.LEVEL [$0];", "l",
                    [pointer], side_effect=True)
        return context.get_dummy_value()

    return sig, codegen

'''
ANCHOR = "\n@cuda.jit(device=True)\ndef record_violation("
IMPORT = (ANCHOR, PREFETCH.replace("LEVEL", "L2") + ANCHOR)
IMPORT_L1 = (ANCHOR, PREFETCH.replace("LEVEL", "L1") + ANCHOR)
PATCHES = {
    "run6": [],
    "pf record": [IMPORT, (LOOP, REC)],
    "pf record+plan": [IMPORT, (LOOP, REC + PLAN)],
    "pf record+plan+next": [IMPORT, (LOOP, REC + PLAN + NEXT)],
    "pf record L1": [IMPORT_L1, (LOOP, REC)],
}


def load(name, path, patches=()):
    src = open(path).read()
    for a, b in patches:
        assert a in src, a
        src = src.replace(a, b)
    mod = types.ModuleType("kvcanary_numba.kernels." + name); mod.__package__ = "kvcanary_numba.kernels"
    mod.__file__ = path
    sys.modules[mod.__name__] = mod
    exec(compile(src, path, "exec"), mod.__dict__)
    return mod


variants = {name: load("_verify_" + str(n), "kvcanary_numba/kernels/verify.py", p).KERNELS
            for n, (name, p) in enumerate(PATCHES.items())}
ALL, NONE = K.kernel_name(False, 1), K.kernel_name(False, 0)
if os.environ.get("PTX_ONLY"):  # no GPU: registers of the sm_90 build of each variant (ptxas -v)
    import subprocess, re
    from types import SimpleNamespace
    import numba.cuda.dispatcher as dispatcher
    from numba import cuda
    dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=(9, 0))
    for vname, kernels in variants.items():
        ptx, _ = cuda.compile_ptx(kernels[ALL].py_func, K.SIGNATURES[ALL][0], cc=(9, 0))
        open("/tmp/v.ptx", "w").write(re.sub(r"\.version \d+\.\d+", ".version 9.0", ptx))
        info = subprocess.run(["ptxas", "-v", "-arch=sm_90", "/tmp/v.ptx", "-o", "/dev/null"],
                              capture_output=True, text=True).stderr
        print(vname, re.findall(r"Used \d+ registers|\d+ bytes spill \w+", info), ptx.count("prefetch"))
    sys.exit()

import cupy
from kvcanary_numba import RealKvHashMode
from kvcanary_numba.launch._common import compile_kernel
from kvcanary_numba.verify import launch_canary_verify_kernel
from benchmarks.timing import device_times, copy_bandwidth
from benchmarks.workloads import verify_case
from benchmarks.bench_kernels import verify_bytes
from benchmarks import ceiling

copy = copy_bandwidth()["gbps"]
out = {"copy_gbps": copy, "cases": []}
cases = [(1 << 22, "contiguous"), (1 << 22, "random"), (1 << 24, "random"), (1 << 24, "contiguous")]
for n, layout in cases:
    sets = [verify_case(cupy, entries=n, mode=RealKvHashMode.ALL, seed=s, contiguous=layout == "contiguous")
            for s in range(2)]
    nbytes = verify_bytes(n, RealKvHashMode.ALL, read_bytes=128)
    res = device_times(lambda i: ceiling.verify_loads(sets[i % 2][0], sets[i % 2][1], n), iters=20, host_us=150)
    ceiling_us = res["median_us"]
    out["cases"].append({"layout": layout, "entries": n, "variant": "pure loads", "median_us": ceiling_us})
    print(out["cases"][-1], flush=True)
    for rep in range(2):  # two passes: run-to-run spread within one process
        for vname, kernels in variants.items():
            saved = K.KERNELS[ALL]
            K.KERNELS[ALL] = kernels[ALL]
            call = lambda i: launch_canary_verify_kernel(context=sets[i % 2][0], plan=sets[i % 2][1],
                                                         check_verify_expected_token=False)
            res = device_times(call, iters=20, host_us=150)
            K.KERNELS[ALL] = saved
            rows = sum(int(c.violation_write_index.get()[0]) for c, _, _ in sets)
            rec = {"layout": layout, "entries": n, "variant": vname, "pass": rep, "median_us": res["median_us"],
                   "rows": rows, "regs": compile_kernel(kernels[ALL], K.SIGNATURES[ALL][0]).regs_per_thread,
                   "copy_fraction": round(nbytes / res["median_us"] / 1e3 / copy, 3),
                   "load_ceiling_fraction": round(ceiling_us / res["median_us"], 3)}
            print(rec, flush=True)
            out["cases"].append(rec)
    del sets
    cupy.get_default_memory_pool().free_all_blocks()
json.dump(out, open(sys.argv[1], "w"), indent=1)
