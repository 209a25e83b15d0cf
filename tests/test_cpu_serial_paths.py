"""The optimised CPU path's one-thread loops (small inputs) against their parallel twins (large inputs), on the same data."""

from __future__ import annotations

import numpy as np
import pytest

from kvcanary_numba.constants import CANARY_CHAIN_HEAD, OUT_OF_RANGE_SLOT
from kvcanary_numba.fast.cpu import fingerprint as ref_fp, verify as ref_verify


@pytest.mark.parametrize("seed", range(3))
def test_serial_and_parallel_entry_checks_agree(seed):
    rng = np.random.default_rng(seed)
    num_slots, n = 97, 2 * ref_verify._CHUNK + 301  # several chunks
    records = rng.integers(-3, 50, size=(num_slots, 6), dtype=np.int64)  # wider than 4 fields, as a stride-48 buffer
    records[rng.random(num_slots) < 0.3, 2] = np.uint64(CANARY_CHAIN_HEAD).view(np.int64)
    pick = lambda lo, hi: rng.integers(lo, hi, size=n, dtype=np.int64)  # noqa: E731
    slots = pick(-2, num_slots + 3)
    slots[rng.random(n) < 0.05] = OUT_OF_RANGE_SLOT
    prevs = pick(-2, num_slots + 3)
    positions, tokens, real = pick(-3, 50), pick(-2, 50), pick(-3, 50)
    for check in (False, True):
        out = []
        for run in (ref_verify._check_entries, ref_verify._check_entries_serial):
            bits, aux = np.full(n, -9, np.int64), np.full(n, -9, np.int64)
            run(records, slots, positions, prevs, tokens, check, real, bits, aux)
            out.append((bits, np.where(bits != 0, aux, 0)))  # aux is only defined where a bit is set
        assert (out[0][0] != 0).any() and (out[0][0] == 0).any()
        np.testing.assert_array_equal(out[0][0], out[1][0])
        np.testing.assert_array_equal(out[0][1], out[1][1])


@pytest.mark.parametrize("page_size, words_per_token, count", [(1, 4, 2), (4, 2, 2), (3, 6, 5)])
def test_serial_and_parallel_folds_agree(page_size, words_per_token, count):
    rng = np.random.default_rng(page_size)
    rows, row_words = 40, page_size * words_per_token + 3
    words = rng.integers(0, 2**63, size=rows * row_words, dtype=np.uint64)
    limit = rows * page_size
    slots = rng.integers(-3, limit + 5, size=ref_fp.SERIAL_FOLD_SLOTS + 123, dtype=np.int64)
    out = []
    for run in (ref_fp._fold_source_into, ref_fp._fold_source_serial):
        acc = np.full(slots.shape[0], 7, dtype=np.uint64)
        run(words, slots, limit, row_words, page_size, words_per_token, count, acc)
        out.append(acc)
    assert (out[0] != 7).any()
    np.testing.assert_array_equal(out[0], out[1])
