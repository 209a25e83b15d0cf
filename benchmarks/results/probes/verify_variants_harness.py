"""Shared harness of the session-4 verify probes: kernel variants built by patching kernels/verify.py's
source, their sm_90 register counts without a GPU, and their times beside the load ceiling on a GPU.
(The session-4 JSONs were written by this same loop when it was still inlined in each probe.)"""
import json, os, re, subprocess, sys, types

sys.path.insert(0, ".")
from kvcanary_numba.kernels import verify as K

VERIFY_SOURCE = "kvcanary_numba/kernels/verify.py"
ALL, NONE = K.kernel_name(False, 1), K.kernel_name(False, 0)


def load_patched(name, patches=(), path=VERIFY_SOURCE):
    """The module at ``path`` with each (old, new) text replacement applied, as kvcanary_numba.kernels.<name>."""
    src = open(path).read()
    for old, new in patches:
        assert old in src, old
        src = src.replace(old, new)
    mod = types.ModuleType("kvcanary_numba.kernels." + name)
    mod.__package__, mod.__file__ = "kvcanary_numba.kernels", path
    sys.modules[mod.__name__] = mod
    exec(compile(src, path, "exec"), mod.__dict__)
    return mod


def variants_of(patch_sets):
    """name -> the KERNELS dict of verify.py patched with that name's patches."""
    return {name: load_patched(f"_verify_variant{n}", p).KERNELS for n, (name, p) in enumerate(patch_sets.items())}


def print_registers(variants, names):
    """ptxas -v of each variant's kernels (no GPU; the local ptxas may be older: the PTX version is lowered)."""
    from types import SimpleNamespace
    import numba.cuda.dispatcher as dispatcher
    from numba import cuda

    dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=(9, 0))
    for vname, kernels in variants.items():
        for name in names:
            ptx, _ = cuda.compile_ptx(kernels[name].py_func, K.SIGNATURES[name][0], cc=(9, 0))
            open("/tmp/v.ptx", "w").write(re.sub(r"\.version \d+\.\d+", ".version 9.0", ptx))
            info = subprocess.run(["ptxas", "-v", "-arch=sm_90", "/tmp/v.ptx", "-o", "/dev/null"],
                                  capture_output=True, text=True).stderr
            print(vname, name, re.findall(r"Used \d+ registers|\d+ bytes spill \w+", info),
                  "prefetch:", ptx.count("prefetch"), "ld.global.v2:", ptx.count("ld.global.v2"))


def time_variants(variants, modes, out_path, passes=2):
    """Median device time of every variant on 4 M / 16 M entries, random and contiguous slots, beside the
    pure-load kernel of benchmarks/ceiling.py; writes JSON to ``out_path``."""
    import cupy
    from kvcanary_numba import RealKvHashMode
    from kvcanary_numba.launch._launch import compile_kernel
    from kvcanary_numba import launch_canary_verify_kernel
    from benchmarks import ceiling
    from benchmarks.bench_kernels import verify_bytes
    from benchmarks.timing import copy_bandwidth, device_times
    from benchmarks.workloads import verify_case

    copy = copy_bandwidth()["gbps"]
    out = {"copy_gbps": copy, "cases": []}
    shapes = [(1 << 22, "contiguous"), (1 << 22, "random"), (1 << 24, "random"), (1 << 24, "contiguous")]
    for mode in modes:
        name = ALL if mode == RealKvHashMode.ALL else NONE
        for n, layout in shapes:
            sets = [verify_case(cupy, entries=n, mode=mode, seed=s, contiguous=layout == "contiguous")
                    for s in range(2)]
            nbytes = verify_bytes(n, mode, read_bytes=128)
            ceiling_us = device_times(lambda i: ceiling.verify_loads(sets[i % 2][0], sets[i % 2][1], n),
                                      iters=20, host_us=150)["median_us"]
            base = {"mode": mode.name, "layout": layout, "entries": n}
            out["cases"].append({**base, "variant": "pure loads", "median_us": ceiling_us})
            print(out["cases"][-1], flush=True)
            for rep in range(passes):  # run-to-run spread within one process
                for vname, kernels in variants.items():
                    saved, K.KERNELS[name] = K.KERNELS[name], kernels[name]
                    call = lambda i: launch_canary_verify_kernel(context=sets[i % 2][0], plan=sets[i % 2][1],
                                                                 check_verify_expected_token=False)
                    res = device_times(call, iters=20, host_us=150)
                    K.KERNELS[name] = saved
                    rows = sum(int(c.violation_write_index.get()[0]) for c, _, _ in sets)
                    rec = {**base, "variant": vname, "pass": rep, "median_us": res["median_us"], "rows": rows,
                           "regs": compile_kernel(kernels[name], K.SIGNATURES[name][0]).regs_per_thread,
                           "copy_fraction": round(nbytes / res["median_us"] / 1e3 / copy, 3),
                           "load_ceiling_fraction": round(ceiling_us / res["median_us"], 3)}
                    print(rec, flush=True)
                    out["cases"].append(rec)
            del sets
            cupy.get_default_memory_pool().free_all_blocks()
    json.dump(out, open(out_path, "w"), indent=1)


def main(patch_sets, names, modes):
    """PTX_ONLY=1: registers only (no GPU); otherwise time the variants into sys.argv[1]."""
    variants = variants_of(patch_sets)
    if os.environ.get("PTX_ONLY"):
        print_registers(variants, names)
    else:
        time_variants(variants, modes, sys.argv[1])
