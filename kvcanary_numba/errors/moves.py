"""Codes KVC-K001 … KVC-K007: moving records (gather, scatter and move records, the run tables).

The other checks of these operations are the shared ones: KVC-V001 for the context, the
array codes KVC-C001 … KVC-C016, KVC-R007 … KVC-R009 for the real-KV sources and KVC-C017
for outputs sharing memory. Slot values are device data, as in a plan: a slot outside the
buffer becomes a violation row (bit 64), not an error.
"""

from __future__ import annotations

from .registry import define

_POOL = (
    "import numpy as np\n"
    "from kvcanary_numba import CanaryContext, gather_canary_records\n"
    "ctx = CanaryContext.allocate(num_slots=16)\n"
    "slots = np.array([3, 4, 5], dtype=np.int64)\n"
)
_RUNS = (
    "import numpy as np\n"
    "from kvcanary_numba import CanaryContext, verify_canary_records\n"
    "ctx = CanaryContext.allocate(num_slots=16)\n"
    "slots = np.array([3, 4, 5, 9, 10], dtype=np.int64)  # two requests: 3 slots, then 2\n"
)

define(
    "KVC-K001",
    title="A pack does not have one row per slot",
    message="{function}: {argument} must have one row per entry of {slots} ({expected}), got {got}",
    meaning=(
        "A pack holds the canary records of moved slots, one 32-byte row per slot, in the order of the "
        "slot list: row i is the record of slot_indices[i]. gather_canary_records (and compute_handoff_digest "
        "given out_records) fills one row per slot, "
        "scatter_canary_records puts row i at slot i, move_canary_records keeps every moved record in its "
        "scratch pack. A pack with more or fewer rows than there are slots would leave rows stale or have "
        "no record for a slot."
    ),
    triggers=(
        "Allocating the pack for the request's length, then taking only part of its slots (or the reverse).",
        "Reusing a pack of an earlier, larger move for a smaller one.",
        "Passing the whole host canary buffer instead of the rows of the slots that move.",
    ),
    solutions=(
        "Allocate the pack per move: np.empty((len(slot_indices), 32), dtype=np.uint8).",
        "Slice a larger pack to its first len(slot_indices) rows (a C-contiguous view).",
    ),
    before=_POOL
    + "pack = np.zeros((2, 32), dtype=np.uint8)  # two rows for three slots\n"
    + "gather_canary_records(context=ctx, slot_indices=slots, out_records=pack)",
    after=_POOL
    + "pack = np.zeros((len(slots), 32), dtype=np.uint8)\n"
    + "gather_canary_records(context=ctx, slot_indices=slots, out_records=pack)",
    defensive="pack = xp.empty((slot_indices.shape[0], CANARY_SLOT_BYTES), dtype=xp.uint8)",
    prevention="Keep a pack together with the slot list it was taken for (the monitor's MovedRecords does).",
    related=("KVC-K002", "KVC-C004"),
    extension=True,
)

define(
    "KVC-K002",
    title="A pack row is not 32 bytes",
    message="{function}: {argument} must be uint8 [n, {expected}] (one 32-byte record per row), got shape {got}",
    meaning=(
        "A record is 32 bytes: token, position, the predecessor's chain hash and the KV fingerprint, four "
        "little-endian int64 fields, the canary buffer's format. A pack row is exactly one record, whatever "
        "the stride of the canary buffer it came from (a buffer with a wider stride keeps padding the pack "
        "does not carry)."
    ),
    triggers=(
        "Allocating the pack with the canary buffer's stride instead of 32 bytes.",
        "Passing a pack viewed as int64 [n, 4] (the same bytes, another dtype: KVC-C002) or flattened.",
    ),
    solutions=(
        "Allocate uint8 [n, 32] (kvcanary_numba.CANARY_SLOT_BYTES columns).",
        "View an int64 [n, 4] array as uint8 first: records.view(np.uint8).",
    ),
    before=_POOL
    + "pack = np.zeros((3, 64), dtype=np.uint8)  # rows of the buffer's stride\n"
    + "gather_canary_records(context=ctx, slot_indices=slots, out_records=pack)",
    after=_POOL
    + "pack = np.zeros((3, 32), dtype=np.uint8)  # one 32-byte record per slot\n"
    + "gather_canary_records(context=ctx, slot_indices=slots, out_records=pack)",
    defensive="assert pack.dtype == np.uint8 and pack.shape[1] == CANARY_SLOT_BYTES",
    prevention="Allocate packs with one helper that takes only the number of slots.",
    related=("KVC-K001", "KVC-C012"),
    extension=True,
)

define(
    "KVC-K003",
    title="Source and destination slot lists differ in length",
    message="{function}: dst_slot_indices must have as many entries as src_slot_indices ({expected}), got {got}",
    meaning=(
        "A move within a pool gives slot dst[i] the record of slot src[i]: the two lists are pairs, "
        "entry by entry, as the engine's KV copy is. A list longer than the other has entries with no "
        "partner."
    ),
    triggers=(
        "Building the destination list from a free list that had fewer free slots than the move needed.",
        "Passing a compaction's whole new layout as destinations but only the moving slots as sources.",
    ),
    solutions=(
        "Move exactly the pairs the KV copy moved: the same src and dst arrays.",
        "Drop the entries that do not move (a slot that stays needs no entry).",
    ),
    before=(
        "import numpy as np\n"
        "from kvcanary_numba import CanaryContext, move_canary_records\n"
        "ctx = CanaryContext.allocate(num_slots=16)\n"
        "src, dst = np.array([5, 6, 7], dtype=np.int64), np.array([1, 2], dtype=np.int64)\n"
        "scratch = np.zeros((3, 32), dtype=np.uint8)\n"
        "move_canary_records(context=ctx, src_slot_indices=src, dst_slot_indices=dst,\n"
        "                    scratch_records=scratch)"
    ),
    after=(
        "import numpy as np\n"
        "from kvcanary_numba import CanaryContext, move_canary_records\n"
        "ctx = CanaryContext.allocate(num_slots=16)\n"
        "src, dst = np.array([5, 6, 7], dtype=np.int64), np.array([1, 2, 3], dtype=np.int64)\n"
        "scratch = np.zeros((3, 32), dtype=np.uint8)\n"
        "move_canary_records(context=ctx, src_slot_indices=src, dst_slot_indices=dst,\n"
        "                    scratch_records=scratch)"
    ),
    defensive="assert src.shape == dst.shape  # the KV copy's pairs",
    prevention="Derive the record move from the same (src, dst) pairs as the KV copy.",
    related=("KVC-K001", "KVC-C004"),
    extension=True,
)

define(
    "KVC-K004",
    title="The run table has no entry",
    message="{function}: run_offsets must have num_runs + 1 >= 1 entries (0, then the end of each run), got shape {got}",
    meaning=(
        "A moved set is described as runs: run r is entries [run_offsets[r], run_offsets[r + 1]) of "
        "slot_indices, the slots of consecutive positions of one request. The table starts with 0 and "
        "holds the end of every run, so it has one entry more than there are runs, and at least one."
    ),
    triggers=(
        "Passing the run lengths' cumulative sum without the leading 0, for no run at all.",
        "Passing an empty array where the set is empty: the table of no run is [0].",
    ),
    solutions=(
        "Build the table as np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64).",
        "For an empty set pass np.zeros(1, dtype=np.int64) and empty per-run arrays.",
    ),
    before=_RUNS
    + "none = np.zeros(0, dtype=np.int64)\n"
    + "verify_canary_records(context=ctx, slot_indices=none, run_offsets=none,\n"
    + "                      run_start_positions=none, run_prev_slots=none)",
    after=_RUNS
    + "none = np.zeros(0, dtype=np.int64)\n"
    + "verify_canary_records(\n"
    + "    context=ctx, slot_indices=none, run_offsets=np.zeros(1, dtype=np.int64),\n"
    + "    run_start_positions=none, run_prev_slots=none,\n"
    + ")",
    defensive="offsets = np.zeros(len(lengths) + 1, dtype=np.int64); np.cumsum(lengths, out=offsets[1:])",
    prevention="Build run tables with one helper from the runs' lengths.",
    related=("KVC-K005", "KVC-K006"),
    extension=True,
)

define(
    "KVC-K005",
    title="Slots without a run",
    message="{function}: run_offsets names no run, but slot_indices has {got} entries",
    meaning=(
        "Every slot of a moved set belongs to a run (its position and predecessor come from the run). A "
        "run table with no run ([0]) fits only an empty slot list."
    ),
    triggers=("Passing [0] as the table of a set that has slots: each request is one run [0, n].",),
    solutions=("Give every request its run: run_offsets = [0, n] for one request of n slots.",),
    before=_RUNS
    + "one = np.zeros(1, dtype=np.int64)\n"
    + "none = np.zeros(0, dtype=np.int64)\n"
    + "verify_canary_records(context=ctx, slot_indices=slots, run_offsets=one,\n"
    + "                      run_start_positions=none, run_prev_slots=none)",
    after=_RUNS
    + "verify_canary_records(\n"
    + "    context=ctx, slot_indices=slots, run_offsets=np.array([0, 3, 5], dtype=np.int64),\n"
    + "    run_start_positions=np.array([0, 0], dtype=np.int64),\n"
    + "    run_prev_slots=np.array([-1, -1], dtype=np.int64),\n"
    + ")",
    defensive="assert run_offsets.shape[0] > 1 or slot_indices.shape[0] == 0",
    prevention="Build the run table from the same requests as the slot list.",
    related=("KVC-K004", "KVC-K006"),
    extension=True,
)

define(
    "KVC-K006",
    title="The run table does not cover the slots in order",
    message="{function}: run_offsets must run from 0 to len(slot_indices) = {n} without going down, but it {got}",
    meaning=(
        "Run r is entries [run_offsets[r], run_offsets[r + 1]) of slot_indices: the table starts at 0, "
        "never goes down, and ends at the number of slots, so that every slot is in exactly one run. The "
        "values are checked for host (NumPy) tables; a device table is data the kernels read without "
        "trusting it (a run outside the slots records a bit-256 row)."
    ),
    triggers=(
        "Passing the run lengths instead of their cumulative sum.",
        "A table built for another slot list (a longer request, a padded batch).",
        "Runs concatenated in one order and the table built in another.",
    ),
    solutions=(
        "run_offsets = np.concatenate([[0], np.cumsum(lengths)]) over the runs in slot_indices' order.",
        "Rebuild the table whenever the slot list changes.",
    ),
    before=_RUNS
    + "verify_canary_records(\n"
    + "    context=ctx, slot_indices=slots, run_offsets=np.array([0, 3, 2], dtype=np.int64),\n"
    + "    run_start_positions=np.array([0, 0], dtype=np.int64),\n"
    + "    run_prev_slots=np.array([-1, -1], dtype=np.int64),\n"
    + ")",
    after=_RUNS
    + "verify_canary_records(\n"
    + "    context=ctx, slot_indices=slots, run_offsets=np.array([0, 3, 5], dtype=np.int64),\n"
    + "    run_start_positions=np.array([0, 0], dtype=np.int64),\n"
    + "    run_prev_slots=np.array([-1, -1], dtype=np.int64),\n"
    + ")",
    defensive="assert offsets[0] == 0 and offsets[-1] == len(slots) and (np.diff(offsets) >= 0).all()",
    prevention="Build each run table next to its slot list, from the same runs.",
    related=("KVC-K004", "KVC-K005", "KVC-S001"),
    extension=True,
)

define(
    "KVC-K007",
    title="A run starts at an impossible position",
    message="{function}: run_start_positions[{run}] must be >= 0 with room for its {length} positions in int64, got {got}",
    meaning=(
        "Run r holds positions run_start_positions[r], run_start_positions[r] + 1, ...: the position of "
        "each slot is checked against its record. A negative start, or one so large that the run's last "
        "position does not fit in int64, names positions no token can have. Checked for host (NumPy) "
        "tables."
    ),
    triggers=(
        "Passing the run's end position instead of its start.",
        "A start position of -1 meant as 'unknown' (pass the real position: records always hold one).",
    ),
    solutions=(
        "Pass the position of each run's first slot (0 for a request's first token).",
        "To check only chain links and KV of a run whose position is unknown, use verify with a plan.",
    ),
    before=_RUNS
    + "verify_canary_records(\n"
    + "    context=ctx, slot_indices=slots, run_offsets=np.array([0, 3, 5], dtype=np.int64),\n"
    + "    run_start_positions=np.array([0, -1], dtype=np.int64),\n"
    + "    run_prev_slots=np.array([-1, 0], dtype=np.int64),\n"
    + ")",
    after=_RUNS
    + "verify_canary_records(\n"
    + "    context=ctx, slot_indices=slots, run_offsets=np.array([0, 3, 5], dtype=np.int64),\n"
    + "    run_start_positions=np.array([0, 0], dtype=np.int64),\n"
    + "    run_prev_slots=np.array([-1, -1], dtype=np.int64),\n"
    + ")",
    defensive="assert (run_start_positions >= 0).all()",
    prevention="Take run start positions from the engine's request state (its prefix length).",
    related=("KVC-K006",),
    extension=True,
)
