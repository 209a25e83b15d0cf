"""A Llama-shaped decoder in JAX over a paged KV pool, with random weights.

One call of :func:`forward` is one engine step for a padded batch of ``R`` request
rows with up to ``C`` new tokens each (a decode step has ``C == 1``; a step with
prefill chunks pads every row to the chunk width). Per layer it computes the new
tokens' K and V, scatters them into the pool at their slots (``out_loc``), then
gathers each row's whole context through the page table and attends over it. The
pool is therefore the only place the model keeps KV between steps: whatever the
canary finds there is what the next step attends to.

Layout
------
The KV pool is one K and one V array per layer, ``[num_slots, kv_heads, head_dim]``,
stored as unsigned integers of the compute dtype's width (see
:attr:`ModelConfig.storage_dtype`) and bitcast on every read and write. Slot 0 is
the padding slot: padding rows and padding columns write their (meaningless) K and
V there, so the scatter needs no mask, and no request ever owns slot 0.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from .config import ModelConfig

__all__ = ["DeviceBatch", "forward", "init_params", "new_kv_pool", "write_table"]


class DeviceBatch(NamedTuple):
    """One step's inputs on the device, padded to ``R`` rows of ``C`` tokens (all int32).

    Attributes
    ----------
    tokens, positions : [R, C]
        Token id and position of each new token (padding: 0).
    out_loc : [R, C]
        KV slot each new token's K and V go to (padding: slot 0).
    counts : [R]
        New tokens of each row (padding rows: 0).
    rows : [R]
        ``req_to_token`` row of each request (padding rows: row 0).
    kv_lens : [R]
        Context length of each row after this step (prefix + new tokens).
    """

    tokens: jax.Array
    positions: jax.Array
    out_loc: jax.Array
    counts: jax.Array
    rows: jax.Array
    kv_lens: jax.Array


def init_params(cfg: ModelConfig, seed: int = 0) -> dict:
    """Random weights (normal, std 0.02; norms at 1), one dict per layer.

    The embedding doubles as the output head (tied), as in Llama-3.2-1B.
    """
    dtype = jnp.dtype(cfg.dtype)
    keys = iter(jax.random.split(jax.random.key(seed), 2 + 7 * cfg.layers))

    def normal(*shape):
        return (0.02 * jax.random.normal(next(keys), shape, dtype=jnp.float32)).astype(dtype)

    d, q, kv, f = cfg.hidden, cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.intermediate
    layers = [
        dict(
            attn_norm=jnp.ones(d, dtype),
            wq=normal(d, q),
            wk=normal(d, kv),
            wv=normal(d, kv),
            wo=normal(q, d),
            mlp_norm=jnp.ones(d, dtype),
            w_gate=normal(d, f),
            w_up=normal(d, f),
            w_down=normal(f, d),
        )
        for _ in range(cfg.layers)
    ]
    return dict(embed=normal(cfg.vocab_size, d), layers=layers, final_norm=jnp.ones(d, dtype))


def new_kv_pool(cfg: ModelConfig, num_slots: int) -> tuple[list[jax.Array], list[jax.Array]]:
    """Zeroed K and V arrays, one per layer, ``[num_slots, kv_heads, head_dim]`` in the storage dtype."""
    shape = (num_slots, cfg.kv_heads, cfg.head_dim)
    zeros = lambda: jnp.zeros(shape, cfg.storage_dtype)  # noqa: E731
    return [zeros() for _ in range(cfg.layers)], [zeros() for _ in range(cfg.layers)]


def write_table(
    req_to_token: jax.Array, rows: jax.Array, cols: jax.Array, slots: jax.Array, fence: jax.Array
) -> jax.Array:
    """``req_to_token[rows, cols] = slots``: the step's new page-table entries (padding: row 0, slot 0).

    ``fence`` is not read: it is an argument so that XLA waits for it before running
    (the canary's work of the previous step, see ``canary.py``); jit it with
    ``keep_unused=True`` or XLA drops it.
    """
    del fence
    return req_to_token.at[rows, cols].set(slots)


def _rms_norm(x, weight, eps):
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (x32 * weight.astype(jnp.float32)).astype(x.dtype)


def _rope(x, positions, theta):
    """Rotary embedding (rotate-half form) of ``x`` [R, C, heads, D] at ``positions`` [R, C]."""
    half = x.shape[-1] // 2
    inv_freq = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [R, C, half]
    cos, sin = jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def _attend(q, k, v, mask):
    """Masked softmax attention. q [R, C, KVH, G, D]; k, v [R, L, KVH, D]; mask [R, C, L] (True: visible)."""
    scale = q.shape[-1] ** -0.5
    s = jnp.einsum("rckgd,rlkd->rkgcl", q, k, preferred_element_type=jnp.float32) * scale
    # A finite fill, not -inf: a padding row sees no key at all and must not turn into NaN.
    s = jnp.where(mask[:, None, None], s, -1e30)
    p = jax.nn.softmax(s, axis=-1).astype(v.dtype)
    return jnp.einsum("rkgcl,rlkd->rckgd", p, v)


def _attention(q, k, v, mask, *, q_block: int):
    """:func:`_attend` over query blocks of ``q_block`` tokens, so a long prefill's scores fit in memory."""
    r, c = q.shape[:2]
    if c <= q_block or c % q_block:
        return _attend(q, k, v, mask)
    nb = c // q_block
    qb = jnp.moveaxis(q.reshape(r, nb, q_block, *q.shape[2:]), 1, 0)
    mb = jnp.moveaxis(mask.reshape(r, nb, q_block, mask.shape[-1]), 1, 0)
    out = jax.lax.map(lambda args: _attend(args[0], k, v, args[1]), (qb, mb))
    return jnp.moveaxis(out, 0, 1).reshape(q.shape)


def _cudnn_attention(q, k, v, batch: DeviceBatch):
    """cuDNN flash attention for the two shapes it serves here: decode (C == 1) and prefill
    from position 0 (C == context length, causal). Mixed or chunked steps use the XLA path."""
    r, c, kvh, g, d = q.shape
    out = jax.nn.dot_product_attention(
        q.reshape(r, c, kvh * g, d),
        k,
        v,
        is_causal=c > 1,
        query_seq_lengths=batch.counts,
        key_value_seq_lengths=batch.kv_lens,
        implementation="cudnn",
    )
    return out.reshape(q.shape)


def forward(
    params: dict,
    k_pool: list,
    v_pool: list,
    req_to_token: jax.Array,
    batch: DeviceBatch,
    fence: jax.Array,
    *,
    cfg: ModelConfig,
    ctx_len: int,
    attention: str = "xla",
    q_block: int = 512,
):
    """One step: write the new tokens' KV into the pool, attend over each row's context, sample.

    Parameters
    ----------
    params : dict
        From :func:`init_params`.
    k_pool, v_pool : list of jax.Array
        Per layer ``[num_slots, kv_heads, head_dim]`` (storage dtype).
    req_to_token : int32 [rows, max_context]
        The page table, already holding this step's new slots.
    batch : DeviceBatch
    fence : jax.Array
        Not read; see :func:`write_table`.
    cfg : ModelConfig
    ctx_len : int
        Static context width gathered per row (at least the longest ``kv_lens``).
    attention : {"xla", "cudnn"}
        ``"cudnn"`` only for decode or prefix-free prefill batches (see :func:`_cudnn_attention`).
    q_block : int
        Query block of the XLA attention.

    Returns
    -------
    next_tokens : int32 [R]
        Greedy sample after each row's last new token.
    k_pool, v_pool : list of jax.Array
        The updated pool (the same buffers when the caller donates them).
    """
    del fence
    dtype, storage = jnp.dtype(cfg.dtype), cfg.storage_dtype
    r, c = batch.tokens.shape
    g = cfg.heads // cfg.kv_heads
    slots = req_to_token[batch.rows][:, :ctx_len]  # [R, L]: the KV slot of every context position
    key_pos = jnp.arange(ctx_len)
    mask = (key_pos[None, None, :] <= batch.positions[:, :, None]) & (
        key_pos[None, None, :] < batch.kv_lens[:, None, None]
    )
    x = params["embed"][batch.tokens]
    k_pool, v_pool = list(k_pool), list(v_pool)
    for i, w in enumerate(params["layers"]):
        h = _rms_norm(x, w["attn_norm"], cfg.norm_eps)
        q = _rope((h @ w["wq"]).reshape(r, c, cfg.heads, cfg.head_dim), batch.positions, cfg.rope_theta)
        k = _rope((h @ w["wk"]).reshape(r, c, cfg.kv_heads, cfg.head_dim), batch.positions, cfg.rope_theta)
        v = (h @ w["wv"]).reshape(r, c, cfg.kv_heads, cfg.head_dim)
        # The new KV goes into the pool first; attention then reads it back from there with the rest.
        k_pool[i] = k_pool[i].at[batch.out_loc].set(jax.lax.bitcast_convert_type(k, storage))
        v_pool[i] = v_pool[i].at[batch.out_loc].set(jax.lax.bitcast_convert_type(v, storage))
        keys = jax.lax.bitcast_convert_type(k_pool[i][slots], dtype)
        values = jax.lax.bitcast_convert_type(v_pool[i][slots], dtype)
        q = q.reshape(r, c, cfg.kv_heads, g, cfg.head_dim)
        if attention == "cudnn":
            o = _cudnn_attention(q, keys, values, batch)
        else:
            o = _attention(q, keys, values, mask, q_block=q_block)
        x = x + o.reshape(r, c, -1) @ w["wo"]
        h = _rms_norm(x, w["mlp_norm"], cfg.norm_eps)
        x = x + (jax.nn.silu(h @ w["w_gate"]) * (h @ w["w_up"])) @ w["w_down"]
    last = x[jnp.arange(r), jnp.maximum(batch.counts - 1, 0)]  # each row's last new token
    logits = _rms_norm(last, params["final_norm"], cfg.norm_eps) @ params["embed"].T
    return jnp.argmax(logits, axis=-1).astype(jnp.int32), k_pool, v_pool
