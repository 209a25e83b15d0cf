"""Codes KVC-K008 … KVC-K014: hand-off digests and the monitor's record moves."""

from __future__ import annotations

from .registry import define

_SIDES = (
    "import numpy as np\n"
    "from kvcanary_numba import (CanaryContext, HandoffDigest, HandoffSignature,\n"
    "                            check_handoff_digest)\n"
    "signature = HandoffSignature.of(CanaryContext.allocate(num_slots=8))\n"
    "sent = HandoffDigest(signature=signature, digests=np.array([11, 22], dtype=np.int64))\n"
)
_MONITOR = (
    "import numpy as np\n"
    "from kvcanary_numba import CanaryMonitor, KvGroup\n"
    "full = KvGroup(kind='full', num_slots=16, has_v=False)\n"
    "monitor = CanaryMonitor(full=full, write_req_capacity=1, health_interval=0)\n"
    "old, new = np.array([3, 4], dtype=np.int64), np.array([8, 9], dtype=np.int64)\n"
)

define(
    "KVC-K008",
    title="Digest contexts of different fingerprint modes",
    message="{function}: the contexts of one hand-off digest must share one real_kv_hash_mode, got {got}",
    meaning=(
        "A layout signature names the fingerprint mode the live KV was folded with, and the sources "
        "folded, in order. The digests of several contexts (the K and V halves of a pool) combine into one "
        "value only if they fold the KV the same way; with no context there is no layout at all."
    ),
    triggers=(
        "Passing a HEAD context (NONE mode: HEAD launches fold no KV) with a TAIL context.",
        "Calling HandoffSignature.of() with no context.",
    ),
    solutions=(
        "Sign with the contexts the digests were computed with: the TAIL (or SWEEP) contexts of each half.",
        "Give every context of a pool the same real_kv_hash_mode.",
    ),
    before=(
        "import numpy as np\n"
        "from kvcanary_numba import CanaryContext, HandoffSignature, RealKvHashMode, RealKvSource\n"
        "kv = RealKvSource(tensor=np.zeros((8, 32), dtype=np.uint8), page_size=1,\n"
        "                  num_bytes_per_token=32, read_bytes=32)\n"
        "head = CanaryContext.allocate(num_slots=8)\n"
        "tail = CanaryContext.allocate(num_slots=8, real_kv_sources=(kv,),\n"
        "                              real_kv_hash_mode=RealKvHashMode.ALL)\n"
        "HandoffSignature.of(head, tail)"
    ),
    after=(
        "import numpy as np\n"
        "from kvcanary_numba import CanaryContext, HandoffSignature, RealKvHashMode, RealKvSource\n"
        "kv = RealKvSource(tensor=np.zeros((8, 32), dtype=np.uint8), page_size=1,\n"
        "                  num_bytes_per_token=32, read_bytes=32)\n"
        "tail = CanaryContext.allocate(num_slots=8, real_kv_sources=(kv,),\n"
        "                              real_kv_hash_mode=RealKvHashMode.ALL)\n"
        "HandoffSignature.of(tail)"
    ),
    defensive="assert len({ctx.real_kv_hash_mode for ctx in contexts}) == 1",
    prevention="Let the monitor sign its digests (CanaryMonitor.handoff_digest): it uses its TAIL contexts.",
    related=("KVC-K010",),
    extension=True,
)

define(
    "KVC-K009",
    title="Not a hand-off digest",
    message="{function}: {argument} must be a HandoffDigest (a layout signature and one digest per request), got {got}",
    exception="type",
    meaning=(
        "check_handoff_digest compares two sides only when both say how their digests were computed: a "
        "HandoffDigest pairs the digests with their layout signature (format version, fingerprint mode, "
        "sources, bytes per token). Bare arrays carry no layout, so a mode change on one side would read as "
        "corruption."
    ),
    triggers=(
        "Passing the out_digests array of compute_handoff_digest directly.",
        "Passing the signature instead of the digest.",
    ),
    solutions=(
        "Wrap each side: HandoffDigest(signature=HandoffSignature.of(ctx), digests=out_digests).",
        "Use CanaryMonitor.handoff_digest, which returns a HandoffDigest.",
    ),
    before=_SIDES + "check_handoff_digest(sent, np.array([11, 22], dtype=np.int64))",
    after=_SIDES
    + "landed = HandoffDigest(signature=signature, digests=np.array([11, 22], dtype=np.int64))\n"
    + "check_handoff_digest(sent, landed)",
    defensive="assert isinstance(landed, HandoffDigest)",
    prevention="Send the signature with the digests when a hand-off crosses engines (both are small).",
    related=("KVC-K010", "KVC-K012"),
    extension=True,
)

define(
    "KVC-K010",
    title="A digest without a layout signature",
    message="{function}: signature must be a HandoffSignature, got {got}",
    exception="type",
    meaning=(
        "The signature is what makes two digests comparable: it is checked before any digest is. It is a "
        "HandoffSignature, built from the contexts the digests were computed with."
    ),
    triggers=(
        "Passing a tuple or dict of the layout fields.",
        "Passing the context itself instead of HandoffSignature.of(context).",
    ),
    solutions=("Build it with HandoffSignature.of(*contexts).",),
    before=(
        "import numpy as np\n"
        "from kvcanary_numba import HandoffDigest\n"
        "HandoffDigest(signature=(1, 'ALL'), digests=np.zeros(2, dtype=np.int64))"
    ),
    after=(
        "import numpy as np\n"
        "from kvcanary_numba import CanaryContext, HandoffDigest, HandoffSignature\n"
        "ctx = CanaryContext.allocate(num_slots=8)\n"
        "HandoffDigest(signature=HandoffSignature.of(ctx), digests=np.zeros(2, dtype=np.int64))"
    ),
    defensive="signature = HandoffSignature.of(ctx)  # never assembled by hand",
    prevention="Keep the signature next to the context that computes the digests.",
    related=("KVC-K008", "KVC-K009"),
    extension=True,
)

define(
    "KVC-K011",
    title="The two sides digested different numbers of requests",
    message="{function}: landed must have one digest per request sent ({expected}), got {got}",
    meaning=(
        "Digests are compared request by request, in order: the sending side's digest r and the receiving "
        "side's digest r describe the same request. Different counts mean the two run tables listed "
        "different requests."
    ),
    triggers=(
        "The receiving side digested only the requests it accepted.",
        "One side's run table padded to a batch capacity.",
    ),
    solutions=(
        "Digest the same requests in the same order on both sides (the hand-off's request list).",
        "Slice both digests to the requests that were handed off.",
    ),
    before=_SIDES
    + "landed = HandoffDigest(signature=signature, digests=np.array([11], dtype=np.int64))\n"
    + "check_handoff_digest(sent, landed)",
    after=_SIDES
    + "landed = HandoffDigest(signature=signature, digests=np.array([11, 22], dtype=np.int64))\n"
    + "check_handoff_digest(sent, landed)",
    defensive="assert sent.digests.shape == landed.digests.shape",
    prevention="Build both sides' run tables from the hand-off's one list of requests.",
    related=("KVC-K012",),
    extension=True,
)

define(
    "KVC-K012",
    title="KV or records changed on the way",
    message=(
        "{function}: {count} of {total} requests arrived with a different digest (requests {runs}): their KV "
        "bytes or canary records are not what was sent"
    ),
    meaning=(
        "The hand-off digest of a request folds, in position order, every record (token, position, the "
        "predecessor's chain hash, the KV fingerprint) and the live fingerprint of every slot's KV bytes, "
        "and never a slot number. Both sides computed it under the same layout, so a difference means the "
        "request's KV or records changed between the two: bytes corrupted in transit or in host memory, a "
        "stale copy, pages swapped or missing, records not moved with their KV, or KV read from slots other "
        "than the page table says."
    ),
    triggers=(
        "A transfer that corrupted or dropped bytes (RDMA, host copy, storage tier).",
        "A reload into slots other than the receiving page table lists.",
        "Records left behind or taken from another request's slots.",
    ),
    solutions=(
        "Treat the request as a cache miss and recompute it: on_mismatch='miss' returns the mask.",
        "Localise the fault: verify_canary_records on the receiving side names the slots and the bits.",
    ),
    before=_SIDES
    + "landed = HandoffDigest(signature=signature, digests=np.array([11, 23], dtype=np.int64))\n"
    + "check_handoff_digest(sent, landed)",
    after=_SIDES
    + "landed = HandoffDigest(signature=signature, digests=np.array([11, 23], dtype=np.int64))\n"
    + "intact = check_handoff_digest(sent, landed, on_mismatch='miss')\n"
    + "recompute = np.flatnonzero(~intact)  # request 1: a cache miss",
    defensive="intact = check_handoff_digest(sent, landed, on_mismatch='miss')",
    prevention="Compute the receiving digest after the KV and records landed, from the receiving page table.",
    related=("KVC-K011", "KVC-K009"),
    extension=True,
)

define(
    "KVC-K013",
    title="Not records this monitor took",
    message="{function}: moved must be the MovedRecords of this monitor's buffers ({expected}), got {got}",
    meaning=(
        "CanaryMonitor.take_records returns a MovedRecords: one pack per canary buffer of the monitor (HEAD "
        "and TAIL, K and V, per group). put_records puts every pack back; records of a monitor with other "
        "groups or halves, or a bare array, leave some buffers without their records."
    ),
    triggers=(
        "Passing one pack (an array) instead of the MovedRecords.",
        "Putting records taken from a monitor with an SWA group into one without (or K-only into K and V).",
    ),
    solutions=(
        "Put back what take_records returned (to_host() / to_device(xp) keep its buffers).",
        "For packs of single buffers use scatter_canary_records with each buffer's context.",
    ),
    before=_MONITOR + "monitor.put_records(np.zeros((2, 32), dtype=np.uint8), new)",
    after=_MONITOR + "moved = monitor.take_records(old)\nmonitor.put_records(moved, new)",
    defensive="assert isinstance(moved, MovedRecords)",
    prevention="Keep MovedRecords objects whole in the host tier.",
    related=("KVC-K001", "KVC-M009"),
    extension=True,
)

define(
    "KVC-K014",
    title="No such group to compact",
    message="{function}: group must be one of the monitor's groups {kinds}, got {got!r}",
    meaning=(
        "move_records compacts one group's pool in that group's own slot numbers (an SWA pool compacts its "
        "SWA slots, the FULL pool its FULL slots). The group is named by kind, and the monitor must have it."
    ),
    triggers=("Compacting 'swa' on a monitor built without an SWA group.",),
    solutions=("Name a group the monitor has: 'full', or 'swa' when it was built with one.",),
    before=_MONITOR + "monitor.move_records(old, new, group='swa')",
    after=_MONITOR + "monitor.move_records(old, new, group='full')",
    defensive="assert group in [g.kind for g in monitor.groups]",
    prevention="Drive compaction from the allocator of the group it compacts.",
    related=("KVC-C009", "KVC-K003"),
    extension=True,
)
