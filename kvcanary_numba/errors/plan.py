"""Codes KVC-P…: plan inputs and plan outputs (launch_canary_plan_kernels, launch_plan_offsets_kernel)."""

from __future__ import annotations

from .registry import define

define(
    "KVC-P001",
    title="write_offsets is empty",
    message=(
        "{function}: {argument} length must be positive (write_req_capacity + 1 entries), got {got}"
    ),
    meaning=(
        "write_offsets is an exclusive prefix sum with one entry more than the number of requests "
        "it can describe: request r owns the token range [write_offsets[r], write_offsets[r + 1]). "
        "Even a plan for zero requests needs the leading 0, so an empty write_offsets can describe "
        "nothing. This is the '+ 1' of every offsets array."
    ),
    triggers=(
        "Allocating write_offsets with write_req_capacity entries instead of write_req_capacity + 1 "
        "when the capacity is 0.",
        "Building a WritePlan by hand from an empty slice.",
        "Passing write_offsets[:bs] (bs = 0) instead of the whole array.",
    ),
    solutions=(
        "Allocate with WritePlan.allocate(write_req_capacity=N), which makes N + 1 offsets.",
        "When building arrays by hand, allocate write_req_capacity + 1 int64 entries.",
    ),
    before=(
        "plan = WritePlan(write_offsets=xp.zeros(cap, dtype=xp.int64),\n"
        "                 write_seed_slot_indices=xp.zeros(cap, dtype=xp.int64),\n"
        "                 write_num_valid_reqs=xp.zeros(1, dtype=xp.int32))"
    ),
    after="plan = WritePlan.allocate(write_req_capacity=cap, device='cuda')",
    defensive=(
        "offsets = xp.zeros(write_req_capacity + 1, dtype=xp.int64)  # one more than requests\n"
        "assert offsets.shape[0] == write_req_capacity + 1"
    ),
    prevention=(
        "Never size an offsets array by the request count alone; allocate plans through "
        "WritePlan.allocate and keep the capacity in one place (the largest batch the engine runs)."
    ),
    related=("KVC-P002", "KVC-W001"),
    sglang=("kv-canary: write_offsets_len must be positive, got {n}",),
)
