"""Probe: offsets launch shapes for plan bs=4096 (whole plan and offsets alone), one run."""
import json, sys
import numpy as np, cupy
sys.path.insert(0, ".")
from kvcanary_numba.launch import plan as glue
from kvcanary_numba import launch_canary_plan_kernels, launch_plan_offsets_kernel
from benchmarks.timing import device_times
from benchmarks.workloads import plan_case

out = []
for bs in (4096, 16384):
    sets = [plan_case(cupy, bs=bs, prefix=128, seed=s) for s in range(4)]
    scratch = [cupy.zeros(bs + 1, dtype=np.int64) for _ in sets]
    def offsets(i):
        case = sets[i % 4]; w = case["write_plan_out"]; v = case["verify_plan_out"]
        launch_plan_offsets_kernel(req_pool_indices=case["req_pool_indices"], prefix_lens=case["prefix_lens"],
            extend_seq_lens=case["extend_seq_lens"], req_to_token=case["req_to_token"], full_to_swa_index_mapping=None,
            out_verify_offsets_scratch=scratch[i % 4], out_write_offsets=w.write_offsets,
            out_write_seed_slot_indices=w.write_seed_slot_indices, out_verify_num_valid=v.verify_num_valid,
            out_verify_enable=v.enable, out_write_num_valid_reqs=w.write_num_valid_reqs, swa_window_size=0,
            verify_capacity=case["verify_capacity"])
    for block, items in ((512, 2), (1024, 1), (256, 4), (1024, 2), (512, 1), (256, 2)):
        glue.OFFSETS_BLOCK, glue.OFFSETS_ITEMS = block, items
        whole = device_times(lambda i: launch_canary_plan_kernels(**sets[i % 4]), iters=30, host_us=300)
        alone = device_times(offsets, iters=30, host_us=300)
        ok = int(sets[0]["verify_plan_out"].verify_num_valid.get()[0]) == bs * 128
        rec = {"bs": bs, "block": block, "items": items, "whole_us": whole["median_us"], "offsets_us": alone["median_us"], "ok": ok}
        print(rec, flush=True); out.append(rec)
json.dump(out, open(sys.argv[1], "w"), indent=1)
