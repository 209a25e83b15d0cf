"""Codes KVC-M020 …: violation bundles and budgeted verification of the CanaryMonitor (extensions).

Reading a bundle (KVC-M020, KVC-M030 … KVC-M033) checks the file before it trusts it:
``kvcanary_numba/monitor/bundle_file.py`` and ``bundle_check.py`` say in which order.
"""

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
        "A path that does not exist, an empty file, or a file that is not an .npz archive (a log).",
        "An .npz written by something else: a member missing or one the format does not have "
        "(pickled objects are never read).",
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
    related=("KVC-M022", "KVC-M030", "KVC-M031", "KVC-M032", "KVC-M033"),
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

_LOAD = "from kvcanary_numba.monitor.bundle import load_bundle\n"
_EMPTY_BUNDLE = (
    "import json\n"
    "import numpy as np\n" + _LOAD + "shapes = dict(rows=(0, 8), row_steps=0, entries=(0, 5), entry_origin=0,\n"
    "              records=(0, 6), kv_lengths=(0, 4))\n"
    "arrays = {{k: np.zeros(s, np.int64) for k, s in shapes.items()}}\n"
    "config = dict(format=1, kvcanary_numba='0.1.0', step={step}, device='cpu',\n"
    "              real_kv_hash_mode=0, check_verify_expected_token=False,\n"
    "              num_slots={{'FULL': 16}})\n"
    "np.savez('{name}', kv=np.zeros((0, 4, 0), np.uint8),\n"
    "         config=np.array(json.dumps(config)), **arrays)\n"
)

define(
    "KVC-M030",
    title="Bundle path is not a regular file",
    message="{function}: {path} is not a kvcanary violation bundle: {reason}",
    meaning=(
        "A bundle is one regular .npz file. A directory, a FIFO (named pipe), a socket or a device is "
        "refused from its file status alone, before anything is opened for reading: reading a FIFO "
        "would wait for a writer that may never come, and a device may never end. A symbolic link is "
        "followed and its target must be a regular file."
    ),
    triggers=(
        "Passing the bundle directory instead of one bundle in it.",
        "A named pipe or /dev/stdin given as the path (a bundle cannot be streamed in).",
    ),
    solutions=(
        "Pass one file from the directory (monitor.bundles lists the paths written).",
        "Copy a streamed bundle to a file first.",
    ),
    before=_LOAD + "load_bundle('.')  # the directory, not a bundle in it",
    after=(
        "import pathlib\n" + _LOAD + "for path in sorted(pathlib.Path('.').glob('kvcanary-step*.npz')):\n"
        "    load_bundle(path)"
    ),
    defensive="paths = [p for p in pathlib.Path(bundle_dir).glob('*.npz') if p.is_file()]",
    prevention="Keep the paths the monitor reports (monitor.bundles) rather than building them by hand.",
    related=("KVC-M020",),
    extension=True,
)

define(
    "KVC-M031",
    title="Bundle larger than the reading limit",
    message="{function}: {path} is not read as a kvcanary violation bundle: {reason}",
    meaning=(
        "Reading a bundle allocates its arrays, so the sizes are checked first: the file on disk, "
        "the sizes its zip members declare once inflated, and the shape in each array's header. "
        "Each must be within max_bytes (1 GiB by default; load_bundle(max_bytes=...) and `kvcanary "
        "inspect --max-bytes` raise it). A small file that claims to inflate to gigabytes, or an "
        "array header claiming a terabyte, is refused before any of it is inflated or allocated."
    ),
    triggers=(
        "A bundle of a very large run (many rows, ALL-mode KV bytes of many slots).",
        "A crafted or damaged file whose members claim huge sizes (a zip bomb).",
    ),
    solutions=(
        "Raise the limit for a bundle you trust: load_bundle(path, max_bytes=8 << 30) or "
        "kvcanary inspect PATH --max-bytes 8589934592.",
        "Use a smaller ring_capacity or PARTIAL mode so that bundles stay small.",
    ),
    before=_EMPTY_BUNDLE.format(step="12", name="bundle.npz")
    + "load_bundle('bundle.npz', max_bytes=1000)  # a limit below the file's size",
    after=_EMPTY_BUNDLE.format(step="12", name="bundle.npz") + "load_bundle('bundle.npz')  # 1 GiB by default",
    defensive="bundle = load_bundle(path, max_bytes=min(free_memory // 4, 8 << 30))",
    prevention="Bound what one bundle holds: ring_capacity and the real-KV hash mode decide its size.",
    related=("KVC-M020", "KVC-M032"),
    extension=True,
)

define(
    "KVC-M032",
    title="Bundle damaged",
    message="{function}: {path} is a damaged kvcanary violation bundle: {reason}",
    meaning=(
        "The file looks like a bundle but cannot be read whole: the zip archive ends early, a "
        "member fails its CRC or does not inflate, an array header does not parse or does not "
        "match the bytes stored, or the arrays differ from the SHA-256 digest the monitor wrote "
        "into the config. Replaying such a file could report 'not reproduced' for evidence that "
        "was only damaged, so it is refused instead."
    ),
    triggers=(
        "A copy cut short (an interrupted transfer, a full disk while copying).",
        "Bytes flipped on disk or in transit, or an array edited and the archive re-packed.",
    ),
    solutions=(
        "Copy the bundle again from where the monitor wrote it (binary mode, whole file).",
        "Re-run with bundle_dir= to write a fresh bundle.",
    ),
    before=_EMPTY_BUNDLE.format(step="12", name="whole.npz") + "data = open('whole.npz', 'rb').read()\n"
    "open('cut.npz', 'wb').write(data[: len(data) - 30])  # a copy cut short\n"
    "load_bundle('cut.npz')",
    after=_EMPTY_BUNDLE.format(step="12", name="whole.npz") + "load_bundle('whole.npz')  # the whole file",
    defensive="shutil.copyfile(src, dst)  # then compare sizes: os.path.getsize(src) == os.path.getsize(dst)",
    prevention="Move bundles with tools that check what they copy (rsync, checksums).",
    related=("KVC-M020", "KVC-M031", "KVC-M033"),
    extension=True,
)

define(
    "KVC-M033",
    title="Bundle outside its schema",
    message="{function}: {path} does not follow the kvcanary bundle schema: {reason}",
    meaning=(
        "A bundle's config is a JSON object with exactly the format's keys, each of its type and "
        "range (format, kvcanary_numba, step, device, real_kv_hash_mode, "
        "check_verify_expected_token, num_slots; digest optional), and its arrays agree with each "
        "other and with the config: int64 rows [n, 8] and row_steps [n], entries [m, 5] and "
        "entry_origin [m], records [k, 6], uint8 kv [k, 4, b] and kv_lengths [k, 4]; known launch "
        "tags and fail bits, in-range record slots, a record for every in-range slot an entry "
        "names, an entry for every row a replay verifies. A replay of anything else could misread "
        "it, so it is refused."
    ),
    triggers=(
        "A config edited by hand or by a tool that changed types (a number quoted as a string).",
        "Arrays of another dtype or shape, or values out of range (a tag past 11, a slot past the buffer).",
        "Members of one bundle mixed with another's.",
    ),
    solutions=(
        "Use the bundle as the monitor wrote it; to experiment, edit the dict load_bundle returns "
        "and pass it to replay_bundle (it is checked the same way).",
    ),
    before=_EMPTY_BUNDLE.format(step="'12'", name="edited.npz") + "load_bundle('edited.npz')",
    after=_EMPTY_BUNDLE.format(step="12", name="edited.npz") + "load_bundle('edited.npz')",
    defensive="bundle = load_bundle(path); bundle['kv'][0, 0, 0] ^= 1; replay_bundle(bundle)",
    prevention="Treat bundles as read-only evidence; edit copies in memory, not files.",
    related=("KVC-M020", "KVC-M032"),
    extension=True,
)
