"""The shared bad-input fuzz harness on CuPy arrays, for a GPU under compute-sanitizer memcheck.

Run from the repository root on a machine with a GPU and CuPy (the harness lives
beside the clone, in ``../shared/tools``; copy it along to the device)::

    compute-sanitizer --tool memcheck --error-exitcode 3 \\
        python benchmarks/fuzz_cuda.py --n 300 --seed 1 --json gpu-out/fuzz-cuda.json

The harness generates each case as NumPy code (its simulator flavour: small
sizes, ``backend="cuda"``). Here every public launch function the cases call is
wrapped: each NumPy array argument (inside plans, contexts and sources too) is
copied to a CuPy array of the same dtype, shape, strides and address alignment
(a read-only one is passed as a read-only ``__cuda_array_interface__``), the real
function runs on the GPU, and afterwards every writeable array is copied back.
So the harness's snapshots (PARTIAL_WRITE) and pure-Python oracles (WRONG)
judge the device run unchanged, and memcheck sees every out-of-bounds access.
Only the function targets run (monitor, engine and constructor scenarios build
host arrays inside the harness); cases run in this process, one after another.

Exit status: the harness's (0 only without OTHER / HANG / CRASH / PARTIAL_WRITE /
WRONG); Python's own call-signature TypeErrors are reported, not counted.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import importlib.util
import json
import os
import pathlib
import sys
import time

import numpy as np
from numpy.lib.array_utils import byte_bounds

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_HARNESS = ROOT.parent / "shared" / "tools" / "fuzz_bad_inputs.py"
WRAPPED = (
    "compute_real_kv_hash",
    "launch_canary_plan_kernels",
    "launch_canary_verify_kernel",
    "launch_canary_write_kernel",
    "launch_plan_offsets_kernel",
    "scatter_req_token_ids",
)


class ReadOnlyDevice:
    """A CuPy array's memory exposed read-only through ``__cuda_array_interface__``."""

    def __init__(self, array):
        self._array = array  # keeps the memory alive
        self.shape, self.dtype = array.shape, array.dtype
        cai = dict(array.__cuda_array_interface__)
        cai["data"] = (cai["data"][0], True)
        self.__cuda_array_interface__ = cai


class Mover:
    """Copies the NumPy arrays of one call's arguments to the GPU and the results back."""

    def __init__(self, cupy):
        self.cp, self.moved = cupy, {}

    def device(self, host: np.ndarray):
        """A CuPy array with ``host``'s layout, holding its bytes (same address mod 256)."""
        hit = self.moved.get(id(host))
        if hit is not None:
            return hit[1]
        if host.size == 0:
            dev = self.cp.zeros(host.shape, host.dtype)
        else:
            low, high = byte_bounds(host)
            raw = np.frombuffer((ctypes.c_uint8 * (high - low)).from_address(low), dtype=np.uint8)
            shift = low % 256  # keep the misalignment the case may have planted
            buf = self.cp.zeros(high - low + shift, dtype=np.uint8)
            buf[shift:] = self.cp.asarray(raw)
            ptr = buf.data + shift + (host.ctypes.data - low)
            dev = self.cp.ndarray(host.shape, host.dtype, memptr=ptr, strides=host.strides)
        arg = dev if host.flags.writeable else ReadOnlyDevice(dev)
        self.moved[id(host)] = (host, arg, dev)
        return arg

    def convert(self, value):
        if isinstance(value, np.ndarray) and value.dtype != object:
            return self.device(value)
        if isinstance(value, (list, tuple)):
            return type(value)(self.convert(v) for v in value)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            changes = {f.name: self.convert(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
            return dataclasses.replace(value, **changes)
        return value

    def copy_back(self) -> None:
        for host, _, dev in self.moved.values():
            if host.flags.writeable and host.size:
                host[...] = self.cp.asnumpy(dev)


def on_device(function, cupy):
    def call(**kwargs):
        mover = Mover(cupy)
        try:
            moved = {k: mover.convert(v) for k, v in kwargs.items()}
        except Exception:  # noqa: BLE001 - a value the real call must judge (e.g. a bad dataclass field)
            return function(**kwargs)
        try:
            return function(**moved)
        finally:
            cupy.cuda.runtime.deviceSynchronize()
            mover.copy_back()

    call.__name__ = function.__name__
    return call


def load_harness(path: pathlib.Path):
    spec = importlib.util.spec_from_file_location("fuzz_bad_inputs", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_bad_inputs"] = module
    spec.loader.exec_module(module)
    return module


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--harness", type=pathlib.Path, default=DEFAULT_HARNESS)
    p.add_argument("--n", type=int, default=300, help="cases drawn (non-function targets are skipped)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", type=pathlib.Path, help="write every case record here")
    p.add_argument("--repro", action="store_true")
    args = p.parse_args(argv)
    if not args.harness.is_file():
        print(f"skipped: harness not found ({args.harness})")
        return 0
    os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
    import cupy

    fuzz = load_harness(args.harness)
    fuzz.init_namespace("sim")  # the simulator flavour: small cases, backend="cuda"
    for name in WRAPPED:
        fuzz.BASE_NS[name] = on_device(fuzz.BASE_NS[name], cupy)
    clock = fuzz.CompileClock()  # the harness's HANG limit excludes Numba compilation
    records, t0 = [], time.time()
    for index in range(args.n):
        spec, _ = fuzz.build_case(args.seed, index, "sim")
        if spec.kind != "func":
            continue
        records.append(fuzz.run_case(args.seed, index, "sim", clock=clock))
    print(
        f"{len(records)} function cases of {args.n} in {time.time() - t0:.0f} s on "
        f"{cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(records, default=str))
    summary = argparse.Namespace(
        backend="cuda", seed=args.seed, base_only=False, lenient_signature=True, repro=args.repro
    )
    return fuzz.summarize(records, summary)


if __name__ == "__main__":
    sys.exit(main())
