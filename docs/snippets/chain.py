"""The canary record and its hash chain, computed by hand (concepts/record-and-chain.md)."""

import numpy as np
from kvcanary_numba import CANARY_CHAIN_ANCHOR, CANARY_CHAIN_HEAD
from kvcanary_numba.hashing import splitmix64, splitmix64_mix3, to_signed

# --8<-- [start:head]
head = splitmix64(CANARY_CHAIN_ANCHOR)  # prev_hash of every chain's first slot
print(hex(head))  # 0xde7fae23a9a1b716
# --8<-- [end:head]
assert head == CANARY_CHAIN_HEAD == 0xDE7FAE23A9A1B716

# --8<-- [start:link]
# Two tokens of one request: 101 at position 0, then 202 at position 1.
prev_hash_0 = head  # position 0 stores the chain head
prev_hash_1 = splitmix64_mix3(prev_hash_0, 101, 0)  # S(S(S(prev_hash) ^ token) ^ pos)
print(hex(prev_hash_1))  # 0x542fe5061275a6ab
# --8<-- [end:link]
assert prev_hash_1 == 0x542FE5061275A6AB
assert prev_hash_1 == splitmix64(splitmix64(splitmix64(prev_hash_0) ^ 101) ^ 0)

# --8<-- [start:record]
# One canary slot = 4 little-endian int64 fields in a uint8 row of >= 32 bytes.
canary_buf = np.zeros((16, 32), dtype=np.uint8)
record = canary_buf[5].view(np.int64)  # token, position, prev_hash, real_kv_hash
record[:] = [202, 1, to_signed(prev_hash_1), 0]
print(canary_buf[5, :16])  # [202 0 0 0 0 0 0 0 1 0 ...]: token 202, then position 1
# --8<-- [end:record]
assert canary_buf[5, 0] == 0xCA and canary_buf[5, 8] == 1
assert int(canary_buf[5].view(np.int64)[2]) == to_signed(0x542FE5061275A6AB)
