"""Each fault class planted into the tiny engine, and the rows it produces (concepts/faults.md)."""

from kvcanary_numba import FailReason
from tiny_engine import TinyEngine

CHAIN = FailReason.VERIFY_CHAIN_HASH_MISMATCH
POSITION = FailReason.VERIFY_POSITION_MISMATCH
REAL_KV = FailReason.VERIFY_REAL_KV_HASH_MISMATCH
PREFILL = (
    1,
    0,
    [101, 102, 103, 104, 105, 106],
    [10, 11, 12, 13, 14, 15],
)  # slots 10..15 = positions 0..5
DECODE = (1, 6, [107], [16])


def prefilled() -> TinyEngine:
    engine = TinyEngine()
    assert engine.step([PREFILL]) == []
    return engine


def both(*rows):
    """The same rows from the HEAD and the TAIL launch (same canary state in both buffers)."""
    return [("HEAD_K_FULL", *r) for r in rows] + [("TAIL_K_FULL", *r) for r in rows]


# --8<-- [start:req_to_token]
engine = prefilled()
table = engine.req_to_token
# The page table swaps positions 2 and 3.
table[1, 2], table[1, 3] = table[1, 3], table[1, 2]
report = engine.step([DECODE])
# --8<-- [end:req_to_token]
assert report == both(
    (13, 3, CHAIN | POSITION), (12, 2, CHAIN | POSITION), (14, 4, CHAIN)
), report

# --8<-- [start:kv_flip]
engine = prefilled()
engine.kv[12, 0] ^= 0xFF  # one byte of the cached K of slot 12 flips
report = engine.step([DECODE])
# --8<-- [end:kv_flip]
assert report == [("TAIL_K_FULL", 12, 2, REAL_KV)], report

# --8<-- [start:slot_reuse]
engine = prefilled()
second = (2, 0, [201], [13])  # the allocator hands request 1's slot 13 to request 2
report_1 = engine.step([DECODE, second])
report_2 = engine.step([(1, 7, [108], [17]), (2, 1, [202], [20])])
# --8<-- [end:slot_reuse]
assert report_1 == [("TAIL_K_FULL", 13, 3, REAL_KV)], report_1
assert report_2 == both((13, 0, CHAIN | POSITION), (14, 4, CHAIN)), report_2

# --8<-- [start:position]
engine = prefilled()


def shift(write):  # the engine feeds position 7 instead of 6
    write["positions"] += 1


report_1 = engine.step([DECODE], corrupt=shift)
report_2 = engine.step([(1, 7, [108], [17])])
# --8<-- [end:position]
WRITE_POSITION = FailReason.WRITE_POSITION_MISMATCH
assert report_1 == both((16, 7, WRITE_POSITION)), report_1
assert report_2 == [
    ("HEAD_K_FULL", 16, 7, POSITION),
    ("HEAD_K_FULL", 17, 7, WRITE_POSITION),
    ("TAIL_K_FULL", 16, 7, POSITION),
    ("TAIL_K_FULL", 17, 7, WRITE_POSITION),
], report_2

# --8<-- [start:token]
engine = prefilled()


def flip(write):  # the model is fed token 999, the oracle expected 107
    write["input_ids"][0] = 999


report = engine.step([DECODE], corrupt=flip, check_inputs=True)
# --8<-- [end:token]
assert report == both((16, 6, FailReason.WRITE_TOKEN_MISMATCH)), report
print("every planted fault produced exactly the documented rows")
