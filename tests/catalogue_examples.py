"""The names the error catalogue's examples run with (``tests/test_errors_catalogue.py`` executes them).

Each "Before" / "After" snippet of ``kvcanary_numba/errors/*.py`` runs as written,
on the CPU, in a fresh namespace from :func:`example_scope`: NumPy as ``np`` and
``xp`` (the array module: CuPy on a GPU), the public API, a small valid step
(``ctx``, ``vplan``, ``wplan``, ``req_to_token``, ...), and ``*_args(**changes)``
helpers that return the keyword arguments of a valid call with ``changes``
applied, so a snippet shows only the argument it is about.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import tempfile
import warnings

import numpy as np

import kvcanary_numba as kc
from kvcanary_numba.engine import EngineConfig, ToyEngine
from kvcanary_numba.monitor import CanaryBlindSpotWarning, CanaryMonitor, KvGroup, SlotChain, StepBatch, VerifyBudget

#: Slots of the example pool, request rows and columns of its req_to_token, bytes per KV row.
NUM_SLOTS, ROWS, WIDTH, KV_BYTES = 64, 4, 16, 256


def _i64(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


class GpuArray:
    """Stands in for a CuPy array: exposes ``__cuda_array_interface__`` over host memory.

    Only for examples that are rejected before any launch (KVC-C007: arrays on
    different devices); nothing ever reads through the pointer.
    """

    def __init__(self, array: np.ndarray):
        self._array = np.ascontiguousarray(array)
        self.shape, self.dtype = self._array.shape, self._array.dtype
        self.__cuda_array_interface__ = {
            "shape": self._array.shape,
            "typestr": self._array.dtype.str,
            "strides": None,
            "data": (self._array.ctypes.data, False),
            "version": 3,
        }


def example_scope(workdir: pathlib.Path) -> dict:
    """A fresh namespace for one snippet; ``workdir`` holds the files a snippet reads (``buf.npy``)."""
    ns: dict = {name: getattr(kc, name) for name in kc.__all__}
    ns.update(
        np=np,
        xp=np,
        gpu_array=GpuArray,
        EngineConfig=EngineConfig,
        ToyEngine=ToyEngine,
        CanaryMonitor=CanaryMonitor,
        KvGroup=KvGroup,
        SlotChain=SlotChain,
        StepBatch=StepBatch,
        VerifyBudget=VerifyBudget,
    )
    k_layer0 = np.zeros((NUM_SLOTS, KV_BYTES), dtype=np.uint8)
    source = kc.RealKvSource(tensor=k_layer0, page_size=1, num_bytes_per_token=KV_BYTES, read_bytes=KV_BYTES)
    req_to_token = np.zeros((ROWS, WIDTH), dtype=np.int32)
    req_to_token[1, :8] = np.arange(10, 18)  # request row 1 owns slots 10..17
    ctx = kc.CanaryContext.allocate(num_slots=NUM_SLOTS)
    vplan = kc.VerifyPlan.allocate(verify_capacity=NUM_SLOTS)
    wplan = kc.WritePlan.allocate(write_req_capacity=ROWS - 1)
    group = KvGroup(kind="full", num_slots=NUM_SLOTS, has_v=False)
    pool = np.zeros((ROWS, WIDTH), dtype=np.int32)  # expected-token pool
    lens = _i64([4])
    np.save(workdir / "buf.npy", np.zeros((NUM_SLOTS, kc.CANARY_SLOT_BYTES), dtype=np.uint8))

    def plan_args(**changes) -> dict:
        """launch_canary_plan_kernels: request row 1, 4 tokens cached, 1 new."""
        args = dict(
            verify_plan_out=vplan,
            write_plan_out=wplan,
            req_pool_indices=_i64([1]),
            prefix_lens=_i64([4]),
            extend_seq_lens=_i64([1]),
            req_to_token=req_to_token,
            swa_window_size=0,
            full_to_swa_index_mapping=None,
            verify_capacity=vplan.verify_capacity,
            req_to_verify_expected_tokens=None,
            req_to_verify_expected_tokens_valid_lens=None,
            kv_token_id_vs_position_offset=0,
        )
        return {**args, **changes}

    def write_args(**changes) -> dict:
        """launch_canary_write_kernel: stamp positions 0..3 of request row 1 (run plan_args' plan first)."""
        pos = np.arange(4, dtype=np.int64)
        args = dict(
            context=ctx,
            plan=wplan,
            input_ids=100 + pos,
            positions=pos,
            out_cache_loc=req_to_token[1, :4].astype(np.int64),
            enable_write_input_assert=False,
            expected_input_tokens=None,
            expected_input_positions=None,
        )
        return {**args, **changes}

    def verify_args(**changes) -> dict:
        """launch_canary_verify_kernel on the example context and verify plan."""
        return {**dict(context=ctx, plan=vplan, check_verify_expected_token=False), **changes}

    def scatter_args(**changes) -> dict:
        """scatter_req_token_ids: tokens of request row 1 into the expected-token pool."""
        args = dict(flat_in=_i64([5, 6, 7, 8]), offsets=_i64([0, 4]), req_pool_indices=_i64([1]), pool_out=pool)
        return {**args, **changes}

    def monitor_args(**changes) -> dict:
        """CanaryMonitor on the CPU for the example group."""
        return {**dict(full=group, device="cpu", write_req_capacity=ROWS - 1, health_interval=0), **changes}

    def batch(**changes) -> StepBatch:
        """One prefill step of request row 1 (tokens 101..104 into slots 10..13)."""
        args = dict(
            req_pool_indices=_i64([1]),
            prefix_lens=_i64([0]),
            extend_seq_lens=_i64([4]),
            req_to_token=req_to_token,
            input_ids=_i64([101, 102, 103, 104]),
            positions=_i64(range(4)),
            out_cache_loc=_i64([10, 11, 12, 13]),
        )
        return StepBatch(**{**args, **changes})

    ns.update(
        ctx=ctx,
        vplan=vplan,
        wplan=wplan,
        req_to_token=req_to_token,
        group=group,
        pool=pool,
        lens=lens,
        k_layer0=k_layer0,
        source=source,
        num_slots=NUM_SLOTS,
        n=NUM_SLOTS,
        cap=ROWS - 1,
        plan_args=plan_args,
        write_args=write_args,
        verify_args=verify_args,
        scatter_args=scatter_args,
        monitor_args=monitor_args,
        batch=batch,
    )
    return ns


def _outcome(code: str, snippet: str, workdir: pathlib.Path) -> str:
    """``"ran"``, the code of the ``KvCanaryError`` it raised, or the other exception as text."""
    if snippet.startswith("kvcanary "):  # a shell command: run the CLI as a user would
        argv = shlex.split(snippet.split("#")[0])[1:]
        argv += ["--no-progress"] if argv[0] == "demo" else []
        if argv[0] == "inspect":
            _shell_files(workdir, argv[1])
        proc = subprocess.run(
            [sys.executable, "-m", "kvcanary_numba", *argv], capture_output=True, text=True, timeout=600, cwd=workdir
        )
        if proc.returncode == 0:
            return "ran"
        found = re.search(r"\[(KVC-[A-Z]\d{3})\]", proc.stderr)
        return found.group(1) if found else f"exit {proc.returncode}: {proc.stderr[-500:]}"
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        exec(compile(snippet, f"<{code} example>", "exec"), example_scope(workdir))
    except kc.KvCanaryError as exc:
        return exc.code
    except Exception as exc:  # noqa: BLE001 - reported, the test names it
        return f"{type(exc).__name__}: {exc}"
    finally:
        os.chdir(cwd)
    return "ran"


def _shell_files(workdir: pathlib.Path, name: str) -> None:
    """What ``kvcanary inspect NAME`` examples read: a log file, or a real bundle of a caught fault."""
    path = workdir / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix != ".npz":
        path.write_text("kv_canary violation: launch_tag=HEAD_K_FULL ...\n")  # a log, not a bundle
        return
    k = np.zeros((NUM_SLOTS, 32), dtype=np.uint8)
    full = KvGroup(
        kind="full",
        num_slots=NUM_SLOTS,
        has_v=False,
        k_sources=(kc.RealKvSource(tensor=k, page_size=1, num_bytes_per_token=32, read_bytes=32),),
    )
    monitor = CanaryMonitor(
        full=full,
        device="cpu",
        write_req_capacity=1,
        real_kv_hash_mode=kc.RealKvHashMode.ALL,
        health_interval=0,
        bundle_dir=workdir / "caught",
    )
    req_to_token = np.zeros((ROWS, WIDTH), dtype=np.int32)
    for prefix, slots in ((0, [5, 6, 7, 8]), (4, [9])):  # prefill, then a decode step after a K byte flips
        req_to_token[1, prefix : prefix + len(slots)] = slots
        step = StepBatch(
            req_pool_indices=_i64([1]),
            prefix_lens=_i64([prefix]),
            extend_seq_lens=_i64([len(slots)]),
            req_to_token=req_to_token,
            input_ids=_i64(slots) + 100,
            positions=_i64(range(prefix, prefix + len(slots))),
            out_cache_loc=_i64(slots),
        )
        with monitor.forward(step):
            k[slots] = 1
        monitor.end_step()
        k[6, 0] ^= 0xFF
    monitor.bundles[0].replace(path)


def _limit_memory(gib: int = 32) -> None:
    """Cap the address space, so an allocation too large for a small machine fails here too (KVC-C015)."""
    try:
        import resource
    except ImportError:  # not POSIX: the KVC-C015 example then depends on the machine
        return
    resource.setrlimit(resource.RLIMIT_AS, (gib << 30, resource.getrlimit(resource.RLIMIT_AS)[1]))


def run_all() -> dict[str, list[str]]:
    """Code -> [outcome of "Before", outcome of "After"] for every catalogue entry."""
    from kvcanary_numba.errors import REGISTRY

    _limit_memory()
    # Advice, not an error: the examples keep the expected-token check off (warnings are errors otherwise).
    warnings.simplefilter("ignore", CanaryBlindSpotWarning)
    out = {}
    for code, entry in sorted(REGISTRY.items()):
        out[code] = [
            _outcome(code, snippet, pathlib.Path(tempfile.mkdtemp(prefix="kvc-example-")))
            for snippet in (entry.before, entry.after)
        ]
    return out


if __name__ == "__main__":
    print(json.dumps(run_all()))
