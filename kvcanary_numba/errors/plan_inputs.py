"""Codes KVC-P…: SWA lookup tables, expected-token inputs and plan-object arguments (launch_canary_plan_kernels, launch_plan_offsets_kernel)."""

from __future__ import annotations

from .registry import define

define(
    "KVC-P005",
    title="SWA LUT presence does not match swa_window_size",
    message=("{function}: full_to_swa_index_mapping must be {expected} when swa_window_size={window}, got {got}"),
    meaning=(
        "A sliding-window (SWA) pool group keeps its own, smaller canary buffer indexed by SWA slots, "
        "so every slot, predecessor and seed the plan emits must be translated through the group's "
        "full-to-SWA LUT (int64 [full_pool_size + 1]). swa_window_size > 0 marks such a group and "
        "requires the LUT; swa_window_size = 0 marks a full-attention group, whose slots must not be "
        "translated, so a LUT there is a mix-up of the two groups' arguments."
    ),
    triggers=(
        "Planning the SWA group with the full group's arguments (LUT left as None).",
        "Passing the SWA LUT to the full group's plan (swa_window_size=0).",
        "Reading swa_window_size from a model config that has no sliding window while passing a LUT.",
    ),
    solutions=(
        "For the SWA group pass swa_window_size=W and full_to_swa_index_mapping=lut.",
        "For the full group pass swa_window_size=0 and full_to_swa_index_mapping=None.",
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
        "    swa_window_size=4)  # no full_to_swa_index_mapping"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "vplan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "wplan = kc.WritePlan.allocate(write_req_capacity=1)\n"
        "lut = np.arange(65, dtype=np.int64)  # full slot -> SWA slot (full pool size + 1)\n"
        "kc.launch_canary_plan_kernels(\n"
        "    verify_plan_out=vplan, write_plan_out=wplan, req_pool_indices=np.array([1]),\n"
        "    prefix_lens=np.array([4]), extend_seq_lens=np.array([1]),\n"
        "    req_to_token=np.zeros((2, 8), np.int32),\n"
        "    swa_window_size=4, full_to_swa_index_mapping=lut)"
    ),
    defensive=(
        "lut = group.full_to_swa_index_mapping if group.is_swa else None\nwindow = group.window if group.is_swa else 0"
    ),
    prevention=(
        "Keep (swa_window_size, LUT, canary buffers) together in one per-group object so they cannot be mixed up."
    ),
    related=("KVC-C005", "KVC-P006"),
    sglang=(
        "kv-canary: launch_canary_plan_kernels requires full_to_swa_index_mapping when swa_window_size > 0",
        "kv-canary: lut_len must be 0 when has_swa_lut is False",
        "full_to_swa_index_mapping presence does not match HAS_SWA_LUT specialization",
    ),
)

define(
    "KVC-P006",
    title="Expected-token pool and valid lengths not given together",
    message=(
        "{function}: req_to_verify_expected_tokens and req_to_verify_expected_tokens_valid_lens "
        "must both be arrays or both be None, got {got}"
    ),
    meaning=(
        "The verify-token check gathers, for entry (request r, position p), the expected token "
        "pool[req_pool_indices[r], p + kv_token_id_vs_position_offset] if that column is below "
        "valid_lens[r] (the length of the request's token snapshot), else -1 (unchecked). "
        "The pool without the lengths would read unwritten columns as real tokens; the lengths "
        "without the pool have nothing to bound."
    ),
    triggers=(
        "Turning the verify-token check on by passing the pool but forgetting the per-request lengths.",
        "Turning the check off by dropping the pool but still passing the lengths.",
    ),
    solutions=(
        "Pass both (check on) or neither (check off).",
        "Fill the pool with scatter_req_token_ids and pass the same per-request lengths it used.",
    ),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "vplan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "wplan = kc.WritePlan.allocate(write_req_capacity=1)\n"
        "pool = np.zeros((2, 8), np.int32)  # expected tokens per request row\n"
        "kc.launch_canary_plan_kernels(\n"
        "    verify_plan_out=vplan, write_plan_out=wplan, req_pool_indices=np.array([1]),\n"
        "    prefix_lens=np.array([4]), extend_seq_lens=np.array([1]),\n"
        "    req_to_token=np.zeros((2, 8), np.int32),\n"
        "    req_to_verify_expected_tokens=pool)"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "vplan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "wplan = kc.WritePlan.allocate(write_req_capacity=1)\n"
        "pool = np.zeros((2, 8), np.int32)  # expected tokens per request row\n"
        "valid = np.array([5])  # tokens of request row 1 in the pool\n"
        "kc.launch_canary_plan_kernels(\n"
        "    verify_plan_out=vplan, write_plan_out=wplan, req_pool_indices=np.array([1]),\n"
        "    prefix_lens=np.array([4]), extend_seq_lens=np.array([1]),\n"
        "    req_to_token=np.zeros((2, 8), np.int32),\n"
        "    req_to_verify_expected_tokens=pool,\n"
        "    req_to_verify_expected_tokens_valid_lens=valid)"
    ),
    defensive=(
        "pool_args = (pool, lens) if check_tokens else (None, None)\n"
        "launch_canary_plan_kernels(..., req_to_verify_expected_tokens=pool_args[0],\n"
        "                           req_to_verify_expected_tokens_valid_lens=pool_args[1], ...)"
    ),
    prevention="Derive both arguments from the one switch that enables the verify-token check.",
    related=("KVC-P005", "KVC-C004"),
    sglang=(
        "kv-canary: launch_plan_entries_kernel requires req_to_verify_expected_tokens_valid_lens "
        "when req_to_verify_expected_tokens is set",
        "kv-canary: launch_canary_plan_kernels_torch_reference requires "
        "req_to_verify_expected_tokens_valid_lens when req_to_verify_expected_tokens is set",
        "req_to_verify_expected_tokens_valid_lens must be set when req_to_verify_expected_tokens is set",
        "req_to_verify_expected_tokens presence does not match HAS_VERIFY_EXPECTED_TOKEN_POOL specialization",
    ),
)

define(
    "KVC-P007",
    title="Plan output is not a plan object",
    message="{function}: {argument} must be a {expected}, got {got}",
    exception="type",
    meaning=(
        "launch_canary_plan_kernels fills a VerifyPlan (verify entries) and a WritePlan (write "
        "ranges and seeds) in place; it needs the plan objects, whose arrays the later verify and "
        "write launches read. Passing the two plans in swapped order, a dict of arrays or a single "
        "array is rejected before anything is written."
    ),
    triggers=(
        "verify_plan_out and write_plan_out swapped.",
        "Passing plan.arrays() (a dict) instead of the plan.",
        "Passing None to skip one half of the plan.",
    ),
    solutions=(
        "Pass VerifyPlan.allocate(...) as verify_plan_out and WritePlan.allocate(...) as write_plan_out.",
        "To compute only write ranges and seeds, call launch_plan_offsets_kernel with raw arrays.",
    ),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "vplan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "wplan = kc.WritePlan.allocate(write_req_capacity=1)\n"
        "kc.launch_canary_plan_kernels(\n"
        "    verify_plan_out=wplan, write_plan_out=vplan, req_pool_indices=np.array([1]),\n"
        "    prefix_lens=np.array([4]), extend_seq_lens=np.array([1]),\n"
        "    req_to_token=np.zeros((2, 8), np.int32))  # the plans swapped"
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
        "    req_to_token=np.zeros((2, 8), np.int32))"
    ),
    defensive="assert isinstance(vplan, VerifyPlan) and isinstance(wplan, WritePlan)",
    prevention="Always pass plans by keyword and allocate them next to each other.",
    related=("KVC-C001", "KVC-P002"),
    sglang=(),
    extension=True,
)

define(
    "KVC-P008",
    title="SWA LUT does not map padding slot 0 to 0",
    message=("{function}: full_to_swa_index_mapping[0] must be 0 (padding slot 0 maps to SWA slot 0), got {got}"),
    meaning=(
        "KV slot 0 is the padding slot: padded tokens write into it and verify never checks it. The "
        "plan translates every full-pool slot through the SWA LUT, so lut[0] must be 0 for padding "
        "to stay padding in the SWA group; any other value makes padded positions verify (and seed "
        "chains from) a real SWA slot, and reports corruption that is not there or hides some that is. "
        "Checked on the host when the LUT is a NumPy array; a LUT in GPU memory is not read (reading "
        "one element would synchronise the stream, and is not allowed during CUDA-graph capture)."
    ),
    triggers=(
        "Building the LUT with an offset (e.g. lut = swa_slots + 1) or from a 1-based allocator.",
        "Passing the SWA-to-full mapping instead of the full-to-SWA one.",
        "Filling a new LUT with -1 (unmapped) everywhere, slot 0 included.",
    ),
    solutions=(
        "Keep entry 0 of the full-to-SWA mapping at 0, as SGLang's SWA allocator does.",
        "Set lut[0] = 0 after building the LUT by hand.",
    ),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "vplan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "wplan = kc.WritePlan.allocate(write_req_capacity=1)\n"
        "lut = np.full(65, -1, np.int64)  # padding slot 0 maps to -1\n"
        "kc.launch_canary_plan_kernels(\n"
        "    verify_plan_out=vplan, write_plan_out=wplan, req_pool_indices=np.array([1]),\n"
        "    prefix_lens=np.array([4]), extend_seq_lens=np.array([1]),\n"
        "    req_to_token=np.zeros((2, 8), np.int32),\n"
        "    swa_window_size=4, full_to_swa_index_mapping=lut)"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "vplan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "wplan = kc.WritePlan.allocate(write_req_capacity=1)\n"
        "lut = np.full(65, -1, np.int64)\n"
        "lut[0] = 0  # padding stays padding\n"
        "kc.launch_canary_plan_kernels(\n"
        "    verify_plan_out=vplan, write_plan_out=wplan, req_pool_indices=np.array([1]),\n"
        "    prefix_lens=np.array([4]), extend_seq_lens=np.array([1]),\n"
        "    req_to_token=np.zeros((2, 8), np.int32),\n"
        "    swa_window_size=4, full_to_swa_index_mapping=lut)"
    ),
    defensive="assert int(lut[0]) == 0, 'full_to_swa_index_mapping[0] must map padding slot 0 to 0'",
    prevention=(
        "Take the LUT from the engine's SWA allocator rather than rebuilding it; for a GPU LUT check "
        "lut[0] once where it is created (that read is a sync the plan does not make per step)."
    ),
    related=("KVC-P005", "KVC-C005"),
    sglang=(),
    extension=True,
)
