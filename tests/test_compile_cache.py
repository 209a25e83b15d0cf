"""The CPU path's compiled loops (``numba.njit``) are cached on disk: a second process loads
every one it uses and compiles none; a loop compiled twice (parallel and on one thread) keeps
two cache files, so neither form loads the other's code."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numba
import pytest
from numba.core.registry import CPUDispatcher

from kvcanary_numba import _overlap, hashing
from kvcanary_numba._jit import cpu_jit
from kvcanary_numba.fast import native as _native
from kvcanary_numba.fast.cpu import fingerprint, plan_loop, verify, write

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODULES = (hashing, _overlap, _native, plan_loop, verify, fingerprint, write)

#: A NumPy plan, write, and verifies small (one thread) and large (parallel, its folds too);
#: prints {dispatcher: [cache hits, cache misses]} of the dispatchers that ran.
_SCRIPT = """
import json, sys
sys.path.insert(0, {root!r})
import numpy as np
from numba.core.registry import CPUDispatcher
from benchmarks.bench_public import _calls, _step
from benchmarks.workloads import verify_case
from kvcanary_numba import RealKvHashMode, launch_canary_verify_kernel
from kvcanary_numba import _overlap, hashing
from kvcanary_numba.fast.cpu import fingerprint, plan_loop, verify, write

for call in _calls(*_step(np, 2, 3)).values():
    call(0)
for entries in (8, 3 * verify._CHUNK):
    ctx, plan, _ = verify_case(np, entries=entries, mode=RealKvHashMode.ALL)
    launch_canary_verify_kernel(context=ctx, plan=plan, check_verify_expected_token=False)
stats = {{}}
for module in (hashing, _overlap, plan_loop, verify, fingerprint, write):
    for name, obj in vars(module).items():
        if isinstance(obj, CPUDispatcher) and (obj.stats.cache_hits or obj.stats.cache_misses):
            stats[module.__name__ + "." + name] = [sum(obj.stats.cache_hits.values()),
                                                   sum(obj.stats.cache_misses.values())]
print(json.dumps(stats))
"""


def _dispatchers():
    return [(f"{m.__name__}.{n}", d) for m in MODULES for n, d in vars(m).items() if isinstance(d, CPUDispatcher)]


def test_every_compiled_cpu_loop_is_cached_on_disk():
    names = [name for name, d in _dispatchers() if type(d._cache).__name__ != "FunctionCache"]
    assert not names, f"njit without cache=True: {names}"


@pytest.mark.parametrize(
    ("parallel", "serial"),
    [
        (verify._check_entries, verify._check_entries_serial),
        (fingerprint._fold_source_into, fingerprint._fold_source_serial),
    ],
)
def test_the_two_forms_of_a_loop_keep_cache_files_of_their_own(parallel, serial):
    assert parallel.py_func.__code__ is serial.py_func.__code__  # the same loop ...
    assert parallel.targetoptions.get("parallel") and not serial.targetoptions.get("parallel")
    assert parallel._cache._cache_file._index_name != serial._cache._cache_file._index_name  # ... two files


def _double(x):
    return 2 * x


def test_without_a_writable_cache_location_loops_compile_per_process(monkeypatch):
    # Numba refuses cache=True when no locator finds a writable directory (a read-only install
    # without a home cache); the import must not fail.
    from numba.core import caching

    monkeypatch.setattr(caching.CacheImpl, "_locator_classes", [])
    with pytest.raises(RuntimeError, match="no locator available"):
        numba.njit(cache=True)(_double)
    compiled = cpu_jit(nogil=True)(_double)
    assert compiled(21) == 42 and type(compiled._cache).__name__ == "NullCache"


def test_a_second_process_compiles_nothing(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}  # a cache of this test's own

    def run() -> dict:
        proc = subprocess.run(
            [sys.executable, "-c", _SCRIPT.format(root=str(ROOT))],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.splitlines()[-1])

    first, second = run(), run()
    assert first and all(misses for _, misses in first.values())  # compiled, and written to the cache
    for name in (
        "verify._check_entries",
        "verify._check_entries_serial",
        "fingerprint._fold_source_into",
        "fingerprint._fold_source_serial",
        "plan_loop._plan",
    ):
        assert f"kvcanary_numba.fast.cpu.{name}" in second
    assert {name: misses for name, (_, misses) in second.items() if misses} == {}
    assert all(hits for hits, _ in second.values())
