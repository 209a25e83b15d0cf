"""Small assertion helpers shared by the tests."""

from __future__ import annotations

import contextlib

import pytest

from kvcanary_numba.errors import KvCanaryError


@contextlib.contextmanager
def raises_code(code: str):
    """Assert that the block raises KvCanaryError with catalogue code ``code``."""
    with pytest.raises(KvCanaryError) as excinfo:
        yield excinfo
    assert excinfo.value.code == code, f"expected {code}, got {excinfo.value.code}: {excinfo.value}"
    assert str(excinfo.value).endswith(excinfo.value.entry.url)
