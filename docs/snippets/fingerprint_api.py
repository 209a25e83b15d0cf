"""Real-KV fingerprints through the public API (concepts/fingerprints.md)."""

import numpy as np
from kvcanary_numba import RealKvHashMode, RealKvSource, compute_real_kv_hash
from kvcanary_numba.hashing import to_unsigned

pattern = [
    0x01,
    0x02,
    0x04,
    0x08,
    0x10,
    0x20,
    0x40,
    0x80,
    0x81,
    0x82,
    0x84,
    0x88,
    0x90,
    0xA0,
    0xC0,
    0xFF,
]

# --8<-- [start:api]
kv = np.zeros((8, 64), dtype=np.uint8)  # one KV layer as bytes: 8 slots x 64 bytes
kv[3, :16] = pattern
source = RealKvSource(tensor=kv, page_size=1, num_bytes_per_token=64, read_bytes=64)
out = np.zeros(2, dtype=np.int64)
compute_real_kv_hash(
    real_kv_sources=(source,),
    real_kv_hash_mode=RealKvHashMode.PARTIAL,
    slot_indices=np.array([3, 4]),
    out=out,
)
# 0x6041580849e6407d: PARTIAL folds the first 16 bytes of slot 3
print(hex(to_unsigned(out[0])))
# --8<-- [end:api]
assert to_unsigned(int(out[0])) == 0x6041580849E6407D

# --8<-- [start:paged]
# page_size 4: row = slot // 4, bytes from (slot % 4) * 16; slot 6: row 1, bytes 32..47
paged = RealKvSource(
    tensor=kv[:2, :64].copy(), page_size=4, num_bytes_per_token=16, read_bytes=16
)
paged.tensor[1, 32:48] = pattern
compute_real_kv_hash(
    real_kv_sources=(paged,),
    real_kv_hash_mode=RealKvHashMode.ALL,
    slot_indices=np.array([6, 0]),
    out=out,
)
print(hex(to_unsigned(out[0])))  # 0x6041580849e6407d again: same bytes, other address
# --8<-- [end:paged]
assert to_unsigned(int(out[0])) == 0x6041580849E6407D

# --8<-- [start:none]
compute_real_kv_hash(
    real_kv_sources=(source,),
    real_kv_hash_mode=RealKvHashMode.NONE,
    slot_indices=np.array([3, 4]),
    out=out,
)
print(out)  # [0 0]: NONE reads no bytes at all
# --8<-- [end:none]
assert out.tolist() == [0, 0]
