"""EngineConfig: the size and workload of the toy engine, validated once."""

from __future__ import annotations

from dataclasses import dataclass

from .._validate import check_int
from ..constants import REAL_KV_ALIGN_BYTES
from ..errors import error

__all__ = ["EngineConfig", "LIMITS", "MAX_POOL_BYTES"]

_FN = "EngineConfig"


#: Upper bound of each size field (the toy engine is a test bench, not a model).
LIMITS = {
    "page_size": 2**16,
    "num_pages": 2**24,
    "max_running": 2**12,
    "min_prompt_len": 2**16,
    "max_prompt_len": 2**16,
    "min_new_tokens": 2**16,
    "max_new_tokens": 2**16,
    "shared_prefix_len": 2**16,
    "num_shared_prefixes": 2**10,
    "num_layers": 2**10,
    "bytes_per_token": 2**16,
    "swa_window": 2**16,
    "max_admit_per_step": 2**12,
}
#: Largest KV pool plus tables the toy engine allocates (KVC-E005).
MAX_POOL_BYTES = 2**32


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """Workload and pool geometry of a :class:`~kvcanary_numba.engine.ToyEngine`.

    Every field is a Python int (NumPy integers are accepted and stored as ``int``), so a
    configuration is reproducible from its repr.

    Attributes
    ----------
    seed : int
        Seeds request arrivals, prompts and the toy model's tokens.
    page_size : int
        KV slots per page; pages are the allocation unit of the full pool.
    num_pages : int
        Pages of the full pool, page 0 included (reserved as the padding page).
    max_running : int
        Requests decoded together; also the req_to_token rows in use (row 0 is padding).
    min_prompt_len, max_prompt_len : int
        Prompt length range (tokens).
    min_new_tokens, max_new_tokens : int
        Generated tokens per request.
    shared_prefix_len : int
        Length of each shared system prompt (a multiple of ``page_size``); 0 disables
        prefix sharing.
    num_shared_prefixes : int
        Distinct system prompts; a new request picks one of them or none, uniformly.
    num_layers : int
        KV layers (K and V each); layer 0 is what the canary fingerprints.
    bytes_per_token : int
        KV bytes per token and layer (a positive multiple of 16).
    swa_window : int
        Sliding window of the SWA sub-pool; 0 runs a FULL pool only.
    vocab_size : int
        Token ids are drawn from ``[1, vocab_size)``.
    max_admit_per_step : int
        New requests admitted (prefilled) per step.

    Every size has an upper bound (:data:`LIMITS`), and the pools and tables
    together stay within :data:`MAX_POOL_BYTES` (4 GiB), so a mistyped size is
    rejected at once instead of allocating for minutes.

    Raises
    ------
    KvCanaryError
        KVC-C011 for an int out of range, KVC-E003 for a bad shared prefix,
        KVC-E002 when the pool cannot hold the workload, KVC-E005 when it is
        larger than the toy engine allows.
    """

    seed: int = 0
    page_size: int = 2
    num_pages: int = 64
    max_running: int = 4
    min_prompt_len: int = 6
    max_prompt_len: int = 12
    min_new_tokens: int = 2
    max_new_tokens: int = 8
    shared_prefix_len: int = 4
    num_shared_prefixes: int = 2
    num_layers: int = 2
    bytes_per_token: int = 32
    swa_window: int = 0
    vocab_size: int = 32000
    max_admit_per_step: int = 1

    def __post_init__(self) -> None:
        def checked(name, low, high):
            # Stored as the checked Python int: a NumPy integer would make the derived sizes below wrap
            # (int32 products) and the toy model's uint64 arithmetic overflow.
            object.__setattr__(self, name, check_int(_FN, name, getattr(self, name), low=low, high=high))
            return getattr(self, name)

        checked("seed", 0, 2**63 - 1)
        for name in (
            "page_size",
            "num_pages",
            "max_running",
            "min_prompt_len",
            "min_new_tokens",
            "num_layers",
            "max_admit_per_step",
        ):
            checked(name, 1, LIMITS[name])
        # Lower bounds from the paired minimum, upper bounds documented in LIMITS.
        for name, low in (("max_prompt_len", self.min_prompt_len), ("max_new_tokens", self.min_new_tokens)):
            checked(name, low, LIMITS[name])
        for name in ("num_shared_prefixes", "shared_prefix_len", "swa_window"):
            checked(name, 0, LIMITS[name])
        checked("vocab_size", 2, 2**31 - 1)
        bpt = checked("bytes_per_token", REAL_KV_ALIGN_BYTES, LIMITS["bytes_per_token"])
        if bpt % REAL_KV_ALIGN_BYTES:
            raise error("KVC-C011", function=_FN, argument="bytes_per_token", expected="a multiple of 16", got=bpt)
        shared = self.shared_prefix_len
        if shared % self.page_size or shared >= self.min_prompt_len:
            raise error(
                "KVC-E003", function=_FN, page_size=self.page_size, min_prompt_len=self.min_prompt_len, got=shared
            )
        if self.num_pages < self.min_pages:
            raise error(
                "KVC-E002",
                function=_FN,
                got=self.num_pages,
                max_running=self.max_running,
                max_tokens=self.max_tokens,
                prefixes=self.num_prefix_entries,
                needed=self.min_pages,
            )
        if self.pool_bytes > MAX_POOL_BYTES:
            raise error("KVC-E005", function=_FN, got=self.pool_bytes, limit=MAX_POOL_BYTES)

    @property
    def pool_bytes(self) -> int:
        """Host / device bytes of the KV pools (K and V of every layer, SWA pool included) and tables."""
        pools = 2 if self.swa_window else 1
        kv = pools * 2 * self.num_layers * self.num_slots * self.bytes_per_token
        return kv + self.req_rows * self.max_tokens * 4 + (self.num_slots + 1) * 8

    @property
    def max_tokens(self) -> int:
        """Longest request (prompt + generated tokens)."""
        return self.max_prompt_len + self.max_new_tokens

    @property
    def num_prefix_entries(self) -> int:
        """Cached prefixes the engine can hold (0 when sharing is off)."""
        return self.num_shared_prefixes if self.shared_prefix_len else 0

    @property
    def min_pages(self) -> int:
        """Pages needed so that admission never has to wait for memory."""
        per_request = _ceil_div(self.max_tokens, self.page_size)
        cached = self.num_prefix_entries * (self.shared_prefix_len // self.page_size)
        return 1 + self.max_running * per_request + cached

    @property
    def num_slots(self) -> int:
        """KV slots of the full pool (slot 0 included)."""
        return self.num_pages * self.page_size

    @property
    def req_rows(self) -> int:
        """req_to_token rows: the padding row 0 plus one per running request."""
        return self.max_running + 1

    @property
    def max_batch_tokens(self) -> int:
        """Most new tokens one step writes (every request prefilling at once)."""
        return self.max_running * self.max_prompt_len
