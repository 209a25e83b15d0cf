"""Codes KVC-W…: see kvcanary_numba.write."""

from __future__ import annotations

from .registry import define

_FUNCTION = "launch_canary_write_kernel"

define(
    "KVC-W001",
    title="write_offsets length is not write_req_capacity + 1",
    message=(
        "{function}: {argument} must have write_req_capacity + 1 = {expected} entries "
        "(one more than write_seed_slot_indices), got {got}"
    ),
    meaning=(
        "A WritePlan describes up to write_req_capacity requests. write_seed_slot_indices has one "
        "entry per request; write_offsets is the exclusive prefix sum of their token counts and has "
        "one entry more, because request r owns the token range [write_offsets[r], "
        "write_offsets[r + 1]) and the last request needs its end. With one offset too few, the last "
        "request's end would be read past the array."
    ),
    triggers=(
        "Building a WritePlan by hand with write_offsets of length write_req_capacity.",
        "Slicing the plan's arrays to the live batch: write_offsets[:bs] with write_seed_slot_indices[:bs].",
        "Combining arrays of two plans allocated with different capacities.",
    ),
    solutions=(
        "Allocate with WritePlan.allocate(write_req_capacity=N), which makes N + 1 offsets.",
        "Pass whole plan arrays; the plan's write_num_valid_reqs already says how many requests are live.",
        "When slicing, slice write_offsets to bs + 1 and the seeds to bs.",
    ),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "ctx = kc.CanaryContext.allocate(num_slots=64)\n"
        "bs, offsets, seeds = 1, np.array([0, 4, 0, 0]), np.array([-1, -1, -1])\n"
        "plan = kc.WritePlan(write_offsets=offsets[:bs], write_seed_slot_indices=seeds[:bs],\n"
        "                    write_num_valid_reqs=np.ones(1, np.int32))\n"
        "pos = np.arange(4)\n"
        "kc.launch_canary_write_kernel(context=ctx, plan=plan, input_ids=100 + pos,\n"
        "                              positions=pos, out_cache_loc=10 + pos)"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "ctx = kc.CanaryContext.allocate(num_slots=64)\n"
        "bs, offsets, seeds = 1, np.array([0, 4, 0, 0]), np.array([-1, -1, -1])\n"
        "plan = kc.WritePlan(write_offsets=offsets[: bs + 1], write_seed_slot_indices=seeds[:bs],\n"
        "                    write_num_valid_reqs=np.ones(1, np.int32))\n"
        "pos = np.arange(4)\n"
        "kc.launch_canary_write_kernel(context=ctx, plan=plan, input_ids=100 + pos,\n"
        "                              positions=pos, out_cache_loc=10 + pos)"
    ),
    defensive="assert plan.write_offsets.shape[0] == plan.write_seed_slot_indices.shape[0] + 1",
    prevention="Allocate plans once with WritePlan.allocate and never rebuild them from slices in the hot path.",
    related=("KVC-P001", "KVC-C004"),
    sglang=(
        "canary_write: write_offsets.size(0) must equal write_req_capacity + 1 ({c+1}), got {n}",
        "kv-canary: write_offsets_len must equal write_req_capacity + 1, got {a} and {b}",
    ),
)

define(
    "KVC-W002",
    title="Write-input assert on but expected inputs missing",
    message=("{function}: {argument} is required when enable_write_input_assert=True, got None"),
    meaning=(
        "With enable_write_input_assert=True the write kernel compares every entry's token and "
        "position with expected_input_tokens[i] and expected_input_positions[i] (the token "
        "oracle's prediction) and records a WRITE_TOKEN / WRITE_POSITION row on a mismatch. It "
        "cannot compare against nothing, and silently skipping the check would hide the very bugs "
        "it exists for, so both arrays are required."
    ),
    triggers=(
        "Turning the assert on in the configuration before the token oracle is wired in.",
        "Passing only one of the two expected arrays.",
        "Passing the expected arrays under other keyword names (they default to nothing).",
    ),
    solutions=(
        "Pass both expected_input_tokens and expected_input_positions (int64, same length as input_ids).",
        "Or pass enable_write_input_assert=False when there is no oracle for this step.",
    ),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "ctx = kc.CanaryContext.allocate(num_slots=64)\n"
        "plan = kc.WritePlan.allocate(write_req_capacity=1)  # filled by the plan step\n"
        "pos = np.arange(4)\n"
        "oracle_ids, oracle_pos = 100 + pos, pos  # what an independent oracle expects\n"
        "kc.launch_canary_write_kernel(\n"
        "    context=ctx, plan=plan, input_ids=100 + pos, positions=pos, out_cache_loc=10 + pos,\n"
        "    enable_write_input_assert=True)  # but no expected inputs"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "ctx = kc.CanaryContext.allocate(num_slots=64)\n"
        "plan = kc.WritePlan.allocate(write_req_capacity=1)  # filled by the plan step\n"
        "pos = np.arange(4)\n"
        "oracle_ids, oracle_pos = 100 + pos, pos  # what an independent oracle expects\n"
        "kc.launch_canary_write_kernel(\n"
        "    context=ctx, plan=plan, input_ids=100 + pos, positions=pos, out_cache_loc=10 + pos,\n"
        "    enable_write_input_assert=True,\n"
        "    expected_input_tokens=oracle_ids, expected_input_positions=oracle_pos)"
    ),
    defensive=(
        "check = oracle is not None\n"
        f"{_FUNCTION}(..., enable_write_input_assert=check,\n"
        "    expected_input_tokens=oracle.ids if check else None,\n"
        "    expected_input_positions=oracle.pos if check else None)"
    ),
    prevention="Derive the flag from the presence of the oracle, never from a separate setting.",
    related=("KVC-W003", "KVC-C010"),
    sglang=(
        "kv-canary: expected input tensors are required when enable_write_input_assert=True",
        "canary_write: expected_input_tokens presence must match enable_write_input_assert",
        "canary_write: expected_input_positions presence must match enable_write_input_assert",
    ),
)

define(
    "KVC-W003",
    title="Write-input assert off but expected inputs given",
    message=("{function}: {argument} must be None when enable_write_input_assert=False"),
    meaning=(
        "Expected inputs are only read when enable_write_input_assert=True. Passing them with the "
        "flag off almost always means the flag was meant to be on (the check would silently not "
        "run), so the combination is rejected, as in SGLang. The flag is False by default."
    ),
    triggers=(
        "A configuration that fills the oracle arrays but forgot to turn the assert on (or left it "
        "at its default, False).",
        "Reusing keyword arguments of an asserted launch for an unasserted one.",
    ),
    solutions=(
        "Pass enable_write_input_assert=True to run the check.",
        "Or pass expected_input_tokens=None and expected_input_positions=None.",
    ),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "ctx = kc.CanaryContext.allocate(num_slots=64)\n"
        "plan = kc.WritePlan.allocate(write_req_capacity=1)  # filled by the plan step\n"
        "pos = np.arange(4)\n"
        "oracle_ids, oracle_pos = 100 + pos, pos  # what an independent oracle expects\n"
        "kc.launch_canary_write_kernel(\n"
        "    context=ctx, plan=plan, input_ids=100 + pos, positions=pos, out_cache_loc=10 + pos,\n"
        "    expected_input_tokens=oracle_ids, expected_input_positions=oracle_pos)\n"
        "# enable_write_input_assert is False by default: the expected inputs would go unread"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "ctx = kc.CanaryContext.allocate(num_slots=64)\n"
        "plan = kc.WritePlan.allocate(write_req_capacity=1)  # filled by the plan step\n"
        "pos = np.arange(4)\n"
        "oracle_ids, oracle_pos = 100 + pos, pos  # what an independent oracle expects\n"
        "kc.launch_canary_write_kernel(\n"
        "    context=ctx, plan=plan, input_ids=100 + pos, positions=pos, out_cache_loc=10 + pos,\n"
        "    enable_write_input_assert=True,\n"
        "    expected_input_tokens=oracle_ids, expected_input_positions=oracle_pos)"
    ),
    defensive="expected = (oracle_ids, oracle_pos) if check else (None, None)",
    prevention="Derive the flag from the presence of the oracle, never from a separate setting.",
    related=("KVC-W002", "KVC-C010"),
    sglang=(
        "kv-canary: expected input tensors must be None when enable_write_input_assert=False",
        "canary_write: expected_input_tokens presence must match enable_write_input_assert",
        "canary_write: expected_input_positions presence must match enable_write_input_assert",
    ),
)
