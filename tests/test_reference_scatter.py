"""scatter_req_token_ids through the public wrapper on the NumPy backend (SGLang's tests, docs/concepts/sglang.md)."""

from __future__ import annotations

import numpy as np
import pytest
from canary_helpers import FakeCudaArray, fake_launch_module
from helpers import raises_code

from kvcanary_numba import scatter_req_token_ids


def scatter(tokens_per_request, rows, pool=None, *, width=8, pool_rows=8):
    """Scatter lists of tokens into ``rows``; returns the pool (zeros unless given)."""
    pool = np.zeros((pool_rows, width), np.int32) if pool is None else pool
    lengths = [len(t) for t in tokens_per_request]
    scatter_req_token_ids(
        flat_in=np.array([t for ts in tokens_per_request for t in ts], dtype=np.int64),
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        req_pool_indices=np.array(rows, dtype=np.int64),
        pool_out=pool,
        backend="numpy",
    )
    return pool


def loop_scatter(flat, offsets, rows, pool):
    """Independent per-column statement of the contract (Python ints, no wrap-around)."""
    out = pool.copy()
    for r, rp in enumerate(int(x) for x in rows):
        start, end = int(offsets[r]), int(offsets[r + 1])
        if not 0 <= rp < pool.shape[0]:
            continue
        for c in range(min(max(end - start, 0), pool.shape[1])):
            if 0 <= start + c < len(flat):
                out[rp, c] = (int(flat[start + c]) + 2**31) % 2**32 - 2**31  # int32 cast wraps
    return out


def test_basic_rows_3_1_5():
    pool = scatter([[10, 20, 30], [40, 50], [60, 70, 80, 90]], [3, 1, 5])
    want = np.zeros((8, 8), np.int32)
    want[3, :3], want[1, :2], want[5, :4] = [10, 20, 30], [40, 50], [60, 70, 80, 90]
    np.testing.assert_array_equal(pool, want)


def test_empty_batch_is_a_no_op():
    pool = np.full((4, 8), 7, np.int32)
    scatter([], [], pool)
    assert (pool == 7).all()


def test_single_request_leaves_the_rest_of_its_row():
    pool = np.full((4, 8), -3, np.int32)
    scatter([[5, 6]], [2], pool)
    assert pool[2].tolist() == [5, 6, -3, -3, -3, -3, -3, -3]
    assert (np.delete(pool, 2, axis=0) == -3).all()


def test_truncation_at_pool_width_keeps_neighbour_rows():
    pool = scatter([list(range(100, 120)), [1, 2]], [2, 3])
    assert pool[2].tolist() == list(range(100, 108))
    assert pool[3].tolist() == [1, 2, 0, 0, 0, 0, 0, 0]
    assert not pool[[0, 1, 4, 5, 6, 7]].any()


def test_empty_middle_request_leaves_its_row_zero():
    pool = scatter([[1, 2], [], [3]], [1, 2, 3])
    assert pool[1, :2].tolist() == [1, 2] and not pool[2].any() and pool[3, 0] == 3


def test_tokens_are_cast_to_int32():
    pool = scatter([[2**32 + 7, -1, 2**31]], [1])
    assert pool[1, :3].tolist() == [7, -1, -(2**31)]


@pytest.mark.parametrize(
    ("rows", "offsets", "flat_len", "want_rows"),
    [
        # Rows outside the pool are skipped, never wrapped around (row -1 is not the last row).
        ([-1, 8, 2], [0, 2, 4, 6], 6, {2: [4, 5]}),
        # An inverted range is empty.
        ([1, 2], [0, 3, 1], 6, {1: [0, 1, 2]}),
        # A range running past flat_in reads only the existing tokens; the other columns stay untouched.
        ([1, 2], [0, 4, 9], 6, {1: [0, 1, 2, 3], 2: [4, 5, -9, -9, -9]}),
        # A range starting before flat_in skips the negative flat indices.
        ([3], [-2, 3], 6, {3: [-9, -9, 0, 1, 2]}),
        # Hostile offsets far outside int32 range: nothing readable, nothing written.
        ([1, 2], [2**62, -(2**62), 2**62], 6, {}),
    ],
)
def test_bad_rows_and_offsets_are_safe(rows, offsets, flat_len, want_rows):
    pool = np.full((8, 8), -9, np.int32)
    scatter_req_token_ids(
        flat_in=np.arange(flat_len, dtype=np.int64),
        offsets=np.array(offsets, np.int64),
        req_pool_indices=np.array(rows, np.int64),
        pool_out=pool,
        backend="numpy",
    )
    want = np.full((8, 8), -9, np.int32)
    for row, values in want_rows.items():
        want[row, : len(values)] = values
    np.testing.assert_array_equal(pool, want)


@pytest.mark.parametrize("seed", range(8))
def test_random_scatter_matches_loop(seed):
    rng = np.random.default_rng(seed)
    pool_rows, width = int(rng.integers(1, 12)), int(rng.integers(1, 20))
    bs = int(rng.integers(0, pool_rows + 5))
    flat = rng.integers(-(2**40), 2**40, size=int(rng.integers(0, 60)), dtype=np.int64)
    offsets = np.sort(rng.integers(-3, len(flat) + 4, size=bs + 1)).astype(np.int64)
    if rng.random() < 0.3:
        rng.shuffle(offsets)  # inverted ranges too
    rows = rng.choice(np.arange(-2, pool_rows + 2), size=bs, replace=False).astype(np.int64)  # distinct rows
    pool = rng.integers(-100, 100, size=(pool_rows, width), dtype=np.int32)
    want = loop_scatter(flat, offsets, rows, pool)
    scatter_req_token_ids(flat_in=flat, offsets=offsets, req_pool_indices=rows, pool_out=pool, backend="numpy")
    np.testing.assert_array_equal(pool, want)


def _kwargs(**changes):
    kwargs = dict(
        flat_in=np.arange(4, dtype=np.int64),
        offsets=np.array([0, 1, 4], np.int64),
        req_pool_indices=np.array([1, 2], np.int64),
        pool_out=np.zeros((3, 4), np.int32),
        backend="numpy",
    )
    kwargs.update(changes)
    return kwargs


def _readonly_pool():
    pool = np.zeros((3, 4), np.int32)
    pool.flags.writeable = False
    return pool


@pytest.mark.parametrize(
    ("code", "changes"),
    [
        ("KVC-C001", dict(flat_in=[0, 1, 2, 3])),
        ("KVC-C002", dict(flat_in=np.arange(4, dtype=np.int32))),
        ("KVC-C002", dict(offsets=np.array([0, 1, 4], np.int32))),
        ("KVC-C002", dict(req_pool_indices=np.array([1, 2], np.int32))),
        ("KVC-C002", dict(pool_out=np.zeros((3, 4), np.int64))),
        ("KVC-C003", dict(flat_in=np.arange(4, dtype=np.int64).reshape(2, 2))),
        ("KVC-C003", dict(offsets=np.array([[0, 1, 4]], np.int64))),
        ("KVC-C003", dict(req_pool_indices=np.array([[1, 2]], np.int64))),
        ("KVC-C003", dict(pool_out=np.zeros(12, np.int32))),
        ("KVC-S001", dict(offsets=np.array([0, 4], np.int64))),
        ("KVC-S001", dict(offsets=np.array([0, 1, 4, 4], np.int64))),
        ("KVC-C006", dict(pool_out=np.zeros((3, 8), np.int32)[:, ::2])),
        ("KVC-C007", dict(pool_out=FakeCudaArray(np.zeros((3, 4), np.int32)))),
        ("KVC-C009", dict(backend="gpu")),
        ("KVC-C013", dict(pool_out=_readonly_pool())),
    ],
)
def test_rejects_bad_arguments(code, changes):
    kwargs = _kwargs(**changes)
    with raises_code(code) as excinfo:
        scatter_req_token_ids(**kwargs)
    if code == "KVC-C002":
        assert isinstance(excinfo.value, TypeError)  # dtype errors are TypeErrors, as SGLang's
    pool = kwargs["pool_out"]
    if isinstance(pool, np.ndarray):
        assert not pool.any()


def test_cuda_arrays_dispatch_to_launch_glue(monkeypatch):
    calls = fake_launch_module(monkeypatch, "scatter", "scatter_req_token_ids")
    kwargs = {k: FakeCudaArray(v) if isinstance(v, np.ndarray) else v for k, v in _kwargs(backend="auto").items()}
    scatter_req_token_ids(**kwargs)
    assert calls == [("scatter_req_token_ids", {**{k: v for k, v in kwargs.items() if k != "backend"}, "stream": 0})]
    with raises_code("KVC-C008"):
        scatter_req_token_ids(**{**kwargs, "backend": "numpy"})
