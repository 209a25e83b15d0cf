"""The bare chain-recurrence kernels (benchmark floor of the write chain) against the host hash."""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest
from kernel_pairs import KERNEL_DEVICE, to_device, to_host

from kvcanary_numba.hashing import chain_head, splitmix64_mix3, to_signed

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the benchmarks package, as tests/test_benchmarks.py imports it
    sys.path.insert(0, str(ROOT))

from benchmarks.baseline_kernels import launch_chain_limit  # noqa: E402

pytestmark = pytest.mark.simulator


def _host_chain(thread: int, tokens, positions) -> int:
    running = chain_head() ^ thread
    for token, position in zip(tokens, positions):
        running = splitmix64_mix3(running, token, position)
    return to_signed(running)


def test_synthesized_chains_match_the_host_hash():
    steps, threads = 5, 3
    out = to_device(np.zeros(threads, dtype=np.int64), KERNEL_DEVICE)
    launch_chain_limit(out=out, steps=steps)
    want = [_host_chain(t, [t * 7919 + i for i in range(steps)], range(steps)) for t in range(threads)]
    assert to_host(out).tolist() == want


def test_streamed_chains_wrap_around_their_inputs():
    tokens = np.array([11, -3, 1 << 40], dtype=np.int64)
    positions = np.array([0, 1, 2], dtype=np.int64)
    steps, threads = 7, 2  # wraps twice, part-way the second time
    out = to_device(np.zeros(threads, dtype=np.int64), KERNEL_DEVICE)
    dev = [to_device(a, KERNEL_DEVICE) for a in (tokens, positions)]
    launch_chain_limit(out=out, steps=steps, tokens=dev[0], positions=dev[1])
    idx = [i % 3 for i in range(steps)]
    want = [_host_chain(t, tokens[idx].tolist(), positions[idx].tolist()) for t in range(threads)]
    assert to_host(out).tolist() == want
