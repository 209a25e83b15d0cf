"""Constants and on-device layouts shared by every backend.

Everything here is part of the bit-compatible contract with SGLang's kv-canary:
changing a value changes the bytes written into canary buffers and violation
rings. Extensions beyond SGLang are marked as such and only use values SGLang
never produces.
"""

from __future__ import annotations

import enum
from typing import Final

import numpy as np

# --- chain ------------------------------------------------------------------

#: Seed of every chain; the stored chain head is ``splitmix64`` of it.
CANARY_CHAIN_ANCHOR: Final[int] = 0xC0FFEE1234567890
#: ``splitmix64(CANARY_CHAIN_ANCHOR)``, the prev_hash stored in a chain's first slot.
CANARY_CHAIN_HEAD: Final[int] = 0xDE7FAE23A9A1B716

SPLITMIX64_MUL1: Final[int] = 0xBF58476D1CE4E5B9
SPLITMIX64_MUL2: Final[int] = 0x94D049BB133111EB
UINT64_MASK: Final[int] = (1 << 64) - 1

# --- padding rules ----------------------------------------------------------

#: ``req_to_token`` row 0 is the cuda-graph padding row; real requests use rows >= 1.
REQ_POOL_IDX_PADDING: Final[int] = 0
#: KV slot 0 is the dummy slot padded tokens write into; verify never checks it.
TOKEN_TO_KV_SLOT_PADDING: Final[int] = 0
#: Seed / prev index meaning "no predecessor": the chain anchors on CANARY_CHAIN_HEAD.
NO_PREDECESSOR: Final[int] = -1
#: Expected token meaning "do not check the token".
EXPECTED_TOKEN_UNCHECKED: Final[int] = -1
#: Extension: index the plan emits when it cannot resolve a slot (request row or
#: position outside ``req_to_token``, slot outside the SWA LUT). Larger than any
#: canary buffer, so verify and write report it as out of range instead of
#: reading memory. SGLang never produces it.
OUT_OF_RANGE_SLOT: Final[int] = (1 << 63) - 1

# --- canary slot record -----------------------------------------------------

CANARY_FIELDS_PER_SLOT: Final[int] = 4
CANARY_SLOT_BYTES: Final[int] = CANARY_FIELDS_PER_SLOT * 8
FIELD_TOKEN: Final[int] = 0
FIELD_POSITION: Final[int] = 1
FIELD_PREV_HASH: Final[int] = 2
FIELD_REAL_KV_HASH: Final[int] = 3

# --- violation ring ---------------------------------------------------------

VIOLATION_FIELDS: Final[int] = 8
ROW_KERNEL_KIND: Final[int] = 0
ROW_SLOT_IDX: Final[int] = 1
ROW_POSITION: Final[int] = 2
ROW_STORED_TOKEN: Final[int] = 3
ROW_EXPECTED_TOKEN: Final[int] = 4
ROW_STORED_CHAIN_HASH: Final[int] = 5
ROW_EXPECTED_AUX: Final[int] = 6
ROW_FAIL_REASON: Final[int] = 7
#: The violation write index (int32) saturates here: a row recorded at this index or above is
#: neither kept nor counted, so the index never wraps back over the first rows kept. The
#: 2**24 below the int32 limit leave room for the adds in flight on a GPU (each thread that
#: sees the limit takes its add back; far fewer threads are ever resident at once).
VIOLATION_INDEX_SATURATED: Final[int] = (1 << 31) - (1 << 24)
VIOLATION_FIELD_NAMES: Final[tuple[str, ...]] = (
    "kernel_kind",
    "slot_idx",
    "position",
    "stored_token",
    "expected_token",
    "stored_chain_hash",
    "expected_aux",
    "fail_reason",
)


class FailReason(enum.IntFlag):
    """Bits of a violation row's ``fail_reason`` field.

    The first six are SGLang's, with SGLang's values. The rest are extensions of
    this package: SGLang reads out-of-range indices as undefined behaviour, we
    report them instead of touching memory outside the buffers.
    """

    VERIFY_CHAIN_HASH_MISMATCH = 1
    VERIFY_POSITION_MISMATCH = 2
    VERIFY_REAL_KV_HASH_MISMATCH = 4
    WRITE_TOKEN_MISMATCH = 8
    WRITE_POSITION_MISMATCH = 16
    VERIFY_TOKEN_MISMATCH = 32
    # Extensions (not in SGLang).
    SLOT_OUT_OF_RANGE = 64
    PREV_SLOT_OUT_OF_RANGE = 128
    WRITE_RANGE_OUT_OF_BOUNDS = 256


#: FailReason bits as int64 scalars, for compiled code (the Numba CPU passes and the CUDA
#: kernels), where an IntFlag member cannot be used and mixing int widths would promote.
FAIL_CHAIN = np.int64(FailReason.VERIFY_CHAIN_HASH_MISMATCH)
FAIL_POSITION = np.int64(FailReason.VERIFY_POSITION_MISMATCH)
FAIL_REAL_KV = np.int64(FailReason.VERIFY_REAL_KV_HASH_MISMATCH)
FAIL_WRITE_TOKEN = np.int64(FailReason.WRITE_TOKEN_MISMATCH)
FAIL_WRITE_POSITION = np.int64(FailReason.WRITE_POSITION_MISMATCH)
FAIL_TOKEN = np.int64(FailReason.VERIFY_TOKEN_MISMATCH)
FAIL_SLOT_RANGE = np.int64(FailReason.SLOT_OUT_OF_RANGE)
FAIL_PREV_RANGE = np.int64(FailReason.PREV_SLOT_OUT_OF_RANGE)
FAIL_WRITE_RANGE = np.int64(FailReason.WRITE_RANGE_OUT_OF_BOUNDS)

#: FailReason bits added by kvcanary_numba.
EXTENSION_FAIL_REASON_MASK: Final[int] = 64 | 128 | 256


def fail_reason_label(bit: FailReason) -> str:
    """SGLang's report label of one bit: the name lower-cased minus ``_mismatch``."""
    return bit.name.lower().removesuffix("_mismatch")


class RealKvHashMode(enum.IntEnum):
    """How many bytes of the real KV a slot's fingerprint folds."""

    NONE = 0
    PARTIAL = 1
    ALL = 2


class CanaryLaunchTag(enum.IntEnum):
    """Which launch wrote a violation row: (HEAD | TAIL | SWEEP) x (K | V) x (FULL | SWA)."""

    HEAD_K_FULL = 0
    HEAD_V_FULL = 1
    TAIL_K_FULL = 2
    TAIL_V_FULL = 3
    SWEEP_K_FULL = 4
    SWEEP_V_FULL = 5
    HEAD_K_SWA = 6
    HEAD_V_SWA = 7
    TAIL_K_SWA = 8
    TAIL_V_SWA = 9
    SWEEP_K_SWA = 10
    SWEEP_V_SWA = 11


NUM_LAUNCH_TAGS: Final[int] = len(CanaryLaunchTag)
#: Endpoints (launch contexts) one endpoint launch serves: the K and V halves of a monitor
#: group's phase (``fast/endpoints.py``, ``fast/kernels/endpoints.py``).
MAX_ENDPOINTS: Final[int] = 2

# --- real-KV sources --------------------------------------------------------

MAX_REAL_KV_SOURCES: Final[int] = 4
#: Bytes folded per slot and source in PARTIAL mode.
PARTIAL_READ_BYTES: Final[int] = 16
#: Real-KV reads are whole 16-byte vectors (lo word, then hi word).
REAL_KV_ALIGN_BYTES: Final[int] = 16

# --- launch shapes ----------------------------------------------------------

PLAN_BLOCK_SIZE: Final[int] = 128
WARP_SIZE: Final[int] = 32

# --- defaults ---------------------------------------------------------------

DEFAULT_RING_CAPACITY: Final[int] = 1024

# --- moved records (extension) ------------------------------------------------

#: Seed of every hand-off digest entry (``KVCMOVED`` in ASCII); an extension, SGLang has no digest.
HANDOFF_DIGEST_ANCHOR: Final[int] = 0x4B56434D4F564544
#: Version of the hand-off digest's definition, part of its layout signature.
HANDOFF_DIGEST_VERSION: Final[int] = 1
# --- verdict word (extension) -------------------------------------------------

#: int32 lanes of a monitor's per-step verdict word (``kernels/verdict.py``). Every lane is
#: >= 0 and ranks combine their words with one element-wise max (NCCL's ``ncclMax``, any
#: engine's max all-reduce): each flag lane is then "any rank", each count lane "the most".
VERDICT_LANES: Final[int] = 16
#: Lane 0: :data:`VERDICT_MAGIC`, the word's format (a word the engine mixed up fails it).
VERDICT_FORMAT: Final[int] = 0
#: Lane 1: verdicts this monitor has written (one per TAIL phase), saturating at 2**31 - 1.
VERDICT_SEQ: Final[int] = 1
#: Lane 2: violation rows recorded since the previous verdict (stored or not), saturating.
VERDICT_NEW_ROWS: Final[int] = 2
#: Lane 3: rank + 1 when lane 2 is positive, else 0 (merged: the highest rank with new rows).
VERDICT_RANK: Final[int] = 3
#: Lane 4: 1 when the ring is full (rows are counted, not kept).
VERDICT_RING_FULL: Final[int] = 4
#: Lane 5: 1 when a group's plan of this step overflowed its verify capacity (verify skipped).
VERDICT_PLAN_OVERFLOW: Final[int] = 5
#: Lane 6: 1 once a health check found launches that did not run (sticky).
VERDICT_STALLED: Final[int] = 6
#: Lanes 7 .. 15: lane 7 + b is 1 when a new row has FailReason bit ``1 << b``.
VERDICT_FAIL_BITS: Final[int] = 7
#: Lane 0's value: "KV" and format 1.
VERDICT_MAGIC: Final[int] = 0x4B560001
