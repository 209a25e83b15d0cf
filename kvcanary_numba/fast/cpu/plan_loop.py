"""The plan of a small batch as one compiled loop: the CPU fast path of :mod:`.plan`.

:func:`.plan.plan_vectorised` is the specification; a batch of at most
:data:`SMALL_BATCH` requests is planned here instead, because the vectorised
form costs some fifty NumPy calls (tens of microseconds) whatever the batch
size. The loop walks the requests once for the offsets, seeds and totals, and
once more for the verify entries, with the same rules (see the module
docstring of :mod:`.plan`). ``tests/test_cpu_plan_loop.py`` checks that
both give byte-equal plans on random batches.

The loop writes its outputs while it reads its inputs, so it runs only when no
output shares memory with an input or another output; otherwise
:func:`plan_small_batch` returns False and the caller runs the vectorised
plan, which computes every output from the inputs before it writes any. The
public functions reject such calls (KVC-C017) before they get here; the test
stays for direct callers.
"""

from __future__ import annotations

import numpy as np
from numba import literal_unroll

from ..._jit import cpu_jit
from ..._overlap import extent as _extent
from ...constants import EXPECTED_TOKEN_UNCHECKED, NO_PREDECESSOR, OUT_OF_RANGE_SLOT, REQ_POOL_IDX_PADDING

__all__ = ["SMALL_BATCH", "offsets_small_batch", "plan_small_batch"]

#: Batches of at most this many requests take the compiled loop.
SMALL_BATCH = 256

_OOR = np.int64(OUT_OF_RANGE_SLOT)
_NO_PREV = np.int64(NO_PREDECESSOR)
_UNCHECKED = np.int64(EXPECTED_TOKEN_UNCHECKED)
_PADDING = np.int64(REQ_POOL_IDX_PADDING)
#: Stand-ins for an absent LUT / expected-token pool (one compiled signature for every call).
_NO_LUT = np.zeros(0, dtype=np.int64)
_NO_POOL = np.zeros((0, 0), dtype=np.int32)
_NO_LENS = np.zeros(0, dtype=np.int64)


@cpu_jit(nogil=True)
def _spans(arrays):
    """int64 [len(arrays), 2]: the byte span of each array of a (heterogeneous) tuple."""
    spans = np.empty((len(arrays), 2), dtype=np.int64)
    i = 0
    for a in literal_unroll(arrays):
        spans[i, 0], spans[i, 1] = _extent(a)
        i += 1
    return spans


@cpu_jit(nogil=True)
def _disjoint(spans, n_outputs):
    """True when none of the first ``n_outputs`` byte spans (rows of int64 [n, 2]) meets another span."""
    for i in range(n_outputs):
        for j in range(spans.shape[0]):
            if (
                j != i
                and spans[i, 0] < spans[i, 1]
                and spans[j, 0] < spans[j, 1]
                and spans[i, 0] < spans[j, 1]
                and spans[j, 0] < spans[i, 1]
            ):
                return False
    return True


@cpu_jit(nogil=True)
def _slot(rtt, lut, has_lut, row, position):
    """``_resolve`` of :mod:`.plan` for one (row, position)."""
    slot = _OOR
    if 0 <= row < rtt.shape[0] and 0 <= position < rtt.shape[1]:
        slot = np.int64(rtt[row, position])
    if not has_lut or slot < 0:
        return slot
    return lut[slot] if slot < lut.shape[0] else _OOR


@cpu_jit(nogil=True)
def _starts(prefix_lens, r, window):
    """(clamped prefix, window start) of request ``r``."""
    prefix = max(prefix_lens[r], 0)
    return prefix, (max(prefix - window, 0) if window > 0 else 0)


@cpu_jit(nogil=True)
def _offsets(
    rpi,
    prefix_lens,
    extend_lens,
    rtt,
    lut,
    has_lut,
    window,
    vcap,
    v_offsets,
    w_offsets,
    w_seeds,
    w_num,
    v_num,
    v_enable,
):
    """The offsets step in one pass over the requests; True when verify entries are due (no overflow,
    total > 0). ``v_offsets`` (exclusive verify offsets, total at ``[bs]``) is written unless empty."""
    bs = rpi.shape[0]
    cap = vcap + 1  # a verify length above this overflows on its own (keeps the total from wrapping)
    keep_offsets = v_offsets.shape[0] > 0
    total = np.int64(0)
    written = np.int64(0)
    for r in range(bs):
        active = rpi[r] != _PADDING
        prefix, start = _starts(prefix_lens, r, window)
        if keep_offsets:
            v_offsets[r] = total
        if active:
            total += min(prefix - start, cap)
        w_offsets[r] = written
        extend = max(extend_lens[r], 0) if active else 0
        written += extend
        seed = _NO_PREV
        if active and extend > 0 and prefix > 0:
            seed = _slot(rtt, lut, has_lut, rpi[r], prefix - 1)
        w_seeds[r] = seed
    if keep_offsets:
        v_offsets[bs] = total
    w_offsets[bs] = written
    for r in range(bs + 1, w_offsets.shape[0]):
        w_offsets[r] = 0
    for r in range(bs, w_seeds.shape[0]):
        w_seeds[r] = _NO_PREV
    w_num[0] = bs
    overflow = total > vcap
    v_num[0] = vcap if overflow else total
    v_enable[0] = 0 if overflow else 1
    return not overflow and total > 0  # overflow: entries left alone, as in the vectorised plan


@cpu_jit(nogil=True)
def _offsets_only(
    rpi,
    prefix_lens,
    extend_lens,
    rtt,
    lut,
    has_lut,
    window,
    vcap,
    v_offsets,
    w_offsets,
    w_seeds,
    w_num,
    v_num,
    v_enable,
):
    # Outputs first, then inputs (the scratch's tail past bs + 1 is not written).
    spans = _spans(
        (
            v_offsets[: rpi.shape[0] + 1],
            w_offsets,
            w_seeds,
            w_num,
            v_num,
            v_enable,
            rpi,
            prefix_lens,
            extend_lens,
            rtt,
            lut,
        )
    )
    if not _disjoint(spans, 6):
        return False
    _offsets(
        rpi,
        prefix_lens,
        extend_lens,
        rtt,
        lut,
        has_lut,
        window,
        vcap,
        v_offsets,
        w_offsets,
        w_seeds,
        w_num,
        v_num,
        v_enable,
    )
    return True


@cpu_jit(nogil=True)
def _plan(
    rpi,
    prefix_lens,
    extend_lens,
    rtt,
    lut,
    has_lut,
    window,
    vcap,
    pool,
    lens,
    has_pool,
    offset,
    w_offsets,
    w_seeds,
    w_num,
    v_slots,
    v_tokens,
    v_positions,
    v_prevs,
    v_num,
    v_enable,
):
    # Outputs first, then inputs: the loop runs only if no output meets another array.
    spans = _spans(
        (
            w_offsets,
            w_seeds,
            w_num,
            v_slots,
            v_tokens,
            v_positions,
            v_prevs,
            v_num,
            v_enable,
            rpi,
            prefix_lens,
            extend_lens,
            rtt,
            lut,
            pool,
            lens,
        )
    )
    if not _disjoint(spans, 9):
        return False
    no_offsets = np.empty(0, dtype=np.int64)  # the full plan keeps no verify offsets (a global would be read-only)
    if not _offsets(
        rpi,
        prefix_lens,
        extend_lens,
        rtt,
        lut,
        has_lut,
        window,
        vcap,
        no_offsets,
        w_offsets,
        w_seeds,
        w_num,
        v_num,
        v_enable,
    ):
        return True

    bs = rpi.shape[0]
    i = 0
    for r in range(bs):
        row = rpi[r]
        if row == _PADDING:
            continue
        prefix, start = _starts(prefix_lens, r, window)
        prev = _slot(rtt, lut, has_lut, row, start - 1) if start > 0 else _NO_PREV
        bound = min(lens[r], pool.shape[1]) if has_pool else 0
        for position in range(start, prefix):
            slot = _slot(rtt, lut, has_lut, row, position)
            token = _UNCHECKED
            if has_pool:
                column = position + offset
                if 0 <= row < pool.shape[0] and 0 <= column < bound:
                    token = np.int64(pool[row, column])
            v_slots[i], v_tokens[i], v_positions[i], v_prevs[i] = slot, token, position, prev
            prev = slot
            i += 1
    return True


def plan_small_batch(
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
) -> bool:
    """:func:`.plan.plan_vectorised` as a compiled loop; False (nothing written) when arrays overlap.

    Takes the same keyword arguments (validated, NumPy) and fills the same outputs with the same
    bytes; the offsets scratch of the vectorised plan is internal and not needed here.
    """
    vplan, wplan = verify_plan_out, write_plan_out
    lut, pool = full_to_swa_index_mapping, req_to_verify_expected_tokens
    return _plan(
        req_pool_indices,
        prefix_lens,
        extend_seq_lens,
        req_to_token,
        _NO_LUT if lut is None else lut,
        lut is not None,
        int(swa_window_size),
        int(verify_capacity),
        _NO_POOL if pool is None else pool,
        _NO_LENS if pool is None else req_to_verify_expected_tokens_valid_lens,
        pool is not None,
        int(kv_token_id_vs_position_offset),
        wplan.write_offsets,
        wplan.write_seed_slot_indices,
        wplan.write_num_valid_reqs,
        vplan.verify_slot_indices,
        vplan.verify_expected_tokens,
        vplan.verify_expected_positions,
        vplan.verify_prev_slot_indices,
        vplan.verify_num_valid,
        vplan.enable,
    )


def offsets_small_batch(
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
) -> bool:
    """:func:`kvcanary_numba.plan_offsets.launch_plan_offsets_kernel` as a compiled loop; False (nothing written) when arrays overlap.

    Takes the same keyword arguments (validated, NumPy) and writes the same bytes.
    """
    lut = full_to_swa_index_mapping
    return _offsets_only(
        req_pool_indices,
        prefix_lens,
        extend_seq_lens,
        req_to_token,
        _NO_LUT if lut is None else lut,
        lut is not None,
        int(swa_window_size),
        int(verify_capacity),
        out_verify_offsets_scratch,
        out_write_offsets,
        out_write_seed_slot_indices,
        out_write_num_valid_reqs,
        out_verify_num_valid,
        out_verify_enable,
    )
