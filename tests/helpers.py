"""Small assertion helpers shared by the tests."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from kvcanary_numba.errors import KvCanaryError


@contextlib.contextmanager
def raises_code(code: str):
    """Assert that the block raises KvCanaryError with catalogue code ``code``."""
    with pytest.raises(KvCanaryError) as excinfo:
        yield excinfo
    assert excinfo.value.code == code, f"expected {code}, got {excinfo.value.code}: {excinfo.value}"
    assert str(excinfo.value).endswith(excinfo.value.entry.url)


#: Columns of the "linear" req_to_token of the plan tests.
PLAN_WIDTH = 16


def linear_rtt(rows: int = 9, width: int = PLAN_WIDTH) -> np.ndarray:
    """req_to_token (int32 [rows, width]) with entry [rp, pos] = rp * width + pos."""
    return (np.arange(rows)[:, None] * width + np.arange(width)[None, :]).astype(np.int32)


def i64(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)
