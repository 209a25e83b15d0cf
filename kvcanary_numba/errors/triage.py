"""Codes KVC-M020 …: violation bundles and budgeted verification of the CanaryMonitor (extensions)."""

from __future__ import annotations

from .registry import define

define(
    "KVC-M020",
    title="Not a violation bundle",
    message="{function}: {path} is not a kvcanary violation bundle: {reason}",
    meaning=(
        "A violation bundle is the .npz file a CanaryMonitor built with bundle_dir= writes when a "
        "readback finds new violation rows: the rows, the verify entries that replay them, the canary "
        "records and real-KV bytes of the slots involved, and a JSON config with a format number. "
        "`kvcanary inspect` and replay_bundle read only files of that layout and format, so that a "
        "replay never guesses what an array means."
    ),
    triggers=(
        "A path that does not exist, or a file that is not an .npz archive (a log, a truncated copy).",
        "An .npz written by something else, or a bundle whose arrays were edited (missing key, wrong shape).",
        "A bundle of a newer format than this version reads.",
    ),
    solutions=(
        "Pass a file from the monitor's bundle_dir (monitor.bundles lists them).",
        "Copy bundles as binary files; re-create a damaged one by re-running with bundle_dir=.",
        "Inspect a newer bundle with the kvcanary_numba version that wrote it (config names it).",
    ),
    before="kvcanary inspect canary.log  # a log file (or a path that does not exist)",
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "from kvcanary_numba.monitor.replay import explain_bundle\n"
        "\n"
        "k = np.zeros((64, 32), np.uint8)  # layer 0 of the K pool, 32 bytes per token\n"
        "src = kc.RealKvSource(tensor=k, page_size=1, num_bytes_per_token=32, read_bytes=32)\n"
        'full = kc.KvGroup(kind="full", num_slots=64, has_v=False, k_sources=(src,))\n'
        'monitor = kc.CanaryMonitor(full=full, write_req_capacity=1, bundle_dir="bundles")\n'
        "rtt = np.array([[0] * 8, range(10, 18)], np.int32)\n"
        "for prefix, n in [(0, 4), (4, 1)]:  # prefill 4 tokens, then decode 1\n"
        "    pos = np.arange(prefix, prefix + n)\n"
        "    with monitor.forward(kc.StepBatch(\n"
        "            req_pool_indices=np.array([1]), prefix_lens=np.array([prefix]),\n"
        "            extend_seq_lens=np.array([n]), req_to_token=rtt, input_ids=100 + pos,\n"
        "            positions=pos, out_cache_loc=rtt[1, pos])):\n"
        "        k[rtt[1, pos]] = 1  # the forward pass writes the KV\n"
        "    monitor.end_step()\n"
        "    k[11, 0] ^= 0xFF  # a stray write into slot 11's KV, found by the next step\n"
        "print(explain_bundle(monitor.bundles[0]))  # the file kvcanary inspect reads"
    ),
    defensive="paths = sorted(pathlib.Path(bundle_dir).glob('kvcanary-step*.npz'))",
    prevention="Keep bundles where the monitor wrote them and read them with the same package version.",
    related=("KVC-M022",),
    extension=True,
)

define(
    "KVC-M021",
    title="Bad verification budget",
    message="{function}: {argument} {problem}, got {got!r}",
    meaning=(
        "Budgeted verification checks only a seeded subset of each step's prefix entries: slot s is "
        "verified at step t when (hash(s, seed) + t) % K == 0, so every slot that stays live for K "
        "consecutive steps is verified within K steps. K is derived from the budget: a byte budget "
        "(or entry budget) per step against the expected prefix entries per step. The budget must "
        "allow at least one entry per step, and K must stay small enough to be a useful bound."
    ),
    triggers=(
        "verify_budget_entries=0 or a negative byte budget.",
        "A byte budget smaller than one verify entry's bytes.",
        "Both an entry budget and a byte budget, or a budget without expected_entries to derive K from.",
        "A derived K above the max_period you allowed.",
    ),
    solutions=(
        "Give exactly one of budget_entries / budget_bytes, at least one entry's worth.",
        "Give expected_entries (typical prefix entries per step) or the period K directly.",
        "Raise the budget or max_period when the bound K is too large.",
    ),
    before=(
        "import kvcanary_numba as kc\n"
        "\n"
        "from kvcanary_numba.monitor import VerifyBudget\n"
        "\n"
        'full = kc.KvGroup(kind="full", num_slots=64, has_v=False)  # K only\n'
        "budget = VerifyBudget(budget_bytes=16, expected_entries=1_000_000)  # under one entry\n"
        "kc.CanaryMonitor(full=full, write_req_capacity=1, verify_budget=budget)"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "\n"
        "from kvcanary_numba.monitor import VerifyBudget\n"
        "\n"
        'full = kc.KvGroup(kind="full", num_slots=64, has_v=False)  # K only\n'
        "budget = VerifyBudget(budget_bytes=64 << 20, expected_entries=1_000_000)\n"
        "kc.CanaryMonitor(full=full, write_req_capacity=1, verify_budget=budget)"
    ),
    defensive="budget = VerifyBudget.from_period(k) if k > 1 else None  # None: full verification",
    prevention="Derive the budget from the detection delay you accept (K steps) rather than the other way round.",
    related=("KVC-M001",),
    extension=True,
)

define(
    "KVC-M022",
    title="Bundle directory unusable",
    message="{function}: bundle_dir {path} cannot be used as a directory: {reason}",
    meaning=(
        "With bundle_dir= the monitor writes one .npz violation bundle per readback that finds new rows. "
        "The directory is created at construction (parents included) so that a violation never fails "
        "later for lack of a place to write its bundle."
    ),
    triggers=(
        "bundle_dir names an existing file.",
        "No permission to create the directory (read-only file system, another user's path).",
    ),
    solutions=(
        "Pass a directory path that can be created or already exists and is writable.",
        "Leave bundle_dir unset (None) to write no bundles.",
    ),
    before=(
        "import kvcanary_numba as kc\n"
        "\n"
        'full = kc.KvGroup(kind="full", num_slots=64, has_v=False)  # K only\n'
        'kc.CanaryMonitor(full=full, write_req_capacity=1, bundle_dir="/proc/bundles")'
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "\n"
        'full = kc.KvGroup(kind="full", num_slots=64, has_v=False)  # K only\n'
        'kc.CanaryMonitor(full=full, write_req_capacity=1, bundle_dir="kv-bundles")  # made'
    ),
    defensive="bundle_dir = os.environ.get('KVCANARY_BUNDLES') or None",
    prevention="Put bundles next to the run's logs, on a writable disk.",
    related=("KVC-M020",),
    extension=True,
)
