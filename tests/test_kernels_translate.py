"""Slot translation kernel (the monitor's SWA slots) through its launch glue, against the array
operations it replaces (``monitor.groups.translate_slots``): negative slots, slots past the LUT,
the LUT's first and last entries, empty steps."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_pairs import KERNEL_DEVICE, to_device, to_host

from kvcanary_numba.constants import OUT_OF_RANGE_SLOT
from kvcanary_numba.fast import inputs as glue
from kvcanary_numba.monitor.groups import translate_slots

FILL = -77


def run_both(lut, index) -> np.ndarray:
    """Translate on the array operations and on the kernel; assert equal; return the kernel's output."""
    lut, index = np.asarray(lut, dtype=np.int64), np.asarray(index, dtype=np.int64)
    n = index.shape[0]
    want = np.full(n, FILL, dtype=np.int64)
    translate_slots(np, lut, index, out=want, clipped=np.zeros(n, np.int64), mask=np.zeros(n, bool))
    out = to_device(np.full(n + 2, FILL, dtype=np.int64), KERNEL_DEVICE)  # two entries past n stay untouched
    glue.translate_slots(lut=to_device(lut, KERNEL_DEVICE), index=to_device(index, KERNEL_DEVICE), out=out[:n])
    got = to_host(out)
    np.testing.assert_array_equal(got, np.concatenate([want, [FILL, FILL]]))
    return got[:n]


@pytest.mark.simulator
def test_translation_rules_pinned():
    lut = [0, 5, 6, 0, 9]
    got = run_both(lut, [1, 2, -1, 4, 5, 0, -7, 3, 2**40])
    assert got.tolist() == [5, 6, -1, 9, OUT_OF_RANGE_SLOT, 0, -7, 0, OUT_OF_RANGE_SLOT]
    assert run_both([0], [0, 1, -1]).tolist() == [0, OUT_OF_RANGE_SLOT, -1]  # a one-entry LUT
    assert run_both(lut, []).shape == (0,)  # nothing launched, nothing written


@pytest.mark.simulator
@pytest.mark.parametrize("seed", range(4))
def test_random_slots_equal_the_array_operations(seed):
    rng = np.random.default_rng(seed)
    size = int(rng.integers(1, 50))
    lut = rng.integers(0, 1000, size)
    run_both(lut, rng.integers(-5, size + 5, int(rng.integers(1, 200))))


@pytest.mark.gpu
def test_gpu_translation_at_scale():
    pytest.importorskip("cupy")
    rng = np.random.default_rng(9)
    lut = rng.integers(0, 1 << 30, 1 << 20)
    run_both(lut, rng.integers(-100, (1 << 20) + 100, 300_000))
