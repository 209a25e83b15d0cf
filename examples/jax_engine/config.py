"""Sizes of the model and of the engine around it.

Two model shapes matter: :data:`TINY`, small enough that a thousand engine steps run
on a laptop CPU in well under a minute, and :data:`LLAMA_3_2_1B`, the shapes of
Llama-3.2-1B in bfloat16 (random weights: the canary does not care what the model
says, only where its KV goes). :data:`LLAMA_3_1_8B` is there for larger GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

__all__ = ["LLAMA_3_1_8B", "LLAMA_3_2_1B", "MODELS", "TINY", "TINY_ENGINE", "EngineConfig", "ModelConfig"]


@dataclass(frozen=True)
class ModelConfig:
    """A Llama-shaped decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU MLP.

    Attributes
    ----------
    name : str
        Label used in reports.
    vocab_size, hidden, layers, heads, kv_heads, head_dim, intermediate : int
        The usual transformer sizes; ``heads`` must be a multiple of ``kv_heads``.
    rope_theta : float
        RoPE base frequency.
    norm_eps : float
        RMSNorm epsilon.
    dtype : str
        Compute and KV dtype (``"float32"`` or ``"bfloat16"``).
    """

    name: str
    vocab_size: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.heads % self.kv_heads:
            raise ValueError(f"ModelConfig: heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"ModelConfig: dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")
        if self.kv_bytes_per_token % 16:
            # The canary folds KV bytes in 16-byte words; a Llama head is always a multiple of that.
            raise ValueError(
                f"ModelConfig: kv_heads * head_dim * itemsize must be a multiple of 16, got {self.kv_bytes_per_token}"
            )

    @property
    def itemsize(self) -> int:
        return 4 if self.dtype == "float32" else 2

    @property
    def storage_dtype(self) -> np.dtype:
        """Dtype the KV pool is stored in: the unsigned integer of the compute dtype's width.

        The model bitcasts on every read and write (free inside ``jit``). Stored this way, the
        pool crosses DLPack and ``__cuda_array_interface__`` as a plain integer array: JAX's
        ``__cuda_array_interface__`` refuses bfloat16 and CuPy reads bfloat16 from DLPack only
        in recent versions.
        """
        return np.dtype(np.uint32 if self.itemsize == 4 else np.uint16)

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes one token's K (or V) takes in one layer."""
        return self.kv_heads * self.head_dim * self.itemsize

    @property
    def num_params(self) -> int:
        """Weights, embedding counted once (tied with the output head)."""
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        mlp = 3 * self.hidden * self.intermediate
        return self.vocab_size * self.hidden + self.layers * (attn + mlp + 2 * self.hidden) + self.hidden


#: Two layers of width 64: compiles in about a second and steps in about a millisecond on a CPU.
TINY = ModelConfig(name="tiny", vocab_size=512, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=128)
#: The shapes of Llama-3.2-1B (1.2 B parameters with the tied embedding).
LLAMA_3_2_1B = ModelConfig(
    name="llama-3.2-1b",
    vocab_size=128256,
    hidden=2048,
    layers=16,
    heads=32,
    kv_heads=8,
    head_dim=64,
    intermediate=8192,
    rope_theta=500000.0,
    dtype="bfloat16",
)
#: The shapes of Llama-3.1-8B (the output head tied here, unlike the original: 7.5 B parameters).
LLAMA_3_1_8B = ModelConfig(
    name="llama-3.1-8b",
    vocab_size=128256,
    hidden=4096,
    layers=32,
    heads=32,
    kv_heads=8,
    head_dim=128,
    intermediate=14336,
    rope_theta=500000.0,
    dtype="bfloat16",
)
MODELS = {m.name: m for m in (TINY, LLAMA_3_2_1B, LLAMA_3_1_8B)}


@dataclass(frozen=True)
class EngineConfig:
    """KV pool, page table and scheduling limits of a :class:`~.engine.JaxEngine`.

    Attributes
    ----------
    page_size : int
        Slots per page; pages are what the allocator hands out. Slot ``s`` lives in
        page ``s // page_size``; page 0 holds slot 0, the padding slot, and is never
        handed out.
    num_pages : int
        Pages of the pool, page 0 included.
    max_running : int
        Requests in flight; ``req_to_token`` has one more row (row 0 is padding).
    max_context : int
        Columns of ``req_to_token``: the longest request (prompt + generated tokens).
    chunk_size : int
        Most prompt tokens one request prefills in one step (chunked prefill).
    step_tokens : int
        Most new tokens in one step, all requests together.
    min_prompt, max_prompt, min_new, max_new : int
        Workload: prompt length and generated tokens per request, drawn uniformly.
    donate : bool
        Update the KV pool and the page table in place (``jit`` buffer donation);
        False updates them functionally (a new buffer every step).
    seed : int
        Seeds the weights and the workload.
    """

    page_size: int = 4
    num_pages: int = 160
    max_running: int = 4
    max_context: int = 128
    chunk_size: int = 16
    step_tokens: int = 32
    min_prompt: int = 8
    max_prompt: int = 40
    min_new: int = 4
    max_new: int = 24
    donate: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_prompt + self.max_new > self.max_context:
            raise ValueError(
                f"EngineConfig: max_prompt + max_new ({self.max_prompt + self.max_new}) exceeds "
                f"max_context ({self.max_context})"
            )
        pages_per_request = -(-self.max_context // self.page_size)
        if self.num_pages < 1 + self.max_running * pages_per_request:
            raise ValueError(
                f"EngineConfig: num_pages ({self.num_pages}) cannot hold {self.max_running} requests of "
                f"{self.max_context} tokens (needs {1 + self.max_running * pages_per_request})"
            )
        if not 1 <= self.chunk_size <= self.step_tokens:
            raise ValueError(f"EngineConfig: chunk_size must be in [1, step_tokens], got {self.chunk_size}")
        if self.step_tokens < self.max_running:
            raise ValueError("EngineConfig: step_tokens must leave one decode token per running request")

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    @property
    def req_rows(self) -> int:
        return self.max_running + 1

    def with_(self, **changes) -> EngineConfig:
        return replace(self, **changes)


#: The engine the tests and the CPU demo run: 4 requests, prompts up to 40 tokens.
TINY_ENGINE = EngineConfig()
