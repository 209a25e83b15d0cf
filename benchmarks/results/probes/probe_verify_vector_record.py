"""Session 4 probe: the verify kernels reading each record (and the predecessor's chain fields) as two
16-byte vector loads instead of four (three) 8-byte loads: fewer memory instructions per entry for the
same lines. Assumes 16-byte aligned records (the benchmark's stride is 32 bytes). Variants are built by
patching kernels/verify.py's source. Run from the repository root: python3 probe_verify_vector_record.py out.json"""
import json, os, sys, types
import numpy as np
sys.path.insert(0, ".")
from kvcanary_numba.kernels import verify as K

PAIR = '''
from numba import types as _types
from numba.cuda.extending import intrinsic as _intrinsic
from numba.cuda import cgutils as _cgutils
from llvmlite import ir as _ir


@_intrinsic
def record_pair(typingctx, buf, row, col):
    sig = _types.UniTuple(_types.int64, 2)(buf, row, col)

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, value=args[0])
        ptr = _cgutils.get_item_pointer(context, builder, signature.args[0], data, [args[1], args[2]], wraparound=False)
        vec_type = _ir.VectorType(_ir.IntType(64), 2)
        vec = builder.load(builder.bitcast(ptr, vec_type.as_pointer()), align=16)
        lo = builder.extract_element(vec, _ir.Constant(_ir.IntType(32), 0))
        hi = builder.extract_element(vec, _ir.Constant(_ir.IntType(32), 1))
        return context.make_tuple(builder, signature.return_type, (lo, hi))

    return sig, codegen


@cuda.jit(device=True)
def _vector_slot_hash(buf, slot):
    token, position = record_pair(buf, slot, ZERO)
    prev_hash, _unused = record_pair(buf, slot, PREV_HASH)
    return mix3(uint64(prev_hash), uint64(token), uint64(position))

'''
ANCHOR = "\n@cuda.jit(device=True)\ndef record_violation("
IMPORT = ("from .hashing import CHAIN_HEAD, MINUS_ONE, ONE, POSITION, PREV_HASH, REAL_KV, TOKEN, ZERO, slot_hash",
          "from .hashing import CHAIN_HEAD, MINUS_ONE, ONE, POSITION, PREV_HASH, REAL_KV, TOKEN, ZERO, slot_hash, mix3")
OWN = ("    stored_token = buf[slot, TOKEN]\n    stored_position = buf[slot, POSITION]\n"
       "    stored_hash = buf[slot, PREV_HASH]\n    stored_real = buf[slot, REAL_KV]\n",
       "    stored_token, stored_position = record_pair(buf, slot, TOKEN)\n"
       "    stored_hash, stored_real = record_pair(buf, slot, PREV_HASH)\n")
PREV = ("        aux = int64(slot_hash(buf, prev))\n", "        aux = int64(_vector_slot_hash(buf, prev))\n")
BASE = [IMPORT, (ANCHOR, PAIR + ANCHOR)]
PATCHES = {"run6": [], "vector record": BASE + [OWN], "vector record + prev": BASE + [OWN, PREV]}


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


variants = {name: load("_verify_vec" + str(n), "kvcanary_numba/kernels/verify.py", p).KERNELS
            for n, (name, p) in enumerate(PATCHES.items())}
ALL, NONE = K.kernel_name(False, 1), K.kernel_name(False, 0)
if os.environ.get("PTX_ONLY"):  # no GPU: registers of the sm_90 build of each variant (ptxas -v)
    import subprocess, re
    from types import SimpleNamespace
    import numba.cuda.dispatcher as dispatcher
    from numba import cuda
    dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=(9, 0))
    for vname, kernels in variants.items():
        for name in (NONE, ALL):
            ptx, _ = cuda.compile_ptx(kernels[name].py_func, K.SIGNATURES[name][0], cc=(9, 0))
            open("/tmp/v.ptx", "w").write(re.sub(r"\.version \d+\.\d+", ".version 9.0", ptx))
            info = subprocess.run(["ptxas", "-v", "-arch=sm_90", "/tmp/v.ptx", "-o", "/dev/null"],
                                  capture_output=True, text=True).stderr
            print(vname, name, re.findall(r"Used \d+ registers|\d+ bytes spill \w+", info), ptx.count("ld.global.v2"))
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
cases = [(m, n, layout) for m in (RealKvHashMode.ALL, RealKvHashMode.NONE)
         for n, layout in [(1 << 22, "contiguous"), (1 << 22, "random"), (1 << 24, "random"), (1 << 24, "contiguous")]]
for mode, n, layout in cases:
    name = ALL if mode == RealKvHashMode.ALL else NONE
    sets = [verify_case(cupy, entries=n, mode=mode, seed=s, contiguous=layout == "contiguous") for s in range(2)]
    nbytes = verify_bytes(n, mode, read_bytes=128)
    res = device_times(lambda i: ceiling.verify_loads(sets[i % 2][0], sets[i % 2][1], n), iters=20, host_us=150)
    ceiling_us = res["median_us"]
    out["cases"].append({"mode": mode.name, "layout": layout, "entries": n, "variant": "pure loads", "median_us": ceiling_us})
    print(out["cases"][-1], flush=True)
    for rep in range(2):  # two passes: run-to-run spread within one process
        for vname, kernels in variants.items():
            saved = K.KERNELS[name]
            K.KERNELS[name] = kernels[name]
            call = lambda i: launch_canary_verify_kernel(context=sets[i % 2][0], plan=sets[i % 2][1],
                                                         check_verify_expected_token=False)
            res = device_times(call, iters=20, host_us=150)
            K.KERNELS[name] = saved
            rows = sum(int(c.violation_write_index.get()[0]) for c, _, _ in sets)
            rec = {"mode": mode.name, "layout": layout, "entries": n, "variant": vname, "pass": rep,
                   "median_us": res["median_us"], "rows": rows,
                   "regs": compile_kernel(kernels[name], K.SIGNATURES[name][0]).regs_per_thread,
                   "copy_fraction": round(nbytes / res["median_us"] / 1e3 / copy, 3),
                   "load_ceiling_fraction": round(ceiling_us / res["median_us"], 3)}
            print(rec, flush=True)
            out["cases"].append(rec)
    del sets
    cupy.get_default_memory_pool().free_all_blocks()
json.dump(out, open(sys.argv[1], "w"), indent=1)
