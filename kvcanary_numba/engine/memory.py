"""Memory of the toy engine: page and slot allocators, and the KV pool itself.

The KV pool stores per layer a K and a V array of shape
``[rows, page_size * bytes_per_token]`` (uint8), so a real-KV source over layer 0
is simply ``RealKvSource(tensor=k[0], page_size=page_size, ...)``. The bytes a
token gets are a deterministic function of (token, position, layer, half), so
any later change to them is a corruption the canary must see.
"""

from __future__ import annotations

import numpy as np

from ..constants import RealKvHashMode
from ..context import RealKvSource
from ..hashing import splitmix64_array

__all__ = ["FreeList", "KvPool", "kv_bytes"]

_K_TOKEN = np.uint64(0x9E3779B97F4A7C15)
_K_POSITION = np.uint64(0xC2B2AE3D27D4EB4F)
_K_LANE = np.uint64(0x165667B19E3779F9)


class FreeList:
    """LIFO free list of unit ids ``1 .. count - 1`` with an owner per unit.

    Unit 0 is reserved: page 0 holds slot 0, SGLang's padding slot, where padded tokens
    write and which verify never checks, so a real token must never get it (the monitor
    warns once if one does: ``CanarySlotZeroWarning``). LIFO order makes reuse of a
    freed unit immediate, which is what exposes use-after-free bugs quickly.
    ``owner[u]`` is the request id holding unit ``u`` (0 when free); a unit is
    only returned by :meth:`free` when the caller still owns it, so an injected
    double allocation cannot corrupt the list itself.
    """

    def __init__(self, count: int):
        self.count = count
        self.owner = np.zeros(count, dtype=np.int64)
        self._free = list(range(count - 1, 0, -1))  # pop() hands out 1, 2, 3 ...
        self.forced: tuple[int, int] | None = None  # (unit, not_for_owner): fault hook

    @property
    def available(self) -> int:
        return len(self._free)

    def alloc(self, owner: int) -> int:
        """Hand one unit (page or slot, never 0: the padding unit) to ``owner`` (a positive request id)."""
        if self.forced is not None and self.forced[1] != owner:
            unit, self.forced = self.forced[0], None
        else:
            unit = self._free.pop()
        self.owner[unit] = owner
        return unit

    def free(self, unit: int, owner: int) -> None:
        """Return ``unit`` if ``owner`` still holds it (else it was taken over: leave it)."""
        if self.owner[unit] == owner:
            self.owner[unit] = 0
            self._free.append(unit)

    def transfer(self, unit: int, old: int, new: int) -> None:
        """Move ownership (e.g. from a request to the prefix cache)."""
        if self.owner[unit] == old:
            self.owner[unit] = new


def kv_bytes(tokens: np.ndarray, positions: np.ndarray, lane: int, bytes_per_token: int) -> np.ndarray:
    """KV bytes of tokens at positions for one (layer, half) lane.

    Returns uint8 ``[n, bytes_per_token]``: splitmix64 of a mix of token,
    position, lane and word index, little-endian.
    """
    words = bytes_per_token // 8
    t = tokens.astype(np.uint64).reshape(-1, 1)
    p = positions.astype(np.uint64).reshape(-1, 1)
    w = np.arange(words, dtype=np.uint64).reshape(1, -1) + np.uint64(lane * words)
    mixed = (t * _K_TOKEN) ^ (p * _K_POSITION) ^ (w * _K_LANE)
    return splitmix64_array(mixed).astype("<u8").view(np.uint8).reshape(len(tokens), bytes_per_token)


class KvPool:
    """K and V bytes of ``num_layers`` layers for ``num_slots`` slots.

    Parameters
    ----------
    num_slots, page_size, bytes_per_token, num_layers : int
        Geometry; ``num_slots`` is a multiple of ``page_size``.
    xp : module
        NumPy or CuPy: where the KV lives.
    lane_offset : int
        Distinguishes the bytes of the SWA pool's layers from the full pool's.
    """

    def __init__(self, *, num_slots: int, page_size: int, bytes_per_token: int, num_layers: int, xp, lane_offset=0):
        self.num_slots, self.page_size, self.bytes_per_token = num_slots, page_size, bytes_per_token
        self.xp, self.lane_offset = xp, lane_offset
        shape = (num_slots // page_size, page_size * bytes_per_token)
        self.k = [xp.zeros(shape, dtype=np.uint8) for _ in range(num_layers)]
        self.v = [xp.zeros(shape, dtype=np.uint8) for _ in range(num_layers)]

    def _token_view(self, layer_array):
        return layer_array.reshape(self.num_slots, self.bytes_per_token)

    def write(self, slots: np.ndarray, tokens: np.ndarray, positions: np.ndarray) -> None:
        """The "forward": store every layer's K and V bytes of the given tokens."""
        if len(slots) == 0:
            return
        index = self.xp.asarray(slots)
        for layer, (k, v) in enumerate(zip(self.k, self.v)):
            for half, array in enumerate((k, v)):
                lane = self.lane_offset + 2 * layer + half
                data = kv_bytes(tokens, positions, lane, self.bytes_per_token)
                self._token_view(array)[index] = self.xp.asarray(data)

    def flip_byte(self, slot: int, *, half: str = "k", layer: int = 0, byte: int = 0, mask: int = 0xFF) -> None:
        """XOR one byte of a slot's KV (fault injection)."""
        array = (self.k if half == "k" else self.v)[layer]
        view = self._token_view(array)
        view[slot, byte] ^= np.uint8(mask)

    def sources(self, half: str, mode: RealKvHashMode) -> tuple[RealKvSource, ...]:
        """Real-KV sources for the canary: layer 0 of K or V (SGLang fingerprints layer 0 only)."""
        if mode == RealKvHashMode.NONE:
            return ()
        array = (self.k if half == "k" else self.v)[0]
        return (
            RealKvSource(
                tensor=array,
                page_size=self.page_size,
                num_bytes_per_token=self.bytes_per_token,
                read_bytes=self.bytes_per_token,
            ),
        )
