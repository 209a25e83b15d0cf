"""Host µs of the NumPy public calls with 1 entry, before / after the shared-memory check (KVC-C017).

Frozen record of what ran in session 8 (branch ``alias``; results in ``alias-check-cost-session8.txt``);
runs against older trees too (no new names imported). Memo hit: the same call repeated. Memo miss:
the function's memo cleared before every call (full validation, the only time the complete overlap
test runs). ``write, new inputs``: an engine's per-step arrays, new objects every call (a memo hit
whose top-level NumPy arrays must still be re-checked).
Run: ``PYTHONPATH=<tree> python benchmarks/results/probes/alias_check_cost.py``.
"""

from __future__ import annotations

import json
import sys
import timeit

import numpy as np

from benchmarks.bench_public import _step
from kvcanary_numba import RealKvSource, compute_real_kv_hash, scatter_req_token_ids
from kvcanary_numba import fingerprint as fingerprint_module
from kvcanary_numba import plan as plan_module
from kvcanary_numba import scatter as scatter_module
from kvcanary_numba import verify as verify_module
from kvcanary_numba import write as write_module
from kvcanary_numba import launch_canary_plan_kernels, launch_plan_offsets_kernel
from kvcanary_numba import launch_canary_verify_kernel
from kvcanary_numba import launch_canary_write_kernel


def _us(fn, number: int = 3000, repeat: int = 7) -> float:
    fn()
    return round(min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6, 2)


def main() -> None:
    plan, verify, write = _step(np, 1, 1)
    bs = 1
    offsets = dict(req_pool_indices=plan["req_pool_indices"], prefix_lens=plan["prefix_lens"],
                   extend_seq_lens=plan["extend_seq_lens"], req_to_token=plan["req_to_token"],
                   full_to_swa_index_mapping=None, out_verify_offsets_scratch=np.zeros(bs + 1, np.int64),
                   out_write_offsets=np.zeros(bs + 1, np.int64), out_write_seed_slot_indices=np.zeros(bs, np.int64),
                   out_verify_num_valid=np.zeros(1, np.int32), out_verify_enable=np.zeros(1, np.int32),
                   out_write_num_valid_reqs=np.zeros(1, np.int32), swa_window_size=0, verify_capacity=8)  # fmt: skip
    scatter = dict(flat_in=np.arange(4, dtype=np.int64), offsets=np.array([0, 4], np.int64),
                   req_pool_indices=np.array([1], np.int64), pool_out=np.zeros((2, 8), np.int32))  # fmt: skip
    kv = np.zeros((8, 64), np.uint8)
    fingerprint = dict(real_kv_sources=(RealKvSource(tensor=kv, page_size=1, num_bytes_per_token=64, read_bytes=64),),
                       real_kv_hash_mode=1, slot_indices=np.array([3], np.int64), out=np.zeros(1, np.int64))  # fmt: skip
    calls = {
        "plan": (lambda: launch_canary_plan_kernels(**plan), plan_module._MEMOS["launch_canary_plan_kernels"]),
        "verify": (lambda: launch_canary_verify_kernel(**verify), verify_module._MEMO),
        "write": (lambda: launch_canary_write_kernel(**write), write_module._MEMO),
        "offsets": (lambda: launch_plan_offsets_kernel(**offsets), plan_module._MEMOS["launch_plan_offsets_kernel"]),
        "scatter": (lambda: scatter_req_token_ids(**scatter), scatter_module._MEMO),
        "fingerprint": (lambda: compute_real_kv_hash(**fingerprint), fingerprint_module._MEMO),
    }
    out = {}
    for name, (fn, memo) in calls.items():
        out[f"{name} hit"] = _us(fn)

        def miss(fn=fn, memo=memo):
            memo.clear()
            fn()

        out[f"{name} miss"] = _us(miss, number=1000)
    fresh = dict(write)

    def new_inputs():
        for key in ("input_ids", "positions", "out_cache_loc"):
            fresh[key] = write[key].copy()
        launch_canary_write_kernel(**fresh)

    copies = _us(lambda: [write[k].copy() for k in ("input_ids", "positions", "out_cache_loc")])
    out["write hit, new inputs (copies subtracted)"] = round(_us(new_inputs) - copies, 2)
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
