"""SGLang's golden vectors replayed through the specification (``kvcanary_numba.reference``).

The specification functions take the public launches' keyword arguments minus
``backend`` and do no validation; the vectors are well-formed, so :class:`Ops`
calls them directly. The replay compares ring rows as multisets
(``tests/vectors.py``); ``tests/test_spec_against_cpu.py`` compares them in
order with the CPU path.
"""

from __future__ import annotations

import numpy as np
import pytest
from vectors import Ops, replay, scenario_paths, vectors_folder

from kvcanary_numba.reference import plan, verify, write

SCENARIOS = [path.name for path in scenario_paths(vectors_folder())]

SPEC = Ops(
    name="spec",
    plan=plan.launch_canary_plan_kernels,
    verify=verify.launch_canary_verify_kernel,
    write=write.launch_canary_write_kernel,
)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_spec_replays_golden_vector(vectors_dir, scenario):
    assert replay(vectors_dir / scenario, SPEC) >= 1


def _verify_without_token_check(**kwargs):
    kwargs["check_verify_expected_token"] = False
    verify.launch_canary_verify_kernel(**kwargs)


def _write_without_chain_assert(*, context, **kwargs):
    write.launch_canary_write_kernel(
        context=context.replace(enable_chain_position_assert=np.zeros(1, np.int32)), **kwargs
    )


def _plan_without_window(**kwargs):
    kwargs["swa_window_size"] = 0
    plan.launch_canary_plan_kernels(**kwargs)


@pytest.mark.parametrize(
    "broken",
    [
        Ops(name="no-token-check", plan=SPEC.plan, verify=_verify_without_token_check, write=SPEC.write),
        Ops(name="no-chain-assert", plan=SPEC.plan, verify=SPEC.verify, write=_write_without_chain_assert),
        Ops(name="no-window", plan=_plan_without_window, verify=SPEC.verify, write=SPEC.write),
    ],
    ids=lambda ops: ops.name,
)
def test_golden_vectors_catch_a_weakened_spec(vectors_dir, broken):
    """Some scenario fails when the specification drops one rule: the replay is not vacuous for it."""
    failures = 0
    for path in scenario_paths(vectors_dir):
        try:
            replay(path, broken)
        except AssertionError:
            failures += 1
    assert failures > 0, f"{broken.name}: every golden vector still passes"
