"""The CPU plan: batch metadata -> verify entries, write ranges and seeds (vectorised, and a
compiled loop for small batches, :mod:`.plan_loop`).

The specification is :mod:`kvcanary_numba.reference.plan`; the semantics are SGLang's plus
the rules of ``docs/concepts/semantics.md`` for values SGLang leaves undefined:

- request ``r`` is active iff ``rp = req_pool_indices[r] != 0`` (row 0 is padding);
- negative ``prefix_lens`` / ``extend_seq_lens`` count as 0;
- verify positions of an active request are ``[start, prefix)`` with
  ``start = max(prefix - W, 0)`` for an SWA window ``W > 0``, else 0;
- a slot is ``req_to_token[rp, p]``; ``(rp, p)`` outside the table resolves to
  ``OUT_OF_RANGE_SLOT``; with a LUT the slot is then translated: negative values
  pass through, ``v >= len(lut)`` becomes ``OUT_OF_RANGE_SLOT``, else ``lut[v]``;
- the same resolution gives prevs (``p - 1``; -1 at ``p == 0``) and seeds
  (``prefix - 1``; -1 for padding rows, no write or no prefix).

Inputs are validated by the public wrappers in :mod:`kvcanary_numba.plan`;
these functions assume valid arrays and never read past any of them. The
wrappers reject an output that shares memory with an input or another output
(KVC-C017, as on the kernels, where it would be a race); called directly, the
reference still gives a defined result: every output is computed from the
inputs as they are at the call before the first one is written.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...constants import (
    EXPECTED_TOKEN_UNCHECKED,
    NO_PREDECESSOR,
    OUT_OF_RANGE_SLOT,
    REQ_POOL_IDX_PADDING,
)
from .plan_loop import SMALL_BATCH, offsets_small_batch, plan_small_batch

__all__ = ["launch_canary_plan_kernels", "launch_plan_offsets_kernel", "plan_vectorised"]


def _exclusive_sum(lengths: np.ndarray) -> np.ndarray:
    """``[0, l0, l0 + l1, ...]`` (length ``len(lengths) + 1``), int64 with wrap-around."""
    out = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def _request_layout(req_pool_indices, prefix_lens, extend_seq_lens, swa_window_size, verify_capacity):
    """Per request: (active, clamped prefix, window start, verify length, write length).

    A verify length above ``verify_capacity + 1`` overflows the plan on its own;
    capping it there keeps hostile prefix lengths from wrapping the int64 total.
    """
    active = req_pool_indices != REQ_POOL_IDX_PADDING
    prefix = np.maximum(prefix_lens, 0)
    extend = np.maximum(extend_seq_lens, 0)
    if swa_window_size > 0:
        start = np.maximum(prefix - np.int64(swa_window_size), 0)
    else:
        start = np.zeros_like(prefix)
    verify_len = np.minimum(np.where(active, prefix - start, 0), np.int64(verify_capacity) + 1)
    write_len = np.where(active, extend, 0)
    return active, prefix, start, verify_len, write_len


def _resolve(req_to_token, lut, rows: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Slots of ``(rows[i], positions[i])``: table lookup, then LUT translation (see module doc)."""
    n_rows, n_cols = req_to_token.shape
    ok = (rows >= 0) & (rows < n_rows) & (positions >= 0) & (positions < n_cols)
    slots = np.full(rows.shape, OUT_OF_RANGE_SLOT, dtype=np.int64)
    slots[ok] = req_to_token[rows[ok], positions[ok]]
    if lut is None:
        return slots
    # OUT_OF_RANGE_SLOT is >= any LUT length, so unresolved entries stay unresolved.
    inside = (slots >= 0) & (slots < lut.shape[0])
    translated = np.where(slots < 0, slots, OUT_OF_RANGE_SLOT)
    translated[inside] = lut[slots[inside]]
    return translated


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
    """Offsets step of the plan, in place (see :func:`kvcanary_numba.plan_offsets.launch_plan_offsets_kernel`).

    Takes the public keyword arguments minus ``backend``. Writes
    ``out_verify_offsets_scratch[:bs + 1]`` (exclusive verify offsets, total at
    ``[bs]``; the rest of the scratch is untouched), num_valid / enable
    (``verify_capacity`` / 0 on overflow, else ``total`` / 1), the whole of
    ``out_write_offsets`` (sums at ``[0, bs]``, zeros after), the whole of
    ``out_write_seed_slot_indices`` (seeds at ``[0, bs)``, -1 after) and
    ``out_write_num_valid_reqs = bs``. A batch of at most :data:`~.plan_loop.SMALL_BATCH`
    requests whose outputs share no memory with another array runs
    :func:`~.plan_loop.offsets_small_batch`, the same bytes from a compiled loop.
    """
    if req_pool_indices.shape[0] <= SMALL_BATCH and offsets_small_batch(
        req_pool_indices=req_pool_indices,
        prefix_lens=prefix_lens,
        extend_seq_lens=extend_seq_lens,
        req_to_token=req_to_token,
        full_to_swa_index_mapping=full_to_swa_index_mapping,
        out_verify_offsets_scratch=out_verify_offsets_scratch,
        out_write_offsets=out_write_offsets,
        out_write_seed_slot_indices=out_write_seed_slot_indices,
        out_verify_num_valid=out_verify_num_valid,
        out_verify_enable=out_verify_enable,
        out_write_num_valid_reqs=out_write_num_valid_reqs,
        swa_window_size=swa_window_size,
        verify_capacity=verify_capacity,
    ):
        return
    step = _offsets_step(
        req_pool_indices,
        prefix_lens,
        extend_seq_lens,
        req_to_token,
        full_to_swa_index_mapping,
        swa_window_size,
        verify_capacity,
    )
    out_verify_offsets_scratch[: step.verify_offsets.shape[0]] = step.verify_offsets
    _write_offsets_step(
        step,
        out_write_offsets,
        out_write_seed_slot_indices,
        out_verify_num_valid,
        out_verify_enable,
        out_write_num_valid_reqs,
    )


class _OffsetsStep(NamedTuple):
    """Everything the offsets step computes, before any of it is written."""

    start: np.ndarray  # per request: first verified position
    verify_len: np.ndarray  # per request: verify entries (capped at verify_capacity + 1)
    verify_offsets: np.ndarray  # [bs + 1] exclusive sums of verify_len
    total: int
    overflow: bool
    write_offsets: np.ndarray  # [bs + 1]
    seeds: np.ndarray  # [bs]
    verify_capacity: int


def _offsets_step(
    req_pool_indices, prefix_lens, extend_seq_lens, req_to_token, lut, swa_window_size, verify_capacity
) -> _OffsetsStep:
    """The offsets step's values, read from the inputs only (an output may share memory with an input)."""
    bs = req_pool_indices.shape[0]
    active, prefix, start, verify_len, write_len = _request_layout(
        req_pool_indices, prefix_lens, extend_seq_lens, swa_window_size, verify_capacity
    )
    verify_offsets = _exclusive_sum(verify_len)
    total = int(verify_offsets[bs])
    seeded = active & (write_len > 0) & (prefix > 0)
    seeds = np.full(bs, NO_PREDECESSOR, dtype=np.int64)
    seeds[seeded] = _resolve(req_to_token, lut, req_pool_indices[seeded], prefix[seeded] - 1)
    return _OffsetsStep(
        start,
        verify_len,
        verify_offsets,
        total,
        total > verify_capacity,
        _exclusive_sum(write_len),
        seeds,
        int(verify_capacity),
    )


def _write_offsets_step(
    step: _OffsetsStep, write_offsets, seed_slot_indices, verify_num_valid, verify_enable, write_num_valid_reqs
) -> None:
    """Store the offsets step's outputs (validated shapes: nothing here can fail)."""
    bs = step.seeds.shape[0]
    verify_num_valid[0] = step.verify_capacity if step.overflow else step.total
    verify_enable[0] = 0 if step.overflow else 1
    write_offsets[: bs + 1] = step.write_offsets
    write_offsets[bs + 1 :] = 0
    seed_slot_indices[:bs] = step.seeds
    seed_slot_indices[bs:] = NO_PREDECESSOR
    write_num_valid_reqs[0] = bs


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
    """Full plan, in place (see :func:`kvcanary_numba.plan.launch_canary_plan_kernels`).

    Takes the public keyword arguments minus ``backend``. The plan is
    :func:`plan_vectorised`; a batch of at most :data:`~.plan_loop.SMALL_BATCH`
    requests whose outputs share no memory with any other array runs
    :func:`~.plan_loop.plan_small_batch` instead, a compiled loop that writes the
    same bytes at a fraction of the fixed cost (tests/test_reference_plan_loop.py).
    """
    kwargs = dict(
        verify_plan_out=verify_plan_out,
        write_plan_out=write_plan_out,
        req_pool_indices=req_pool_indices,
        prefix_lens=prefix_lens,
        extend_seq_lens=extend_seq_lens,
        req_to_token=req_to_token,
        swa_window_size=swa_window_size,
        full_to_swa_index_mapping=full_to_swa_index_mapping,
        verify_capacity=verify_capacity,
        req_to_verify_expected_tokens=req_to_verify_expected_tokens,
        req_to_verify_expected_tokens_valid_lens=req_to_verify_expected_tokens_valid_lens,
        kv_token_id_vs_position_offset=kv_token_id_vs_position_offset,
    )
    if req_pool_indices.shape[0] <= SMALL_BATCH and plan_small_batch(**kwargs):
        return
    plan_vectorised(**kwargs)


def plan_vectorised(
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
    """Full plan, in place: the specification of the plan kernels (vectorised NumPy).

    Runs the offsets step, then, unless the step overflowed or has no entries,
    writes entries ``[0, total)`` of the four verify arrays request-major;
    entries from ``total`` on are left as they were.
    """
    wplan, vplan = write_plan_out, verify_plan_out
    lut = full_to_swa_index_mapping
    # Every output is computed from the inputs first and written last: an output may share memory with an
    # input or with another output (accepted, docs/concepts/reliability.md), and a write must never change
    # what a later read of this call sees.
    step = _offsets_step(
        req_pool_indices, prefix_lens, extend_seq_lens, req_to_token, lut, swa_window_size, verify_capacity
    )
    total = step.total
    entries = None
    if not step.overflow and total > 0:  # else SGLang leaves the entries alone, verify is off this step
        entries = _entries(
            step,
            req_pool_indices,
            req_to_token,
            lut,
            req_to_verify_expected_tokens,
            req_to_verify_expected_tokens_valid_lens,
            kv_token_id_vs_position_offset,
        )
    _write_offsets_step(
        step,
        wplan.write_offsets,
        wplan.write_seed_slot_indices,
        vplan.verify_num_valid,
        vplan.enable,
        wplan.write_num_valid_reqs,
    )
    if entries is not None:
        slots, tokens, positions, prevs = entries
        vplan.verify_slot_indices[:total] = slots
        vplan.verify_expected_tokens[:total] = tokens
        vplan.verify_expected_positions[:total] = positions
        vplan.verify_prev_slot_indices[:total] = prevs


def _entries(step: _OffsetsStep, req_pool_indices, req_to_token, lut, pool, pool_lens, offset):
    """(slots, expected tokens, positions, prevs) of the ``step.total`` verify entries, request-major."""
    bs, total = req_pool_indices.shape[0], step.total
    start, verify_len, first = step.start, step.verify_len, step.verify_offsets[:bs]
    owner = np.repeat(np.arange(bs, dtype=np.int64), verify_len)  # request of each entry
    # Entry i of request r sits at position start[r] + (i - offsets[r]).
    positions = np.arange(total, dtype=np.int64) + np.repeat(start - first, verify_len)
    rows = req_pool_indices[owner]
    slots = _resolve(req_to_token, lut, rows, positions)

    # A prev is the previous entry's slot, except at each request's first entry.
    prevs = np.empty(total, dtype=np.int64)
    prevs[1:] = slots[:-1]
    has_entries = verify_len > 0
    heads = first[has_entries]
    head_start = start[has_entries]
    head_prev = _resolve(req_to_token, lut, req_pool_indices[has_entries], head_start - 1)
    prevs[heads] = np.where(head_start > 0, head_prev, NO_PREDECESSOR)

    tokens = np.full(total, EXPECTED_TOKEN_UNCHECKED, dtype=np.int64)
    if pool is not None:
        columns = positions + np.int64(offset)
        bound = np.minimum(pool_lens, pool.shape[1])[owner]
        ok = (rows >= 0) & (rows < pool.shape[0]) & (columns >= 0) & (columns < bound)
        tokens[ok] = pool[rows[ok], columns[ok]]
    return slots, tokens, positions, prevs
