"""Every kernel of every ``kvcanary_numba/kernels/*.py`` and ``kvcanary_numba/fast/kernels/*.py``
module compiles for sm_90.

The CUDA simulator runs kernels as Python and accepts code a real GPU build
rejects (e.g. 64-bit warp shuffles, mixed-signedness promotions), so each
module is compiled with ``cuda.compile_ptx(..., cc=(9, 0))`` in a subprocess
without the simulator; no GPU is needed. A kernel without a declared signature
(the ``KERNELS`` / ``SIGNATURES`` convention of :mod:`kvcanary_numba.kernels`)
fails. For the canary kernels the PTX is also checked for what their speed
relies on: 16-byte vector loads of real-KV bytes, no calls, no local memory,
(where nvJitLink is installed) no register spills in the sm_90 build, and no
staging tile in the moved-records builds that fold no real-KV bytes.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

import kvcanary_numba

PACKAGE_DIR = pathlib.Path(kvcanary_numba.__file__).parent
#: The kernel modules, as dotted names below ``kvcanary_numba``: the core's and the fast wing's.
MODULES = sorted(
    f"{package}.{p.stem}"
    for package in ("kernels", "fast.kernels")
    for p in (PACKAGE_DIR / package.replace(".", "/")).glob("*.py")
    if p.stem != "__init__"
)
#: Modules whose PTX must be call-free and stack-free, and vector-load real-KV bytes.
CANARY_MODULES = (
    "fast.kernels.endpoints",
    "fast.kernels.write_shared",
    "kernels.fingerprint",
    "kernels.move",
    "kernels.records",
    "kernels.verify",
    "kernels.write",
)
#: Modules whose PTX must be call-free and stack-free and whose sm_90 build must not spill (the tiled writes:
#: 16 warps x 1 entry per thread, one block per SM at their 76-112 registers).
SPILL_FREE_MODULES = CANARY_MODULES + ("fast.kernels.tiled_endpoints", "fast.kernels.write_tiled", "kernels.digest")

SCRIPT = r"""
import importlib, json, re, sys
from types import SimpleNamespace

import numba.cuda.dispatcher as dispatcher

# Device functions ask the current device for its compute capability; there is
# no device here, and the target is fixed anyway.
dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=(9, 0))

from numba import cuda
from kvcanary_numba.kernels import is_kernel

module = importlib.import_module("kvcanary_numba." + sys.argv[1])
kernels = getattr(module, "KERNELS", {})
signatures = getattr(module, "SIGNATURES", {})
declared = {id(k) for k in kernels.values()}
report = {
    "undeclared": sorted(n for n, obj in vars(module).items() if is_kernel(obj) and id(obj) not in declared),
    "unsigned": sorted(n for n in kernels if not signatures.get(n)),
    "unknown": sorted(set(signatures) - set(kernels)),
    "ptx": {},
}


def sass_spills(ptx):
    # Spill bytes of the sm_90 build (nvJitLink ships with numba-cuda[cu13]); None if unavailable.
    try:
        import re
        from cuda.bindings import nvjitlink
    except ImportError:
        return None
    data = ptx.encode()
    options = ["-arch=sm_90", "-verbose"]
    handle = nvjitlink.create(len(options), options)
    nvjitlink.add_data(handle, nvjitlink.InputType.PTX, data, len(data), "kernel.ptx")
    nvjitlink.complete(handle)
    log = bytearray(nvjitlink.get_info_log_size(handle))
    nvjitlink.get_info_log(handle, log)
    nvjitlink.destroy(handle)
    return sum(int(n) for n in re.findall(r"(\d+) bytes spill stores", log.decode(errors="replace")))


for name, kernel in kernels.items():
    for signature in signatures.get(name, ()):
        bounds = kernel.targetoptions.get("launch_bounds")
        ptx, _ = cuda.compile_ptx(kernel.py_func, signature, cc=(9, 0), launch_bounds=bounds)
        body = ptx[ptx.index(".entry"):]
        report["ptx"][name] = {
            "target": "sm_90" in ptx,
            "v2_loads": body.count("v2.u64"),
            "calls": body.count("call"),
            "local": body.count(".local"),
            # Bytes of static shared arrays, declared at module scope: ".shared .align A .b8 name[BYTES];".
            "shared": sum(int(n) for n in re.findall(r"\.shared\s+\.align\s+\d+\s+\.b8\s+\w+\[(\d+)\]", ptx)),
            "spills": sass_spills(ptx) if sys.argv[2] == "1" else None,
        }
print(json.dumps(report))
"""

_running: dict[str, subprocess.Popen] = {}


def _start_all() -> None:
    # One process per module, all started at once: compiling is CPU bound and slow.
    if _running:
        return
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    for module in MODULES:
        _running[module] = subprocess.Popen(
            [sys.executable, "-c", SCRIPT, module, str(int(module in SPILL_FREE_MODULES))],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )


def _report(module: str) -> dict:
    _start_all()
    out, err = _running[module].communicate(timeout=900)
    assert _running[module].returncode == 0, f"compiling {module} failed:\n{err[-4000:]}"
    return json.loads(out.strip().splitlines()[-1])


def test_every_kernels_module_is_checked():
    core = {"kernels.fingerprint", "kernels.hashing", "kernels.verify", "kernels.write", "kernels.write_chunk"}
    core |= {"kernels.move", "kernels.records", "kernels.digest"}
    fast = {
        "fast.kernels.endpoints",
        "fast.kernels.share",
        "fast.kernels.tiled_endpoints",
        "fast.kernels.write_shared",
        "fast.kernels.write_tiled",
    }
    assert core | fast <= set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_every_kernel_has_a_signature_and_compiles_for_sm90(module):
    report = _report(module)
    assert report["undeclared"] == [], "kernels missing from KERNELS"
    assert report["unsigned"] == [], "kernels without SIGNATURES"
    assert report["unknown"] == [], "SIGNATURES for unknown kernels"
    assert all(entry["target"] for entry in report["ptx"].values())
    if module in SPILL_FREE_MODULES:
        assert report["ptx"], "no kernels compiled"
        for name, entry in report["ptx"].items():
            assert entry["calls"] == 0 and entry["local"] == 0 and not entry["spills"], (name, entry)
    if module in CANARY_MODULES:
        for name, entry in report["ptx"].items():
            folds = not name.endswith("_src0")
            assert (entry["v2_loads"] > 0) == folds, (name, entry)


#: The moved-records modules whose builds stage real-KV bytes through a shared tile (``staging_shapes``).
STAGING_MODULES = ("kernels.move", "kernels.records", "kernels.digest")


def _tile_bytes() -> int:
    # One uint64 row of TILE_PITCH words per thread of a moves block.
    from kvcanary_numba.kernels.fingerprint import TILE_PITCH
    from kvcanary_numba.kernels.move import MOVE_THREADS

    return 8 * MOVE_THREADS * TILE_PITCH


@pytest.mark.parametrize("module", STAGING_MODULES)
def test_only_builds_that_fold_kv_declare_a_staging_tile(module):
    # A tile in a src0 build costs occupancy (fewer blocks per SM) for bytes it never reads.
    report = _report(module)
    families: dict[str, dict[int, int]] = {}
    for name, entry in report["ptx"].items():
        family, _, nsrc = name.rpartition("_src")
        if family and nsrc.isdigit():
            families.setdefault(family, {})[int(nsrc)] = entry["shared"]
    assert families, "no _src{n} builds compiled"
    for family, shared in families.items():
        assert shared[0] < _tile_bytes(), (family, shared)
        for nsrc, bytes_ in shared.items():
            assert nsrc == 0 or bytes_ >= _tile_bytes(), (family, nsrc, shared)
