"""Codes KVC-P…: write offsets and plan capacities (launch_canary_plan_kernels, launch_plan_offsets_kernel).

SWA tables, expected-token inputs and plan-object arguments are in :mod:`.plan_inputs`.
"""

from __future__ import annotations

from .registry import define

define(
    "KVC-P001",
    title="write_offsets is empty",
    message=("{function}: {argument} length must be positive (write_req_capacity + 1 entries), got {got}"),
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
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "vplan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "wplan = kc.WritePlan(write_offsets=np.zeros(0, np.int64),  # no room for the leading 0\n"
        "                     write_seed_slot_indices=np.zeros(0, np.int64),\n"
        "                     write_num_valid_reqs=np.zeros(1, np.int32))\n"
        "empty = np.zeros(0, np.int64)  # a batch of no requests\n"
        "kc.launch_canary_plan_kernels(\n"
        "    verify_plan_out=vplan, write_plan_out=wplan, req_pool_indices=empty,\n"
        "    prefix_lens=empty, extend_seq_lens=empty,\n"
        "    req_to_token=np.zeros((1, 8), np.int32))"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "vplan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "wplan = kc.WritePlan.allocate(write_req_capacity=1)  # 1 + 1 offsets\n"
        "empty = np.zeros(0, np.int64)  # a batch of no requests\n"
        "kc.launch_canary_plan_kernels(\n"
        "    verify_plan_out=vplan, write_plan_out=wplan, req_pool_indices=empty,\n"
        "    prefix_lens=empty, extend_seq_lens=empty,\n"
        "    req_to_token=np.zeros((1, 8), np.int32))"
    ),
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

define(
    "KVC-P002",
    title="write_offsets length is not write_req_capacity + 1",
    message=(
        "{function}: {argument} must have write_req_capacity + 1 = {expected} entries "
        "(one more than {capacity_argument}), got {got}"
    ),
    meaning=(
        "A write plan describes up to write_req_capacity requests, where write_req_capacity is the "
        "length of write_seed_slot_indices (one seed per request). write_offsets is the exclusive "
        "prefix sum over those requests, so it has exactly one entry more. The plan kernel writes the "
        "whole array every step (sums for the live batch, zeros after it) and the write kernel reads "
        "write_offsets[r + 1] for every request r, so any other length either leaves entries stale "
        "or reads past the end."
    ),
    triggers=(
        "Allocating write_offsets and write_seed_slot_indices with the same length.",
        "Growing the seed array for a larger batch but keeping the old offsets array.",
        "Passing out_write_offsets[:bs + 1] instead of the whole array to launch_plan_offsets_kernel.",
    ),
    solutions=(
        "Allocate both arrays together with WritePlan.allocate(write_req_capacity=N).",
        "When building arrays by hand, make write_offsets exactly len(write_seed_slot_indices) + 1 long.",
    ),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "cap = 4  # requests the write plan can describe\n"
        "vplan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "wplan = kc.WritePlan(write_offsets=np.zeros(cap, np.int64),  # one short\n"
        "                     write_seed_slot_indices=np.full(cap, -1, np.int64),\n"
        "                     write_num_valid_reqs=np.zeros(1, np.int32))\n"
        "kc.launch_canary_plan_kernels(\n"
        "    verify_plan_out=vplan, write_plan_out=wplan, req_pool_indices=np.array([1]),\n"
        "    prefix_lens=np.array([4]), extend_seq_lens=np.array([1]),\n"
        "    req_to_token=np.zeros((2, 8), np.int32))"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "cap = 4  # requests the write plan can describe\n"
        "vplan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "wplan = kc.WritePlan.allocate(write_req_capacity=cap)  # cap + 1 offsets\n"
        "kc.launch_canary_plan_kernels(\n"
        "    verify_plan_out=vplan, write_plan_out=wplan, req_pool_indices=np.array([1]),\n"
        "    prefix_lens=np.array([4]), extend_seq_lens=np.array([1]),\n"
        "    req_to_token=np.zeros((2, 8), np.int32))"
    ),
    defensive=("assert plan.write_offsets.shape[0] == plan.write_seed_slot_indices.shape[0] + 1"),
    prevention=(
        "Keep write_req_capacity in one place and derive both lengths from it, or always let "
        "WritePlan.allocate build the plan."
    ),
    related=("KVC-P001", "KVC-P003"),
    sglang=("kv-canary: write_offsets_len must equal write_req_capacity + 1, got {a} and {b}",),
)

define(
    "KVC-P003",
    title="Batch larger than the write plan",
    message=("{function}: req_pool_indices has bs={got} requests but {argument} holds write_req_capacity={expected}"),
    meaning=(
        "The plan writes one write range and one chain seed per request of the batch "
        "(padding rows included), so the write plan must have room for bs requests. "
        "There is no other limit on bs: unlike SGLang, whose plan launch handles at most 4096 "
        "requests, the plan here runs a multi-block scan and accepts any batch the write plan can hold."
    ),
    triggers=(
        "Sizing the write plan from the average batch instead of the largest one "
        "(the cuda-graph max batch size or the request-pool size, whichever is larger).",
        "A padded batch (cuda-graph bucket) larger than the capacity chosen at start-up.",
        "Reusing a write plan allocated for another pool group with a smaller batch.",
    ),
    solutions=(
        "Allocate the write plan with write_req_capacity = max(cuda_graph_max_bs, req_pool_size).",
        "Split an oversized batch into launches that fit.",
    ),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "vplan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "wplan = kc.WritePlan.allocate(write_req_capacity=1)  # then a batch of 2 requests\n"
        "kc.launch_canary_plan_kernels(\n"
        "    verify_plan_out=vplan, write_plan_out=wplan, req_pool_indices=np.array([1, 2]),\n"
        "    prefix_lens=np.array([4, 0]), extend_seq_lens=np.array([1, 1]),\n"
        "    req_to_token=np.zeros((3, 8), np.int32))"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "cuda_graph_max_bs, req_pool_size = 2, 3\n"
        "vplan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "wplan = kc.WritePlan.allocate(write_req_capacity=max(cuda_graph_max_bs, req_pool_size))\n"
        "kc.launch_canary_plan_kernels(\n"
        "    verify_plan_out=vplan, write_plan_out=wplan, req_pool_indices=np.array([1, 2]),\n"
        "    prefix_lens=np.array([4, 0]), extend_seq_lens=np.array([1, 1]),\n"
        "    req_to_token=np.zeros((3, 8), np.int32))"
    ),
    defensive=(
        "if len(req_pool_indices) > wplan.write_req_capacity:\n"
        "    wplan = WritePlan.allocate(write_req_capacity=2 * len(req_pool_indices), device=dev)"
    ),
    prevention=(
        "Compute every capacity once from the engine's limits (largest padded batch), as SGLang's "
        "CanaryLaunchCapacities does; never from the first batch seen."
    ),
    related=("KVC-P002", "KVC-P004"),
    sglang=(
        "kv-canary: bs={bs} exceeds write_req_capacity={c}",
        "kv-canary: launch_canary_plan_kernels supports at most bs=4096 reqs per launch, got bs={bs}. "
        "Bump _PLAN_BS_BLOCK_SIZE if real workloads need this.",
        "kv-canary: offsets kernel bs must be in [0, 4096], got {bs}",
    ),
)

define(
    "KVC-P004",
    title="verify_capacity does not match the verify plan",
    message=("{function}: verify_capacity must equal the length of {argument} ({expected}), got {got!r}"),
    meaning=(
        "verify_capacity is the overflow threshold of the plan: when a step needs more verify "
        "entries than this, the plan sets verify_num_valid = verify_capacity and enable = 0 and "
        "leaves the entry arrays alone. The threshold must therefore be the real length of the "
        "entry arrays; a larger value would let the plan write past their end, a smaller one would "
        "disable verification for steps that fit. Leave verify_capacity out (None, the default) and "
        "the plan's own length is used; SGLang passes it, and a value given must equal it."
    ),
    triggers=(
        "Passing a configured capacity while the plan was allocated with another one.",
        "Reallocating the verify plan (larger pool) without updating the capacity passed to the plan.",
    ),
    solutions=(
        "Leave verify_capacity out (it defaults to the plan's), or pass verify_plan.verify_capacity.",
        "Allocate the plan from the same variable you pass as verify_capacity.",
    ),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "vplan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "wplan = kc.WritePlan.allocate(write_req_capacity=1)\n"
        "kc.launch_canary_plan_kernels(\n"
        "    verify_plan_out=vplan, write_plan_out=wplan, req_pool_indices=np.array([1]),\n"
        "    prefix_lens=np.array([4]), extend_seq_lens=np.array([1]),\n"
        "    req_to_token=np.zeros((2, 8), np.int32),\n"
        "    verify_capacity=4096)  # vplan holds 8"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "vplan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "wplan = kc.WritePlan.allocate(write_req_capacity=1)\n"
        "kc.launch_canary_plan_kernels(\n"
        "    verify_plan_out=vplan, write_plan_out=wplan, req_pool_indices=np.array([1]),\n"
        "    prefix_lens=np.array([4]), extend_seq_lens=np.array([1]),\n"
        "    req_to_token=np.zeros((2, 8), np.int32))  # verify_capacity: vplan's (or pass 8)"
    ),
    defensive="verify_capacity = vplan.verify_capacity  # single source of truth",
    prevention="Never keep the capacity separately from the plan; read it from the plan object.",
    related=("KVC-P003", "KVC-C011"),
    sglang=(
        "kv-canary: launch_canary_plan_kernels verify_capacity={c} does not match "
        "verify_plan_out.verify_slot_indices.shape[0]={p}",
        "kv-canary: launch_canary_plan_kernels_torch_reference verify_capacity={c} does not match "
        "verify_plan_out.verify_slot_indices.shape[0]={p}",
    ),
)
