"""Codes KVC-M…: the CanaryMonitor (construction, step bundles, sweeps).

A step's batch against the capacities and its expected inputs: :mod:`.batch`; host threads
(KVC-M026): :mod:`.threads`; a job of several ranks: :mod:`.ranks`.
"""

from __future__ import annotations

from .registry import define

define(
    "KVC-M001",
    title="Unknown monitor mode",
    message="{function}: {argument} must be one of {expected}, got {got!r}",
    meaning=(
        "A CanaryMonitor reports violations in one of two ways. 'log' writes one logging.warning per "
        "violation row and lets the engine keep serving (SGLang's production setting). 'raise' raises "
        "one CanaryViolationError that carries every row found by the first pump that sees any "
        "(SGLang's CI setting); later rows are still collected in monitor.violations but not raised "
        "again. A monitor that should not check anything is simply not created."
    ),
    triggers=(
        "Passing SGLang's 'none' (there is no disabled monitor: do not build one).",
        "A typo or a capitalised name such as 'LOG' or 'warn'.",
    ),
    solutions=(
        "Pass mode='log' or mode='raise'.",
        "To run without checks, skip creating the monitor and its hooks.",
    ),
    before=(
        "import kvcanary_numba as kc\n"
        "\n"
        'full = kc.KvGroup(kind="full", num_slots=64, has_v=False)  # K only\n'
        'kc.CanaryMonitor(full=full, write_req_capacity=1, mode="none")'
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "\n"
        'full = kc.KvGroup(kind="full", num_slots=64, has_v=False)  # K only\n'
        'monitor = kc.CanaryMonitor(full=full, write_req_capacity=1, mode="log")  # or "raise"'
    ),
    defensive="mode = os.environ.get('KV_CANARY', 'log').strip().lower()",
    prevention="Parse the mode once from configuration with an explicit list of choices.",
    related=("KVC-C009",),
    sglang=("kv-canary: kv_canary must be one of none/log/raise, got {mode!r}",),
)

define(
    "KVC-M005",
    title="Step hooks called out of order",
    message="{function}: called while the monitor is {state}; expected order: {expected}",
    meaning=(
        "A step is pre_forward(batch) (plan + HEAD verify/write, before the engine writes KV), then "
        "post_forward() (TAIL verify/write, after the KV is written), then end_step() (sweep, "
        "readback, health). The TAIL launches reuse the plans of the same step's pre_forward, so "
        "skipping or repeating a hook would stamp or verify against the wrong plan. SGLang guards "
        "the same order with a device-side phase checker and assertions rather than a catalogued "
        "error. A sweep is refused between pre_forward and post_forward for the same reason."
    ),
    triggers=(
        "Calling pre_forward twice without post_forward (a retried forward).",
        "Calling post_forward for a step whose pre_forward raised.",
        "Calling end_step between pre_forward and post_forward.",
    ),
    solutions=(
        "Call the three hooks once per step in order, or use `with monitor.forward(batch): ...` "
        "followed by monitor.end_step().",
    ),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        'full = kc.KvGroup(kind="full", num_slots=64, has_v=False)  # K only\n'
        "monitor = kc.CanaryMonitor(full=full, write_req_capacity=1)\n"
        "req_to_token = np.array([[0] * 4, [10, 11, 12, 13]], np.int32)\n"
        "batch = kc.StepBatch(  # a prefill of one request: four tokens into slots 10..13\n"
        "    req_pool_indices=np.array([1]), prefix_lens=np.array([0]),\n"
        "    extend_seq_lens=np.array([4]), req_to_token=req_to_token,\n"
        "    input_ids=np.array([101, 102, 103, 104]), positions=np.arange(4),\n"
        "    out_cache_loc=np.array([10, 11, 12, 13]))\n"
        "monitor.pre_forward(batch)\n"
        "monitor.end_step()  # post_forward() was skipped"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        'full = kc.KvGroup(kind="full", num_slots=64, has_v=False)  # K only\n'
        "monitor = kc.CanaryMonitor(full=full, write_req_capacity=1)\n"
        "req_to_token = np.array([[0] * 4, [10, 11, 12, 13]], np.int32)\n"
        "batch = kc.StepBatch(  # a prefill of one request: four tokens into slots 10..13\n"
        "    req_pool_indices=np.array([1]), prefix_lens=np.array([0]),\n"
        "    extend_seq_lens=np.array([4]), req_to_token=req_to_token,\n"
        "    input_ids=np.array([101, 102, 103, 104]), positions=np.arange(4),\n"
        "    out_cache_loc=np.array([10, 11, 12, 13]))\n"
        "monitor.pre_forward(batch)\n"
        "# ... the engine's forward pass writes the KV ...\n"
        "monitor.post_forward()\n"
        "monitor.end_step()"
    ),
    defensive="with monitor.forward(batch):\n    run_forward()\nmonitor.end_step()",
    prevention="Wrap the engine's forward in one function that calls the hooks.",
    related=("KVC-M004",),
    extension=True,
)

define(
    "KVC-M006",
    title="Window size does not match the group kind",
    message="{function}: {argument} must be {expected} for a {kind} group, got {got!r}",
    meaning=(
        "A FULL group verifies every prefix slot (swa_window_size = 0). An SWA group verifies only "
        "the last swa_window_size positions of each request, in the SWA sub-pool, so its window is "
        "positive."
    ),
    triggers=(
        "Describing the SWA sub-pool with the default window 0.",
        "Giving the FULL group the model's sliding window.",
    ),
    solutions=("Pass swa_window_size = the model's sliding window for kind='swa' and 0 for kind='full'.",),
    before=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "lut = np.arange(65, dtype=np.int64)  # full slot -> SWA slot (full pool size + 1)\n"
        'kc.KvGroup(kind="swa", num_slots=64, full_to_swa_index_mapping=lut)'
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "lut = np.arange(65, dtype=np.int64)  # full slot -> SWA slot (full pool size + 1)\n"
        'kc.KvGroup(kind="swa", num_slots=64, swa_window_size=4096,\n'
        "           full_to_swa_index_mapping=lut)"
    ),
    defensive="window = config.sliding_window if kind == 'swa' else 0",
    prevention="Build both groups from the pool object that knows its window.",
    related=("KVC-M007", "KVC-C011"),
    extension=True,
)

define(
    "KVC-M007",
    title="full_to_swa_index_mapping does not match the group kind",
    message="{function}: full_to_swa_index_mapping must be {expected} for a {kind} group, got {got}",
    meaning=(
        "An SWA group addresses its canary buffer with SWA slot indices; the plan translates FULL "
        "slots through full_to_swa_index_mapping (int64 [full_pool_slots + 1], 0 = evicted or "
        "padding), and the monitor translates each step's out_cache_loc the same way. A FULL group "
        "uses FULL slots directly and takes no mapping."
    ),
    triggers=(
        "An SWA group without its LUT.",
        "Passing the LUT to the FULL group as well.",
    ),
    solutions=("Give the LUT to the SWA group only.",),
    before=('import kvcanary_numba as kc\n\nkc.KvGroup(kind="swa", num_slots=64, swa_window_size=4)'),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "lut = np.arange(65, dtype=np.int64)  # full slot -> SWA slot (full pool size + 1)\n"
        'kc.KvGroup(kind="swa", num_slots=64, swa_window_size=4,\n'
        "           full_to_swa_index_mapping=lut)"
    ),
    defensive="lut = pool.full_to_swa if kind == 'swa' else None",
    prevention="Keep the LUT with the SWA sub-pool object and build the group from it.",
    related=("KVC-M006",),
    sglang=("kv-canary: launch_canary_plan_kernels requires full_to_swa_index_mapping when swa_window_size > 0",),
)

define(
    "KVC-M008",
    title="Token check enabled without its inputs",
    message="{function}: {argument} is required when check_verify_expected_token=True, got None",
    meaning=(
        "With check_verify_expected_token the monitor keeps a device pool of every request's tokens "
        "[max_requests, max_context_len] int32 and scatters each step's token snapshot into it "
        "(prompt + output ids, flat, with per-request offsets); verify then compares every prefix "
        "slot's stored token with it. The pool size must be known at construction and each batch "
        "must carry the snapshot."
    ),
    triggers=(
        "Building the monitor with check_verify_expected_token=True but no max_context_len.",
        "A StepBatch without token_ids_flat / token_offsets while the check is on.",
    ),
    solutions=(
        "Pass max_requests (req_to_token rows) and max_context_len when enabling the check.",
        "Fill StepBatch.token_ids_flat and token_offsets from the requests' token lists.",
    ),
    before=(
        "import kvcanary_numba as kc\n"
        "\n"
        'full = kc.KvGroup(kind="full", num_slots=64, has_v=False)  # K only\n'
        "kc.CanaryMonitor(full=full, write_req_capacity=1, check_verify_expected_token=True)"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "\n"
        'full = kc.KvGroup(kind="full", num_slots=64, has_v=False)  # K only\n'
        "kc.CanaryMonitor(full=full, write_req_capacity=1, check_verify_expected_token=True,\n"
        "                 max_requests=4, max_context_len=16)  # the token pool's shape"
    ),
    defensive="check = snapshot is not None  # enable the check only where the engine keeps token lists",
    prevention="Enable the token check together with the code that builds token snapshots.",
    related=("KVC-S001",),
    sglang=(
        "kv-canary: CanaryDeviceState.allocate requires req_to_token_alloc_size and max_context_len "
        "when CanaryConfig.enable_verify_token_assert is on",
    ),
)

define(
    "KVC-M009",
    title="Monitor argument of the wrong type",
    message="{function}: {argument} must be a {expected}, got {got}",
    exception="type",
    meaning=(
        "The monitor takes its inputs bundled in small typed objects: KvGroup describes a group "
        "(slots, sources, window, LUT), StepBatch carries one step's metadata arrays, SlotChain one "
        "chain of a sweep. Bundling keeps the hooks' signatures stable and lets the monitor check "
        "the bundle once instead of guessing what a dict or tuple means."
    ),
    triggers=(
        "Passing a dict of arrays instead of a StepBatch to pre_forward.",
        "Passing a plain list of slots instead of SlotChain objects to sweep.",
        "Passing kind='swa' group as full= (or a KvGroup of the wrong kind).",
    ),
    solutions=(
        "Wrap the arrays: StepBatch(**arrays).",
        "Wrap each chain: SlotChain(slots=[...], start_position=0).",
    ),
    before=(
        "import kvcanary_numba as kc\n"
        "\n"
        'full = kc.KvGroup(kind="full", num_slots=64, has_v=False)  # K only\n'
        "monitor = kc.CanaryMonitor(full=full, write_req_capacity=1)\n"
        "monitor.sweep([[10, 11, 12]])"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "\n"
        'full = kc.KvGroup(kind="full", num_slots=64, has_v=False)  # K only\n'
        "monitor = kc.CanaryMonitor(full=full, write_req_capacity=1)\n"
        "monitor.sweep([kc.SlotChain(slots=[10, 11, 12])])"
    ),
    defensive="chains = [c if isinstance(c, SlotChain) else SlotChain(slots=c) for c in chains]",
    prevention="Build the bundles in the one adapter between the engine and the monitor.",
    related=("KVC-V001",),
    extension=True,
)

define(
    "KVC-M010",
    title="Sweep chain slots are not int64 slot indices",
    message="{function}: {argument} must be a 1-D sequence of ints in the int64 range, got {got}",
    meaning=(
        "A SlotChain lists the FULL slot of consecutive positions of one sequence; the sweep copies "
        "them into an int64 verify plan. Floats would be truncated to another slot, strings and "
        "nested lists have no slot meaning, and ints beyond int64 cannot be stored. Slots inside "
        "int64 but outside the pool are fine: the verify kernel reports them (bit 64)."
    ),
    triggers=(
        "Slots taken from a float array (np.arange(...) * 1.0, a JSON round trip).",
        "A 2-D [chains, len] array passed as one chain.",
        "slots=None for an empty chain.",
    ),
    solutions=("Pass a list of ints or a 1-D integer array; an empty chain is slots=[].",),
    before=("import kvcanary_numba as kc\nimport numpy as np\n\nkc.SlotChain(slots=np.array([[5, 6, 7]]))  # 2-D"),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "kc.SlotChain(slots=np.array([5, 6, 7]))  # one request's slots, in position order"
    ),
    defensive="slots = [int(s) for s in slots]",
    prevention="Keep slot lists as integer arrays end to end.",
    related=("KVC-M009", "KVC-M004"),
    extension=True,
)
