"""Baselines the benchmarks measure the package's kernels against (not part of the package).

- ``write_baseline``: SGLang's write design, one thread per request, everything serial
  (runtime flags), with the package's semantics: ``bench_kernels`` reports the write
  kernel's speed-up over it.
- ``chain_synth`` / ``chain_streamed``: the bare chain recurrence, one chain per thread
  with nothing else on its critical path: tokens and positions are either synthesized
  from the step number or read from a small array every thread shares (L1 hits). Its
  time per step on a lightly loaded GPU is the per-token floor of any write chain:
  ``bench_chain`` compares the write kernel with it.
- ``gather_touch``: the memory traffic of a PARTIAL records gather and nothing else (each
  entry's slot, the slot's 32-byte record and the first 16 bytes of its K and V rows loaded,
  a 32-byte pack row stored; no hashing, no check): ``bench_moves`` reports how close the
  gather and the digest come to this access pattern's own ceiling.

Launched through the package's core launch (``kvcanary_numba.launch._launch``), so a
benchmark's fast-wing sink (packed launches) applies to them as to the package's kernels.
"""

from __future__ import annotations

from numba import cuda, int64, uint64

from kvcanary_numba.kernels.fingerprint import real_kv_hash
from kvcanary_numba.kernels.hashing import CHAIN_HEAD, ONE, ZERO, mix3
from kvcanary_numba.kernels.write import ARGUMENTS as WRITE_ARGUMENTS
from kvcanary_numba.kernels.write_chunk import entry_checks, request_range, seed_state, store_record
from kvcanary_numba.launch import _launch
from kvcanary_numba.launch.write import write_arguments

__all__ = ["KERNELS", "SIGNATURES", "launch_chain_limit", "launch_gather_touch", "launch_write_baseline"]


@cuda.jit
def chain_synth(steps, out):
    """``out[t]`` = the chain of thread ``t`` over ``steps`` synthesized (token, position) pairs.

    Token of step ``i`` is ``t * 7919 + i``, position ``i`` (int64 [threads] ``out``).
    """
    t = int64(cuda.grid(1))
    if t >= out.shape[0]:
        return
    running = CHAIN_HEAD ^ uint64(t)
    token = t * int64(7919)
    for i in range(steps):
        running = mix3(running, uint64(token + i), uint64(i))
    out[t] = int64(running)


@cuda.jit
def chain_streamed(steps, tokens, positions, out):
    """Same recurrence with (token, position) of step ``i`` read from ``tokens[i % n]``,
    ``positions[i % n]`` (int64 [n], shared by every thread); ``out`` int64 [threads]."""
    t = int64(cuda.grid(1))
    if t >= out.shape[0]:
        return
    n = int64(tokens.shape[0])
    running = CHAIN_HEAD ^ uint64(t)
    k = ZERO
    for _ in range(steps):
        running = mix3(running, uint64(tokens[k]), uint64(positions[k]))
        k += ONE
        if k == n:
            k = ZERO
    out[t] = int64(running)


def _write_baseline(
    buf,
    offsets,
    seeds,
    num_valid_reqs,
    input_ids,
    positions,
    out_cache_loc,
    expected_tokens,
    expected_positions,
    chain_flag,
    ring,
    write_index,
    slot_counter,
    kernel_counter,
    kind,
    w0,
    w1,
    w2,
    w3,
    params,
    input_assert,
    nsrc,
):
    # One thread walks one request, everything in order (SGLang's layout).
    r = int64(cuda.grid(1))
    if r == ZERO:
        cuda.atomic.add(kernel_counter, 0, ONE)
    num_reqs = min(max(int64(num_valid_reqs[0]), ZERO), int64(seeds.shape[0]))
    if r >= num_reqs:
        return
    num_slots = int64(buf.shape[0])
    lo, hi = request_range(offsets, r, int64(input_ids.shape[0]), ring, write_index, kind, True)
    if hi <= lo:
        return
    seed = seeds[r]
    track = chain_flag[0] != 0 and seed >= ZERO and seed < num_slots
    running, prev_position = seed_state(buf, seed, num_slots, ring, write_index, kind, True)
    stored = ZERO
    for i in range(lo, hi):
        slot = out_cache_loc[i]
        if slot < ZERO:
            continue
        token = input_ids[i]
        position = positions[i]
        chain_hash = int64(running)
        expected_token = expected_tokens[i] if input_assert != ZERO else ZERO
        expected_position = expected_positions[i] if input_assert != ZERO else ZERO
        if entry_checks(
            ring,
            write_index,
            kind,
            slot,
            token,
            position,
            chain_hash,
            input_assert != ZERO,
            expected_token,
            expected_position,
            track,
            prev_position + ONE,
            num_slots,
        ):
            real = int64(real_kv_hash(slot, nsrc, w0, w1, w2, w3, params))
            store_record(buf, slot, token, position, chain_hash, real)
            stored += ONE
        if track:
            prev_position = position
        running = mix3(running, uint64(token), uint64(position))
    if stored > ZERO:
        cuda.atomic.add(slot_counter, 0, stored)


write_baseline = cuda.jit(_write_baseline)


@cuda.jit
def gather_touch(buf, slots, out, k_words, v_words, row_words):
    """``out[i]`` = the record of ``slots[i]`` (int64 [rows, 4] ``buf``) XOR the first two words of
    its K and V rows (uint64 [rows * row_words]); one thread per entry, nothing else done."""
    i = int64(cuda.grid(1))
    if i >= slots.shape[0]:
        return
    slot = slots[i]
    base = slot * row_words
    k0, k1, v0, v1 = k_words[base], k_words[base + ONE], v_words[base], v_words[base + ONE]
    out[i, 0] = buf[slot, 0] ^ int64(k0)
    out[i, 1] = buf[slot, 1] ^ int64(k1)
    out[i, 2] = buf[slot, 2] ^ int64(v0)
    out[i, 3] = buf[slot, 3] ^ int64(v1)


@cuda.jit
def records_touch(buf, slots, out):
    """``out[i] = buf[slots[i]]`` (int64 [rows, 4] records), a thread per word: the loads and stores
    of a NONE gather and nothing else (no range check, no counters, no rows)."""
    item = int64(cuda.grid(1))
    if item >= slots.shape[0] * 4:
        return
    i = item // 4
    word = item - i * 4
    out[i, word] = buf[slots[i], word]


KERNELS = {
    "chain_synth": chain_synth,
    "chain_streamed": chain_streamed,
    "write_baseline": write_baseline,
    "gather_touch": gather_touch,
    "records_touch": records_touch,
}
SIGNATURES = {
    "chain_synth": ("void(int64, int64[::1])",),
    "chain_streamed": ("void(int64, int64[::1], int64[::1], int64[::1])",),
    "write_baseline": (f"void({WRITE_ARGUMENTS}, int64, int64)",),  # the write kernel's, then the two flags
    "gather_touch": ("void(int64[:, ::1], int64[::1], int64[:, ::1], uint64[::1], uint64[::1], int64)",),
    "records_touch": ("void(int64[:, ::1], int64[::1], int64[:, ::1])",),
}


def launch_chain_limit(*, out, steps: int, tokens=None, positions=None, block: int = 32, stream=None) -> None:
    """Run one chain of ``steps`` ``mix3`` rounds per element of ``out`` (int64 [threads]).

    ``tokens``, ``positions``: int64 [n] streamed inputs (``chain_streamed``, step ``i`` reads
    index ``i % n``), or None to synthesize them (``chain_synth``). ``block``: threads per
    block (32: one warp per block keeps each SM's scheduler lightly loaded).
    """
    grid = _launch.grid_for(out.shape[0], block)
    if tokens is None:
        name, args = "chain_synth", (int(steps), _launch.kernel_array(out))
    else:
        arrays = (_launch.kernel_array(a) for a in (tokens, positions, out))
        name, args = "chain_streamed", (int(steps), *arrays)
    _launch.launch(KERNELS[name], SIGNATURES[name][0], grid, block, args, stream)


def launch_write_baseline(
    *,
    context,
    plan,
    input_ids,
    positions,
    out_cache_loc,
    enable_write_input_assert,
    expected_input_tokens,
    expected_input_positions,
    stream=None,
) -> None:
    """The write of :func:`kvcanary_numba.launch_canary_write_kernel` with one thread per request
    (SGLang's layout): the whole request, real-KV folds included, runs serially in one thread."""
    nsrc, args = write_arguments(
        context, plan, input_ids, positions, out_cache_loc, expected_input_tokens, expected_input_positions
    )
    capacity = plan.write_seed_slot_indices.shape[0]
    block = 1  # SGLang's kWriteBlockSize
    args = (*args, int(bool(enable_write_input_assert)), nsrc)
    _launch.launch(
        write_baseline, SIGNATURES["write_baseline"][0], _launch.grid_for(capacity, block), block, args, stream
    )


def launch_gather_touch(*, canary_buf, slot_indices, out_records, k_rows=None, v_rows=None, stream=None) -> None:
    """:func:`gather_touch` over a context's ``canary_buf`` (uint8 [rows, 32]), int64 [n]
    ``slot_indices``, uint8 [n, 32] ``out_records`` and the K and V rows (uint8 [rows, bytes],
    bytes a multiple of 8); the memory ceiling of a PARTIAL gather of these slots. Without K and
    V rows, :func:`records_touch`: the ceiling of a NONE gather."""
    n, rows, block = slot_indices.shape[0], canary_buf.shape[0], 256
    records = (
        _launch.reinterpret(canary_buf, "int64", (rows, 4)),
        _launch.kernel_array(slot_indices),
        _launch.reinterpret(out_records, "int64", (n, 4)),
    )
    if k_rows is None:
        signature = SIGNATURES["records_touch"][0]
        _launch.launch(records_touch, signature, _launch.grid_for(n * 4, block), block, records, stream)
        return
    kv = (_launch.reinterpret(k_rows, "uint64"), _launch.reinterpret(v_rows, "uint64"), int(k_rows.shape[1] // 8))
    _launch.launch(
        gather_touch, SIGNATURES["gather_touch"][0], _launch.grid_for(n, block), block, (*records, *kv), stream
    )
