"""Real-KV fingerprint kernel (``compute_real_kv_hash``, simulator or GPU).

Each call runs the kernel and the NumPy reference on the same slots and must
agree; values are also checked against the pinned known answer (SGLang's tests, docs/concepts/sglang.md) and against a byte-by-byte scalar oracle.
"""

from __future__ import annotations

import numpy as np
import pytest
from canary_oracles import KNOWN_REAL_KV_HASH, known_source, random_source, scalar_real_kv_hash
from kernel_pairs import KERNEL_DEVICE, to_device, to_host

from kvcanary_numba import RealKvHashMode, RealKvSource, compute_real_kv_hash
from kvcanary_numba.hashing import to_unsigned
from kvcanary_numba.launch._launch import SIM_BLOCK, SIM_MAX_BLOCKS

pytestmark = pytest.mark.simulator

NONE, PARTIAL, ALL = RealKvHashMode.NONE, RealKvHashMode.PARTIAL, RealKvHashMode.ALL


def fingerprints(sources, mode, slots) -> list[int]:
    """Kernel fingerprints of ``slots`` (asserted equal to the reference's), as unsigned ints."""
    slots = np.asarray(slots, dtype=np.int64)
    want = np.full(slots.shape, 7, dtype=np.int64)
    compute_real_kv_hash(real_kv_sources=tuple(sources), real_kv_hash_mode=mode, slot_indices=slots, out=want)
    device_sources = tuple(to_device(s, KERNEL_DEVICE) for s in sources)
    got = to_device(np.full(slots.shape, 7, dtype=np.int64), KERNEL_DEVICE)
    compute_real_kv_hash(
        real_kv_sources=device_sources,
        real_kv_hash_mode=mode,
        slot_indices=to_device(slots, KERNEL_DEVICE),
        out=got,
        backend="cuda",
    )
    np.testing.assert_array_equal(to_host(got), want)
    return [to_unsigned(int(v)) for v in want]


@pytest.mark.parametrize("mode", [PARTIAL, ALL])
@pytest.mark.parametrize(("slot", "page_size", "nbytes"), [(1, 1, 16), (6, 4, 32), (3, 2, 128)])
def test_known_answer(mode, slot, page_size, nbytes):
    source = known_source(slot, rows=4, page_size=page_size, nbytes=nbytes)
    assert fingerprints([source], mode, [slot])[0] == KNOWN_REAL_KV_HASH


@pytest.mark.parametrize("count", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("mode", [NONE, PARTIAL, ALL])
def test_sources_fold_in_order_like_the_scalar_oracle(rng, count, mode):
    geometry = [(1, 32, 32, 16), (4, 16, 16, 0), (16, 64, 48, 0), (2, 128, 96, 32)][:count]
    sources = [random_source(rng, 40, page_size=p, nbytes=n, read_bytes=r, hole=h) for p, n, r, h in geometry]
    slots = list(range(40))
    got = fingerprints(sources, mode, slots)
    assert got == [scalar_real_kv_hash(sources, mode, s) for s in slots]
    assert (len(set(got)) == 40) == (count > 0 and mode != NONE)


def test_fold_order_matters(rng):
    a, b = random_source(rng, 8), random_source(rng, 8)
    assert fingerprints([a, b], ALL, [3]) != fingerprints([b, a], ALL, [3])


def test_strided_rows_and_wider_dtype(rng):
    base = rng.integers(-(2**31), 2**31 - 1, size=(10, 24), dtype=np.int32)  # 96-byte rows
    source = RealKvSource(tensor=base[::2, :16], page_size=2, num_bytes_per_token=32, read_bytes=32)  # 192-byte stride
    slots = list(range(10))
    assert fingerprints([source], ALL, slots) == [scalar_real_kv_hash([source], ALL, s) for s in slots]


def test_single_row_source_with_odd_row_length(rng):
    source = RealKvSource(
        tensor=rng.integers(0, 256, size=(1, 40), dtype=np.uint8), page_size=2, num_bytes_per_token=16, read_bytes=16
    )
    assert fingerprints([source], ALL, [0, 1]) == [scalar_real_kv_hash([source], ALL, s) for s in (0, 1)]


def test_holes_are_never_read(rng):
    source = random_source(rng, 8, nbytes=32, hole=32)
    before = fingerprints([source], ALL, range(8))
    source.tensor[:, 32:] ^= 0xFF
    assert fingerprints([source], ALL, range(8)) == before


def test_uncovered_and_negative_slots_give_zero(rng):
    wide, narrow = random_source(rng, 16), random_source(rng, 8, page_size=4)
    got = fingerprints([wide, narrow], PARTIAL, [-1, -(2**63), 7, 8, 15, 2**62])
    assert got[0] == got[1] == got[3] == got[4] == got[5] == 0 and got[2] != 0


@pytest.mark.parametrize("n", [0, 1, SIM_BLOCK, SIM_BLOCK * SIM_MAX_BLOCKS + 7])
def test_grid_stride_covers_every_slot(rng, n):
    source = random_source(rng, 64, page_size=4, nbytes=16)
    slots = rng.integers(0, 64, n)
    assert fingerprints([source], ALL, slots) == [scalar_real_kv_hash([source], ALL, int(s)) for s in slots]


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [PARTIAL, ALL])
def test_gpu_million_slots_match_the_reference(mode):
    rng = np.random.default_rng(5)
    sources = [random_source(rng, 1 << 18, page_size=16, nbytes=256), random_source(rng, 1 << 18, nbytes=64)]
    fingerprints(sources, mode, rng.integers(-5, (1 << 18) + 5, 1 << 20))
