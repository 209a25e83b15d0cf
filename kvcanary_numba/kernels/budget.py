"""Budget selection kernel: compacts the verify entries due at this step into a second plan.

Semantics: :mod:`kvcanary_numba.reference.budget` (same set of entries; the
order within the output is the order blocks reserve their ranges, not plan order).
"""

from __future__ import annotations

from numba import cuda, int32, int64

_PLAN = "int64[::1], int64[::1], int64[::1], int64[::1], int32[::1], int32[::1]"
#: Explicit signatures (eager compilation and the sm_90 PTX test).
SIGNATURES = {"select": (f"void({_PLAN}, {_PLAN}, int64[::1], int64[::1], int64, int64, int64)",)}


@cuda.jit
def select_kernel(
    slots,
    tokens,
    positions,
    prevs,
    num_valid,
    enable,
    out_slots,
    out_tokens,
    out_positions,
    out_prevs,
    out_num_valid,
    out_enable,
    step,
    scratch,
    period,
    multiplier,
    offset,
):
    """Grid-stride over tiles of ``blockDim.x`` entries; one global atomic per block and tile.

    ``scratch[0]`` counts the entries reserved so far, ``scratch[1]`` the blocks
    done; the last block to finish publishes the count and zeroes both, so one
    launch needs no separate reset.
    """
    shared = cuda.shared.array(2, int64)  # [0]: this tile's due entries, [1]: their base in the output
    tid = int64(cuda.threadIdx.x)
    tile = int64(cuda.blockDim.x)
    capacity = int64(slots.shape[0])
    n = min(max(int64(num_valid[0]), int64(0)), capacity)
    if enable[0] == 0:
        n = int64(0)
    t = step[0] % period
    if t < 0:
        t += period
    for start in range(int64(cuda.blockIdx.x) * tile, n, int64(cuda.gridDim.x) * tile):
        if tid == 0:
            shared[0] = 0
        cuda.syncthreads()
        i = start + tid
        local = int64(-1)
        if i < n:
            p = positions[i] % period
            if p < 0:
                p += period
            if (multiplier * p % period + offset + t) % period == 0:
                local = cuda.atomic.add(shared, 0, int64(1))
        cuda.syncthreads()
        if tid == 0:
            shared[1] = cuda.atomic.add(scratch, 0, shared[0])
        cuda.syncthreads()
        if local >= 0:
            j = shared[1] + local
            out_slots[j] = slots[i]
            out_tokens[j] = tokens[i]
            out_positions[j] = positions[i]
            out_prevs[j] = prevs[i]
        cuda.syncthreads()  # the next tile resets shared[0]
    cuda.threadfence()  # this block's reservations and entries are visible ...
    cuda.syncthreads()  # ... for every thread, before thread 0 counts the block as done
    if tid == 0:
        done = cuda.atomic.add(scratch, 1, int64(1))
        if done == int64(cuda.gridDim.x) - 1:
            out_num_valid[0] = int32(cuda.atomic.add(scratch, 0, int64(0)))
            out_enable[0] = enable[0]
            scratch[0] = 0
            scratch[1] = 0


KERNELS = {"select": select_kernel}
