"""Scatter kernel through the launch glue (and the public wrapper), byte for byte against the reference.

Cases: SGLang's scatter tests (SGLang's tests, docs/concepts/sglang.md) with pinned rows,
random batches, hostile offsets / rows / token values, and pool widths around
the column tile. Requests of one batch name distinct rows (with duplicates,
which request lands is unspecified). The ``gpu`` tests repeat this at scale.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_pairs import KERNEL_DEVICE, to_device, to_host

from kvcanary_numba import scatter as public
from kvcanary_numba.fast import inputs as fast_glue
from kvcanary_numba.launch import _launch as _common, scatter as glue
from kvcanary_numba.reference import scatter as reference

FILL = -5


def to_kernel(x):
    """``x`` where the kernels run (a copy), scalars and None as they are."""
    return to_device(x, KERNEL_DEVICE)


def run_both(flat, offsets, rows, pool, *, via_public=False, lens=False) -> np.ndarray:
    """Scatter on the reference and the kernel from the same pool; assert equal; return the kernel's pool.

    ``lens``: the monitor's launch (``scatter_tokens_and_lens``), whose valid lengths must also
    be what the eager path's subtraction gives (``offsets[1:] - offsets[:-1]``, wrapping)."""
    flat, offsets, rows = (np.asarray(a, dtype=np.int64) for a in (flat, offsets, rows))
    want = pool.copy()
    reference.scatter_req_token_ids(flat_in=flat, offsets=offsets, req_pool_indices=rows, pool_out=want)
    got = to_kernel(pool.copy())
    args = dict(flat_in=to_kernel(flat), offsets=to_kernel(offsets), req_pool_indices=to_kernel(rows), pool_out=got)
    if lens:
        out = to_kernel(np.full(rows.shape[0] + 2, FILL, dtype=np.int64))  # two words past bs stay untouched
        fast_glue.scatter_tokens_and_lens(**args, lens_out=out[: rows.shape[0]])
        with np.errstate(over="ignore"):
            want_lens = np.concatenate([np.subtract(offsets[1:], offsets[:-1]), [FILL, FILL]])
        np.testing.assert_array_equal(to_host(out), want_lens)
    elif via_public:
        public.scatter_req_token_ids(**args, backend="cuda")
    else:
        glue.scatter_req_token_ids(**args)
    got = to_host(got)
    np.testing.assert_array_equal(got, want)
    return got


def pool_of(rows, width):
    return np.full((rows, width), FILL, dtype=np.int32)


def random_case(rng, bs, width, *, rows=None):
    rows = rows or bs + 3
    lengths = rng.integers(0, 2 * width + 2, bs)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    flat = rng.integers(-(1 << 40), 1 << 40, int(offsets[-1]))
    return flat, offsets, rng.permutation(rows)[:bs], pool_of(rows, width)


@pytest.mark.simulator
def test_basic_rows_pinned():
    pool = run_both([10, 20, 30, 40, 50, 60, 70, 80, 90], [0, 3, 5, 9], [3, 1, 5], pool_of(6, 8), via_public=True)
    assert pool[3, :4].tolist() == [10, 20, 30, FILL]
    assert pool[1, :3].tolist() == [40, 50, FILL]
    assert pool[5, :5].tolist() == [60, 70, 80, 90, FILL]
    assert (pool[[0, 2, 4]] == FILL).all()


@pytest.mark.simulator
def test_truncates_at_width_and_keeps_neighbour_row():
    pool = run_both(np.arange(100, 120), [0, 20], [1], pool_of(3, 8))
    assert pool[1].tolist() == list(range(100, 108))
    assert (pool[[0, 2]] == FILL).all()


@pytest.mark.simulator
def test_empty_middle_request_and_empty_batch():
    pool = run_both([1, 2, 3, 4], [0, 2, 2, 4], [1, 2, 3], pool_of(4, 5))
    assert (pool[2] == FILL).all() and pool[3, :2].tolist() == [3, 4]
    assert (run_both([], [0], [], pool_of(2, 4)) == FILL).all()
    assert (run_both([7, 8], [0, 0], [1], pool_of(2, 4)) == FILL).all()


@pytest.mark.simulator
def test_tokens_cast_to_int32_with_wraparound():
    pool = run_both([(1 << 32) + 5, -1, (1 << 31)], [0, 3], [0], pool_of(1, 4))
    assert pool[0].tolist() == [5, -1, -(1 << 31), FILL]


@pytest.mark.simulator
def test_hostile_offsets_and_rows_pinned():
    # Requests: (-2, 3) -> row 1; (3, 1) inverted -> row 2; (1, 4) -> row -1; (4, 9) -> row 3;
    # (9, 2) inverted -> row 0; (2, 5) -> row 4, past the pool. Reads before flat_in[0] or
    # past its end are skipped column by column.
    flat = [11, 12, 13, 14, 15, 16]
    pool = run_both(flat, [-2, 3, 1, 4, 9, 2, 5], [1, 2, -1, 3, 0, 4], pool_of(4, 6), via_public=True)
    assert pool[1].tolist() == [FILL, FILL, 11, 12, 13, FILL]
    assert pool[3].tolist() == [15, 16, FILL, FILL, FILL, FILL]
    assert (pool[[0, 2]] == FILL).all()


@pytest.mark.simulator
@pytest.mark.parametrize("seed", range(8))
def test_random_batches_equal_reference(seed):
    rng = np.random.default_rng(seed)
    run_both(*random_case(rng, int(rng.integers(1, 12)), int(rng.integers(1, 40))), via_public=seed % 2 == 0)


@pytest.mark.simulator
@pytest.mark.parametrize("seed", range(6))
def test_garbage_equals_reference(seed):
    rng = np.random.default_rng(50 + seed)
    bs, width, rows, num_tokens = int(rng.integers(1, 10)), int(rng.integers(1, 20)), 6, int(rng.integers(0, 30))
    offsets = rng.integers(-10, num_tokens + 10, bs + 1)
    offsets[rng.integers(0, bs + 1)] = rng.choice([np.iinfo(np.int64).max, np.iinfo(np.int64).min + 3])
    req_rows = rng.permutation(np.arange(-3, rows + 3))[:bs]
    run_both(rng.integers(-(1 << 62), 1 << 62, num_tokens), offsets, req_rows, pool_of(rows, width))


def _block() -> int:
    return _common.block_size(glue.SCATTER_BLOCK)


@pytest.mark.simulator
@pytest.mark.parametrize("width_from_block", [-1, 0, 1, 2])
@pytest.mark.parametrize("bs", [1, 3, 5])
def test_widths_around_column_tile(width_from_block, bs):
    width = max(1, _block() + width_from_block) if width_from_block < 2 else 2 * _block() + 1
    run_both(*random_case(np.random.default_rng(bs * 10 + width_from_block), bs, width))


@pytest.mark.gpu
@pytest.mark.parametrize(("bs", "width"), [(1, 1 << 16), (1024, 2048), (65536, 24), (70000, 257)])
def test_gpu_scale_equals_reference(bs, width):
    pytest.importorskip("cupy")
    run_both(*random_case(np.random.default_rng(bs), bs, width))


@pytest.mark.gpu
def test_gpu_garbage_at_scale_equals_reference():
    pytest.importorskip("cupy")
    rng = np.random.default_rng(77)
    bs, width, rows = 20000, 300, 30000
    offsets = rng.integers(-100, 50000, bs + 1)
    req_rows = rng.permutation(np.arange(-5000, rows + 5000))[:bs]
    run_both(rng.integers(-(1 << 62), 1 << 62, 40000), offsets, req_rows, pool_of(rows, width))


# --- the monitor's launch: the scatter and the valid lengths together ------------------------------------


@pytest.mark.simulator
def test_lens_launch_pinned_cases():
    pool = run_both([10, 20, 30, 40, 50, 60, 70, 80, 90], [0, 3, 5, 9], [3, 1, 5], pool_of(6, 8), lens=True)
    assert pool[3, :4].tolist() == [10, 20, 30, FILL]
    # Nothing to scatter (no tokens, an empty request, a row outside the pool): lengths written anyway.
    run_both([], [0, 0, 0], [1, 2], pool_of(3, 4), lens=True)
    run_both([7, 8], [0, 2], [9], pool_of(2, 4), lens=True)
    run_both([11, 12, 13, 14, 15, 16], [-2, 3, 1, 4, 9, 2, 5], [1, 2, -1, 3, 0, 4], pool_of(4, 6), lens=True)
    big = np.iinfo(np.int64)
    run_both([1, 2], [big.max, big.min + 3, 0], [0, 1], pool_of(2, 3), lens=True)  # wrapping differences


@pytest.mark.simulator
@pytest.mark.parametrize("seed", range(4))
def test_lens_launch_random_and_garbage_batches(seed):
    rng = np.random.default_rng(90 + seed)
    run_both(*random_case(rng, int(rng.integers(1, 12)), int(rng.integers(1, 40))), lens=True)
    bs, rows, num_tokens = int(rng.integers(1, 10)), 6, int(rng.integers(0, 30))
    offsets = rng.integers(-10, num_tokens + 10, bs + 1)
    req_rows = rng.permutation(np.arange(-3, rows + 3))[:bs]
    run_both(rng.integers(-(1 << 62), 1 << 62, num_tokens), offsets, req_rows, pool_of(rows, 5), lens=True)


@pytest.mark.simulator
@pytest.mark.parametrize("width_from_block", [-1, 1, 2])
def test_lens_launch_widths_around_column_tile(width_from_block):
    width = max(1, _block() + width_from_block) if width_from_block < 2 else 2 * _block() + 1
    run_both(*random_case(np.random.default_rng(7 + width_from_block), 5, width), lens=True)


@pytest.mark.gpu
@pytest.mark.parametrize(("bs", "width"), [(1, 1 << 16), (1024, 2048), (70000, 257)])
def test_gpu_lens_launch_at_scale_equals_reference(bs, width):
    pytest.importorskip("cupy")
    run_both(*random_case(np.random.default_rng(bs + 1), bs, width), lens=True)
