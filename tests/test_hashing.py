"""Known-answer values of the chain hash (SGLang's tests, docs/concepts/sglang.md), scalar and vectorised."""

from __future__ import annotations

import numpy as np
import pytest

from kvcanary_numba import constants
from kvcanary_numba.hashing import (
    chain_head,
    splitmix64,
    splitmix64_array,
    splitmix64_mix3,
    splitmix64_mix3_array,
    to_signed,
    to_unsigned,
)

PINNED = [
    (0x9E3779B97F4A7C15, 0xE220A8397B1DCDAF),
    (1, 0x5692161D100B05E5),
    (0xDEADBEEFCAFEBABE, 0x7AD6664F09FFE52C),
    (0xFFFFFFFFFFFFFFFF, 0xB4D055FCF2CBBD7B),
    (0x8000000000000000, 0x25C26EA579CEA98A),
    (0xC0FFEE1234567890, 0xDE7FAE23A9A1B716),
    (0, 0),
]


@pytest.mark.parametrize(("x", "want"), PINNED)
def test_splitmix64_known_answers(x, want):
    assert splitmix64(x) == want
    assert splitmix64_array(np.array([x], dtype=np.uint64))[0] == want


def test_chain_head_is_pinned_constant():
    assert chain_head() == constants.CANARY_CHAIN_HEAD == 0xDE7FAE23A9A1B716
    assert to_signed(chain_head()) == -2414019407054260458


def test_negative_inputs_hash_as_their_bits():
    assert splitmix64(-1) == splitmix64(0xFFFFFFFFFFFFFFFF)
    assert splitmix64_array(np.array([-1], dtype=np.int64))[0] == 0xB4D055FCF2CBBD7B


def test_mix3_is_three_step_fold():
    for a, b, c in [(chain_head(), 101, 0), (0, 0, 0), (2**64 - 1, -1, 2**31 - 1), (12345, 7, 99)]:
        explicit = splitmix64(splitmix64(splitmix64(a) ^ to_unsigned(b)) ^ to_unsigned(c))
        assert splitmix64_mix3(a, b, c) == explicit


def test_two_step_chain_known_answer():
    # Writing 101@pos0 then 202@pos1 from the anchor stores these prev hashes.
    first = chain_head()
    second = splitmix64_mix3(first, 101, 0)
    assert (first, second) == (0xDE7FAE23A9A1B716, 0x542FE5061275A6AB)


def test_vectorised_matches_scalar(rng):
    a = rng.integers(-(2**63), 2**63 - 1, size=200, dtype=np.int64)
    b = rng.integers(-(2**63), 2**63 - 1, size=200, dtype=np.int64)
    c = rng.integers(-(2**63), 2**63 - 1, size=200, dtype=np.int64)
    got = splitmix64_mix3_array(a, b, c)
    want = [splitmix64_mix3(int(x), int(y), int(z)) for x, y, z in zip(a, b, c)]
    assert got.tolist() == want
    assert got.dtype == np.uint64


def test_thousand_inputs_thousand_distinct_outputs(rng):
    x = rng.integers(0, 2**63 - 1, size=1000, dtype=np.int64)
    x = np.unique(x)
    assert len(np.unique(splitmix64_array(x))) == len(x)


def test_signed_unsigned_round_trip():
    for v in (0, 1, -1, 2**63 - 1, -(2**63)):
        assert to_signed(to_unsigned(v)) == v
