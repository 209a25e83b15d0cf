"""The real-KV fingerprint folded by hand (concepts/fingerprints.md)."""

import struct

from kvcanary_numba.hashing import splitmix64


# --8<-- [start:fold]
def fold(strip: bytes) -> int:
    """One slot's bytes of one source: little-endian u64 words, acc = S(acc ^ w)."""
    acc = 0
    for (word,) in struct.iter_unpack("<Q", strip):
        acc = splitmix64(acc ^ word)
    return acc


def real_kv_hash(strips: list[bytes]) -> int:
    """Fold the per-source results in source order: acc = S(acc ^ fold_s) from 0."""
    acc = 0
    for strip in strips:
        acc = splitmix64(acc ^ fold(strip))
    return acc


pattern = bytes(
    [
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
)
print(hex(fold(pattern)))  # 0xf036e30b6961c78d
print(hex(real_kv_hash([pattern])))  # 0x6041580849e6407d, what field 3 stores
# --8<-- [end:fold]
assert fold(pattern) == 0xF036E30B6961C78D
assert real_kv_hash([pattern]) == 0x6041580849E6407D
# Source order matters.
other = bytes(range(16))
assert real_kv_hash([pattern, other]) != real_kv_hash([other, pattern])
