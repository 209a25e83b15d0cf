"""Hypothesis property of the shared-memory rule (KVC-C017): any aliasing among a call's arrays is either
accepted with the unaliased result (inputs sharing with inputs only) or rejected with the code and no byte
changed.

Every array of a small valid call of a public launch is carved out of one byte pool
(``tests/alias_calls.py``); hypothesis places each one on its own or over an earlier one, at any
16-byte-aligned offset where it overlaps that one. ``np.shares_memory`` between the views is the oracle of
the decision. Repeated layouts are memo hits, so both the full check and the memo's re-test run.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("hypothesis", reason="hypothesis is not installed (pip install -e '.[dev]')")

from alias_calls import ALIGN, LAYOUTS, assert_same_result, call, carve, nbytes, outputs, place, shares, unaliased
from hypothesis import HealthCheck, event, given, settings, strategies as st

from kvcanary_numba import KvCanaryError

# The first examples compile the kernels' CPU twins and the span helper: no deadline.
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def placements(draw, functions=tuple(LAYOUTS)):
    """(function, byte offsets of its arrays): each array on its own or over an earlier one."""
    function = draw(st.sampled_from(sorted(functions)))
    layout, written = LAYOUTS[function], outputs(function)
    offsets = place(function)
    for i, slot in enumerate(layout):
        # Outputs mostly on their own and inputs often over inputs, so that accepted calls are drawn too.
        roll = draw(st.integers(0, 9))
        inputs = [t for t in layout[:i] if t.name not in written]
        if slot.name in written:
            targets = layout[:i] if roll >= 7 else []
        else:
            targets = inputs if roll < 4 else layout[:i] if roll >= 8 else []
        if not targets:
            continue
        target = draw(st.sampled_from(targets))
        # Any aligned start at which the two overlap (a start clipped to the pool's may leave them apart).
        low, high = (nbytes(slot) - 1) // ALIGN, (nbytes(target) - 1) // ALIGN
        offsets[slot.name] = max(0, offsets[target.name] + ALIGN * draw(st.integers(-low, high)))
    return function, offsets


def _check(function: str, offsets: dict, seed: int, backend: str, compare: bool) -> None:
    pool, arrays = carve(function, offsets, seed)
    rejected = shares(function, arrays)
    event(f"{function} {'rejected' if rejected else 'accepted'}")  # pytest --hypothesis-show-statistics
    want = None if rejected or not compare else unaliased(function, arrays, backend)
    before = pool.copy()
    try:
        call(function, arrays, backend)()
    except KvCanaryError as exc:
        assert rejected and exc.code == "KVC-C017", f"{exc.code}: {exc}"
        np.testing.assert_array_equal(pool, before, err_msg="a rejected call changed a byte")
        return
    assert not rejected, "an output sharing memory was accepted"
    if want is not None:
        assert_same_result(arrays, want, backend)


@settings(max_examples=300, **SETTINGS)
@given(placed=placements(), seed=st.integers(0, 2**16))
def test_random_aliasing_is_the_unaliased_result_or_rejected_unchanged(placed, seed):
    _check(*placed, seed, "numpy", compare=True)


@pytest.mark.simulator
@settings(max_examples=25, **SETTINGS)
@given(placed=placements(), seed=st.integers(0, 2**16))
def test_random_aliasing_on_the_kernels_is_decided_as_on_numpy(placed, seed):
    # Results are compared on NumPy above: values an overlapping input leaves in another may make two
    # requests store one slot, a race on the kernels by design. Here: the same decision, nothing written.
    _check(*placed, seed, "cuda", compare=False)
