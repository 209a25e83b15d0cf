"""The bare chain recurrence: the latency limit the write chain is measured against.

Each thread runs ``steps`` dependent ``mix3`` rounds in registers, one chain
per thread, with nothing else on its critical path: tokens and positions are
either synthesized from the step number (integer adds the GPU issues while the
previous round's multiplies are in flight) or read from a small array every
thread shares (L1 hits, issued before the round needs them). The kernel's time
per step on a lightly loaded GPU is the per-token floor of any write chain:
``benchmarks/bench_chain.py`` compares the write kernel with it.
"""

from __future__ import annotations

from numba import cuda, int64, uint64

from .hashing import CHAIN_HEAD, ONE, ZERO, mix3

__all__ = ["KERNELS", "SIGNATURES"]


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


KERNELS = {"chain_synth": chain_synth, "chain_streamed": chain_streamed}
SIGNATURES = {
    "chain_synth": ("void(int64, int64[::1])",),
    "chain_streamed": ("void(int64, int64[::1], int64[::1], int64[::1])",),
}
