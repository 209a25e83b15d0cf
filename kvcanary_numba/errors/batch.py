"""Codes KVC-M… about one step's batch against the monitor's capacities and expected inputs."""

from __future__ import annotations

from .registry import define

define(
    "KVC-M002",
    title="Batch larger than write_req_capacity",
    message="{function}: batch has {got} requests but the monitor was built for write_req_capacity={capacity}",
    meaning=(
        "The monitor allocates its WritePlans once, at the largest batch it will see, so that every "
        "step reuses the same device memory (a captured CUDA graph keeps pointing at it). A step "
        "with more requests than that capacity cannot be planned; it is rejected on the host before "
        "anything is launched."
    ),
    triggers=(
        "write_req_capacity set to the decode batch size while prefill batches are larger.",
        "The engine's max running requests raised after the monitor was built.",
    ),
    solutions=(
        "Build the monitor with write_req_capacity = the largest batch the engine schedules "
        "(SGLang: max(cuda_graph_max_bs, req_to_token_pool_size)).",
    ),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        'full = kc.KvGroup(kind="full", num_slots=64, has_v=False)  # K only\n'
        "monitor = kc.CanaryMonitor(full=full, write_req_capacity=1)\n"
        "req_to_token = np.array([[0, 0], [10, 11], [12, 13]], np.int32)\n"
        "batch = kc.StepBatch(  # a prefill of two requests, two tokens each\n"
        "    req_pool_indices=np.array([1, 2]), prefix_lens=np.array([0, 0]),\n"
        "    extend_seq_lens=np.array([2, 2]), req_to_token=req_to_token,\n"
        "    input_ids=np.array([101, 102, 201, 202]), positions=np.array([0, 1, 0, 1]),\n"
        "    out_cache_loc=np.array([10, 11, 12, 13]))\n"
        "with monitor.forward(batch):\n"
        "    pass  # the engine's forward pass writes the KV here\n"
        "monitor.end_step()"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        'full = kc.KvGroup(kind="full", num_slots=64, has_v=False)  # K only\n'
        "monitor = kc.CanaryMonitor(full=full, write_req_capacity=2)  # the largest batch\n"
        "req_to_token = np.array([[0, 0], [10, 11], [12, 13]], np.int32)\n"
        "batch = kc.StepBatch(  # a prefill of two requests, two tokens each\n"
        "    req_pool_indices=np.array([1, 2]), prefix_lens=np.array([0, 0]),\n"
        "    extend_seq_lens=np.array([2, 2]), req_to_token=req_to_token,\n"
        "    input_ids=np.array([101, 102, 201, 202]), positions=np.array([0, 1, 0, 1]),\n"
        "    out_cache_loc=np.array([10, 11, 12, 13]))\n"
        "with monitor.forward(batch):\n"
        "    pass  # the engine's forward pass writes the KV here\n"
        "monitor.end_step()"
    ),
    defensive="write_req_capacity = max(max_decode_bs, max_prefill_bs, req_to_token.shape[0])",
    prevention="Derive every monitor capacity from the engine's own limits in one place.",
    related=("KVC-M003", "KVC-P002"),
    sglang=(
        "kv-canary: forward_batch.batch_size={bs} exceeds pre-allocated write_req_capacity={c}; raise "
        "--cuda-graph-max-bs or check CanaryLaunchCapacities.from_args",
        "kv-canary: bs={bs} exceeds write_req_capacity={c}",
    ),
)

define(
    "KVC-M003",
    title="Step has more tokens than write_token_capacity",
    message=("{function}: {argument} holds {got} tokens but the monitor was built for write_token_capacity={capacity}"),
    meaning=(
        "Token-sized scratch (the SWA-translated out_cache_loc of each step) is allocated once at "
        "write_token_capacity, the largest number of new tokens one step writes. A longer step "
        "cannot be translated without allocating, so it is rejected on the host. SGLang's runtime "
        "raises a RuntimeError for the same condition at its forward-batch boundary (naming "
        "--chunked-prefill-size / --max-prefill-tokens); here it is a catalogued input error."
    ),
    triggers=(
        "A prefill chunk longer than the configured capacity.",
        "Speculative decoding that writes several draft tokens per request.",
    ),
    solutions=("Build the monitor with write_token_capacity = max(max_bs * draft_tokens, max prefill tokens).",),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        'full = kc.KvGroup(kind="full", num_slots=64, has_v=False)  # K only\n'
        "monitor = kc.CanaryMonitor(full=full, write_req_capacity=1, write_token_capacity=2)\n"
        "req_to_token = np.array([[0] * 4, [10, 11, 12, 13]], np.int32)\n"
        "batch = kc.StepBatch(  # a prefill of one request: four tokens into slots 10..13\n"
        "    req_pool_indices=np.array([1]), prefix_lens=np.array([0]),\n"
        "    extend_seq_lens=np.array([4]), req_to_token=req_to_token,\n"
        "    input_ids=np.array([101, 102, 103, 104]), positions=np.arange(4),\n"
        "    out_cache_loc=np.array([10, 11, 12, 13]))\n"
        "with monitor.forward(batch):\n"
        "    pass  # the engine's forward pass writes the KV here\n"
        "monitor.end_step()"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        'full = kc.KvGroup(kind="full", num_slots=64, has_v=False)  # K only\n'
        "chunked_prefill_size = 4  # the most new tokens of one step\n"
        "monitor = kc.CanaryMonitor(full=full, write_req_capacity=1,\n"
        "                           write_token_capacity=chunked_prefill_size)\n"
        "req_to_token = np.array([[0] * 4, [10, 11, 12, 13]], np.int32)\n"
        "batch = kc.StepBatch(  # a prefill of one request: four tokens into slots 10..13\n"
        "    req_pool_indices=np.array([1]), prefix_lens=np.array([0]),\n"
        "    extend_seq_lens=np.array([4]), req_to_token=req_to_token,\n"
        "    input_ids=np.array([101, 102, 103, 104]), positions=np.arange(4),\n"
        "    out_cache_loc=np.array([10, 11, 12, 13]))\n"
        "with monitor.forward(batch):\n"
        "    pass  # the engine's forward pass writes the KV here\n"
        "monitor.end_step()"
    ),
    defensive="write_token_capacity = max(max_bs * max(1, num_draft_tokens), chunked_prefill_size)",
    prevention="Take the capacity from the same setting that bounds the engine's prefill chunks.",
    related=("KVC-M002",),
    extension=True,
)

define(
    "KVC-M004",
    title="Sweep larger than sweep_capacity",
    message="{function}: the sweep chains hold {got} slots but sweep_capacity is {capacity}",
    meaning=(
        "A sweep verifies every slot of the given chains in one launch per buffer, from a VerifyPlan "
        "allocated once at sweep_capacity entries. Chains with more slots than that do not fit. "
        "(Current SGLang builds a fresh plan sized to each radix walk; an older version raised a "
        "RuntimeError when the walk outgrew a preallocated capacity, as this check does.)"
    ),
    triggers=(
        "Sweeping the whole prefix cache of a pool larger than the capacity chosen at start-up.",
        "Passing the same chain several times.",
    ),
    solutions=(
        "Build the monitor with sweep_capacity >= the number of KV slots of the pool (the default).",
        "Split the chains over several sweep() calls.",
    ),
    before=(
        "import kvcanary_numba as kc\n"
        "\n"
        'full = kc.KvGroup(kind="full", num_slots=64, has_v=False)  # K only\n'
        "monitor = kc.CanaryMonitor(full=full, write_req_capacity=1, sweep_capacity=2)\n"
        "monitor.sweep([kc.SlotChain(slots=[10, 11, 12, 13])])"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "\n"
        'full = kc.KvGroup(kind="full", num_slots=64, has_v=False)  # K only\n'
        "monitor = kc.CanaryMonitor(full=full, write_req_capacity=1)  # sweeps up to 64 slots\n"
        "monitor.sweep([kc.SlotChain(slots=[10, 11, 12, 13])])"
    ),
    defensive="for part in batched(chains, 64): monitor.sweep(part)",
    prevention="Size the sweep plan from the pool: a slot belongs to at most one cached chain.",
    related=("KVC-M002",),
    extension=True,
)

define(
    "KVC-M011",
    title="Only one of the batch's expected inputs given",
    message="{function}: {argument} is None but {other} is given; pass both (write-input assert on) or neither",
    meaning=(
        "A StepBatch turns the write-input assert on by carrying an oracle's expected tokens and "
        "expected positions for every new token. The write kernels compare both, so one without "
        "the other is a half-wired oracle; it is rejected before any launch of the step."
    ),
    triggers=("An engine adapter that fills expected_input_tokens but forgot expected_input_positions.",),
    solutions=("Give both arrays, or leave both None to run without the write-input assert.",),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "req_to_token = np.array([[0] * 4, [10, 11, 12, 13]], np.int32)\n"
        "tokens, positions = np.array([101, 102, 103, 104]), np.arange(4)\n"
        "kc.StepBatch(\n"
        "    req_pool_indices=np.array([1]), prefix_lens=np.array([0]),\n"
        "    extend_seq_lens=np.array([4]), req_to_token=req_to_token, input_ids=tokens,\n"
        "    positions=positions, out_cache_loc=np.array([10, 11, 12, 13]),\n"
        "    expected_input_tokens=tokens)  # what the oracle says"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "req_to_token = np.array([[0] * 4, [10, 11, 12, 13]], np.int32)\n"
        "tokens, positions = np.array([101, 102, 103, 104]), np.arange(4)\n"
        "kc.StepBatch(\n"
        "    req_pool_indices=np.array([1]), prefix_lens=np.array([0]),\n"
        "    extend_seq_lens=np.array([4]), req_to_token=req_to_token, input_ids=tokens,\n"
        "    positions=positions, out_cache_loc=np.array([10, 11, 12, 13]),\n"
        "    expected_input_tokens=tokens, expected_input_positions=positions)"
    ),
    defensive="if tokens is None or positions is None: tokens = positions = None",
    prevention="Produce the oracle's tokens and positions in one function that returns both.",
    related=("KVC-W002", "KVC-W003", "KVC-M008"),
    extension=True,
)
