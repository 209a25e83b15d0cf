"""Specification of the plan kernels (``kernels/plan.py``): batch metadata -> work lists.

Each step the plan turns the engine's batch (``req_pool_indices``,
``prefix_lens``, ``extend_seq_lens``, the ``req_to_token`` table) into a
:class:`~kvcanary_numba.VerifyPlan`, the prefix slots verify checks, and a
:class:`~kvcanary_numba.WritePlan`, the token ranges and chain seeds write
stamps (see ``docs/concepts/plans.md``).

Requests
    Request ``r`` is active iff ``rp = req_pool_indices[r] != 0`` (row 0 is the
    padding row). Negative ``prefix_lens`` / ``extend_seq_lens`` count as 0.
    An active request verifies positions ``[start, prefix)``, where
    ``start = max(prefix - W, 0)`` for an SWA window ``W > 0`` and 0 otherwise,
    and writes ``extend`` new tokens. A padding request verifies and writes
    nothing.
Exclusive sums
    The flat lists are laid out request-major with exclusive prefix sums: for
    lengths ``[l0, l1, l2]`` the offsets are ``[0, l0, l0 + l1, l0 + l1 + l2]``,
    so request ``r`` owns ``[offsets[r], offsets[r + 1])`` and the last value is
    the total. That is why ``write_offsets`` has ``write_req_capacity + 1``
    values: ``bs`` requests need ``bs + 1`` offsets. Entries past ``bs`` are 0.
    A verify length is capped at ``verify_capacity + 1`` before summing (one
    such request overflows the plan on its own), so hostile prefix lengths
    cannot wrap the int64 total; write lengths are not capped and their sums
    wrap as int64 (write clips every range it reads).
Slots
    A slot is ``req_to_token[rp, p]``; ``(rp, p)`` outside the table gives
    ``OUT_OF_RANGE_SLOT``. With an SWA LUT the slot is then translated: a
    negative value passes through, a value ``>= len(lut)`` becomes
    ``OUT_OF_RANGE_SLOT``, else ``lut[value]``. Verify and write report
    ``OUT_OF_RANGE_SLOT`` instead of reading memory.
Verify entries
    Entry ``e`` of request ``r`` (request-major) checks position
    ``p = start[r] + (e - verify_offsets[r])``: slot ``slot(rp, p)``, predecessor
    ``slot(rp, p - 1)`` (-1 at ``p == 0``: the chain head), expected token
    ``pool[rp, p + offset]`` when ``0 <= p + offset < min(valid_lens[r], pool width)``
    and ``0 <= rp < pool rows``, else -1 (also without a pool).
Write seeds
    Request ``r``'s seed is ``slot(rp, prefix - 1)``, the slot its first new
    token continues, when it is active, writes at least one token and has a
    prefix; -1 (anchor the chain) otherwise and after ``bs``.
Overflow
    When the verify total exceeds ``verify_capacity``: ``verify_num_valid =
    verify_capacity``, ``enable = 0`` and the verify entry arrays keep their
    old values (SGLang's behaviour; verify skips the step). Otherwise
    ``verify_num_valid = total``, ``enable = 1`` and entries ``[0, total)`` are
    written; entries from ``total`` on are left as they were.

Every output is computed from the inputs before the first output is written,
so the result is defined even when an output shares memory with an input (the
public wrappers reject that, KVC-C017; a direct call still gets this rule).
Exact rules: ``docs/concepts/semantics.md`` ("Plan").
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..constants import (
    EXPECTED_TOKEN_UNCHECKED,
    NO_PREDECESSOR,
    OUT_OF_RANGE_SLOT,
    REQ_POOL_IDX_PADDING,
)

__all__ = ["launch_canary_plan_kernels", "launch_plan_offsets_kernel"]


def exclusive_sum(lengths: np.ndarray) -> np.ndarray:
    """``[0, l0, l0 + l1, ...]``: int64 [len(lengths) + 1], wrapping like the device's int64 sums."""
    out = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])  # integer array sums wrap silently, as on the device
    return out


def resolve_slots(req_to_token, lut, rows: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Slot of each ``(rows[i], positions[i])``: table lookup, then LUT translation.

    Parameters
    ----------
    req_to_token : int32 [max_reqs, max_seq_len]
    lut : int64 [lut_len] or None
    rows, positions : int64 [n]

    Returns
    -------
    int64 [n]
        The slots; ``OUT_OF_RANGE_SLOT`` where the table or the LUT has no entry.
    """
    n_rows, n_cols = req_to_token.shape
    ok = (rows >= 0) & (rows < n_rows) & (positions >= 0) & (positions < n_cols)
    slots = np.full(rows.shape, OUT_OF_RANGE_SLOT, dtype=np.int64)
    slots[ok] = req_to_token[rows[ok], positions[ok]]
    if lut is None:
        return slots
    # OUT_OF_RANGE_SLOT is >= any LUT length, so an unresolved slot stays unresolved.
    inside = (slots >= 0) & (slots < lut.shape[0])
    translated = np.where(slots < 0, slots, OUT_OF_RANGE_SLOT)
    translated[inside] = lut[slots[inside]]
    return translated


class OffsetsStep(NamedTuple):
    """Everything the offsets step computes, before any of it is written (arrays int64)."""

    start: np.ndarray  # [bs] first verified position of each request
    verify_len: np.ndarray  # [bs] verify entries of each request, capped at verify_capacity + 1
    verify_offsets: np.ndarray  # [bs + 1] exclusive sums of verify_len; the total at [bs]
    write_offsets: np.ndarray  # [bs + 1] exclusive sums of the write lengths
    seeds: np.ndarray  # [bs] chain seed of each request
    total: int  # verify entries of the batch (capped lengths)
    overflow: bool  # total > verify_capacity


def offsets_step(
    req_pool_indices, prefix_lens, extend_seq_lens, req_to_token, lut, swa_window_size, verify_capacity
) -> OffsetsStep:
    """Per-request lengths, their exclusive sums and the write seeds of one batch."""
    bs = req_pool_indices.shape[0]
    active = req_pool_indices != REQ_POOL_IDX_PADDING
    prefix = np.maximum(prefix_lens, 0)
    extend = np.maximum(extend_seq_lens, 0)
    if swa_window_size > 0:  # only the last W positions are verified
        start = np.maximum(prefix - np.int64(swa_window_size), 0)
    else:
        start = np.zeros(bs, dtype=np.int64)
    verify_len = np.minimum(np.where(active, prefix - start, 0), np.int64(verify_capacity) + 1)
    write_len = np.where(active, extend, 0)
    verify_offsets = exclusive_sum(verify_len)
    total = int(verify_offsets[bs])

    seeds = np.full(bs, NO_PREDECESSOR, dtype=np.int64)
    seeded = active & (write_len > 0) & (prefix > 0)
    seeds[seeded] = resolve_slots(req_to_token, lut, req_pool_indices[seeded], prefix[seeded] - 1)
    return OffsetsStep(
        start, verify_len, verify_offsets, exclusive_sum(write_len), seeds, total, total > verify_capacity
    )


def store_offsets_step(
    step: OffsetsStep,
    verify_capacity,
    write_offsets,
    seed_slot_indices,
    verify_num_valid,
    verify_enable,
    write_num_valid_reqs,
) -> None:
    """Write the offsets step's outputs, whole arrays included (tails: offsets 0, seeds -1)."""
    bs = step.seeds.shape[0]
    verify_num_valid[0] = verify_capacity if step.overflow else step.total
    verify_enable[0] = 0 if step.overflow else 1
    write_offsets[: bs + 1] = step.write_offsets
    write_offsets[bs + 1 :] = 0
    seed_slot_indices[:bs] = step.seeds
    seed_slot_indices[bs:] = NO_PREDECESSOR
    write_num_valid_reqs[0] = bs


def launch_plan_offsets_kernel(
    *,
    req_pool_indices,
    prefix_lens,
    extend_seq_lens,
    req_to_token,
    full_to_swa_index_mapping,
    out_verify_offsets_scratch,
    out_write_offsets,
    out_write_seed_slot_indices,
    out_verify_num_valid,
    out_verify_enable,
    out_write_num_valid_reqs,
    swa_window_size,
    verify_capacity,
) -> None:
    """The offsets step of the plan alone, in place (``plan_offsets_kernel``).

    Parameters
    ----------
    req_pool_indices, prefix_lens, extend_seq_lens : int64 [bs]
    req_to_token : int32 [max_reqs, max_seq_len]
    full_to_swa_index_mapping : int64 [lut_len] or None
    out_verify_offsets_scratch : int64 [>= bs + 1]
        Receives the exclusive verify offsets (capped lengths) at ``[0, bs]``;
        the rest is untouched.
    out_write_offsets : int64 [write_req_capacity + 1]
        Exclusive write sums at ``[0, bs]``, zeros after.
    out_write_seed_slot_indices : int64 [write_req_capacity]
        Seeds at ``[0, bs)``, -1 after.
    out_verify_num_valid, out_verify_enable, out_write_num_valid_reqs : int32 [1]
        ``min(total, verify_capacity)``, ``total <= verify_capacity``, ``bs``.
    swa_window_size : int
        ``W >= 0``; 0 verifies the whole prefix.
    verify_capacity : int
        Overflow threshold.
    """
    step = offsets_step(
        req_pool_indices,
        prefix_lens,
        extend_seq_lens,
        req_to_token,
        full_to_swa_index_mapping,
        swa_window_size,
        verify_capacity,
    )
    out_verify_offsets_scratch[: step.verify_offsets.shape[0]] = step.verify_offsets
    store_offsets_step(
        step,
        verify_capacity,
        out_write_offsets,
        out_write_seed_slot_indices,
        out_verify_num_valid,
        out_verify_enable,
        out_write_num_valid_reqs,
    )


def verify_entries(step: OffsetsStep, req_pool_indices, req_to_token, lut, pool, pool_lens, offset):
    """(slots, expected tokens, positions, prevs) of the ``step.total`` verify entries, int64 [total] each.

    The kernel finds each entry's request by a search in ``verify_offsets``;
    here ``np.repeat`` lays the requests out entry by entry.
    """
    bs, total = req_pool_indices.shape[0], step.total
    first = step.verify_offsets[:bs]
    owner = np.repeat(np.arange(bs, dtype=np.int64), step.verify_len)  # request of each entry
    # Entry e of request r checks position start[r] + (e - first[r]).
    positions = np.arange(total, dtype=np.int64) + np.repeat(step.start - first, step.verify_len)
    rows = req_pool_indices[owner]
    slots = resolve_slots(req_to_token, lut, rows, positions)
    prevs = np.where(positions > 0, resolve_slots(req_to_token, lut, rows, positions - 1), NO_PREDECESSOR)

    tokens = np.full(total, EXPECTED_TOKEN_UNCHECKED, dtype=np.int64)
    if pool is not None:
        columns = positions + np.int64(offset)
        bound = np.minimum(pool_lens, pool.shape[1])[owner]
        ok = (rows >= 0) & (rows < pool.shape[0]) & (columns >= 0) & (columns < bound)
        tokens[ok] = pool[rows[ok], columns[ok]]
    return slots, tokens, positions, prevs


def launch_canary_plan_kernels(
    *,
    verify_plan_out,
    write_plan_out,
    req_pool_indices,
    prefix_lens,
    extend_seq_lens,
    req_to_token,
    swa_window_size,
    full_to_swa_index_mapping,
    verify_capacity,
    req_to_verify_expected_tokens,
    req_to_verify_expected_tokens_valid_lens,
    kv_token_id_vs_position_offset,
) -> None:
    """The whole plan, in place: the offsets step, then the verify entries.

    Parameters
    ----------
    verify_plan_out : VerifyPlan
        NumPy arrays; entries ``[0, total)``, ``verify_num_valid`` and
        ``enable`` are written (the entries only without overflow).
    write_plan_out : WritePlan
        NumPy arrays, written whole.
    req_pool_indices, prefix_lens, extend_seq_lens : int64 [bs]
    req_to_token : int32 [max_reqs, max_seq_len]
    swa_window_size : int
    full_to_swa_index_mapping : int64 [lut_len] or None
    verify_capacity : int
    req_to_verify_expected_tokens : int32 [pool_rows, pool_width] or None
        Expected-token pool; None leaves every expected token -1.
    req_to_verify_expected_tokens_valid_lens : int64 [bs] or None
        Valid columns of each request's pool row.
    kv_token_id_vs_position_offset : int
        Column of position ``p`` in the pool is ``p + offset``.
    """
    vplan, wplan = verify_plan_out, write_plan_out
    lut = full_to_swa_index_mapping
    step = offsets_step(
        req_pool_indices, prefix_lens, extend_seq_lens, req_to_token, lut, swa_window_size, verify_capacity
    )
    entries = None
    if not step.overflow and step.total > 0:  # on overflow the entries stay as they were
        entries = verify_entries(
            step,
            req_pool_indices,
            req_to_token,
            lut,
            req_to_verify_expected_tokens,
            req_to_verify_expected_tokens_valid_lens,
            kv_token_id_vs_position_offset,
        )
    # Written only now: every value above came from the inputs as they were at the call.
    store_offsets_step(
        step,
        verify_capacity,
        wplan.write_offsets,
        wplan.write_seed_slot_indices,
        vplan.verify_num_valid,
        vplan.enable,
        wplan.write_num_valid_reqs,
    )
    if entries is not None:
        slots, tokens, positions, prevs = entries
        vplan.verify_slot_indices[: step.total] = slots
        vplan.verify_expected_tokens[: step.total] = tokens
        vplan.verify_expected_positions[: step.total] = positions
        vplan.verify_prev_slot_indices[: step.total] = prevs
