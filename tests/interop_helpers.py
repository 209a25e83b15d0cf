"""Run the tiny serving loop (:class:`canary_pipeline.Pipeline`) with every public call's arrays
converted to another array library, for the interop tests (CPU: DLPack wrappers; GPU: CuPy,
Numba, PyTorch, JAX, DLPack-only wrappers of CuPy memory)."""

from __future__ import annotations

import dataclasses
import pathlib
import sys
from collections.abc import Callable

import numpy as np
from canary_pipeline import Pipeline, plant_fault

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the benchmarks package, as tests/test_benchmarks.py imports it
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_public import DlpackOnly  # noqa: E402,F401  (one wrapper for tests and benchmarks)
from kvcanary_numba import RealKvHashMode

#: convert(host array, is_input_argument) -> (library array, copy_back or None). ``is_input_argument``
#: is True for the top-level per-step arrays (batch metadata, token arrays), which no call writes.
Convert = Callable[[np.ndarray, bool], tuple[object, Callable[[], None] | None]]


def _converted(value, convert: Convert, backs: list, top: bool):
    if isinstance(value, np.ndarray):
        lib, back = convert(value, top)
        if back is not None:
            backs.append(back)
        return lib
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(
            value,
            **{f.name: _converted(getattr(value, f.name), convert, backs, False) for f in dataclasses.fields(value)},
        )
    if isinstance(value, tuple):
        return tuple(_converted(v, convert, backs, False) for v in value)
    return value


def patch_public_calls(
    monkeypatch,
    convert: Convert,
    *,
    after: Callable[[], None] = lambda: None,
    before: Callable[[], None] | None = None,
    **extra,
) -> None:
    """Make the pipeline's plan / verify / write calls run on converted arrays (``backend="auto"``,
    plus ``extra`` keywords such as ``stream=``), copying written arrays back to the host after each.

    ``before()`` (default ``after``) runs after the conversions, before the call: copies must land
    before a launch on another stream. ``after()`` runs after the call, before the copies back."""
    import canary_helpers

    import kvcanary_numba.plan as plan_module

    for module, name in (
        (canary_helpers, "launch_canary_verify_kernel"),
        (canary_helpers, "launch_canary_write_kernel"),
        (plan_module, "launch_canary_plan_kernels"),
    ):
        original = getattr(module, name)

        def call(_f=original, **kwargs):
            backs: list = []
            kwargs = {n: _converted(v, convert, backs, True) for n, v in kwargs.items()}
            (before or after)()
            _f(**{**kwargs, "backend": "auto", **extra})
            after()
            for back in backs:
                back()

        monkeypatch.setattr(module, name, call)


def run_pipeline(fault: str | None) -> tuple[list, np.ndarray, tuple | None]:
    """Two steps of two requests (a planted fault between them, PARTIAL real-KV mode);
    returns (ring rows of each step, final canary bytes, (slot, bit) the fault must show)."""
    pipe = Pipeline(32, max_reqs=3, max_seq=8, verify_capacity=16, write_capacity=2, mode=RealKvHashMode.PARTIAL)
    pipe.req_to_token[1, :8] = np.arange(1, 9)
    pipe.req_to_token[2, :8] = np.arange(9, 17)
    pipe.tokens[1:3, :8] = np.arange(100, 116).reshape(2, 8)
    rows = [pipe.step([1, 2], [0, 0], [4, 3], check_tokens=True)]
    expected = plant_fault(pipe, fault, 1, 1) if fault else None
    rows.append(pipe.step([1, 2], [4, 3], [2, 2], check_tokens=True))
    return rows, pipe.ctx.canary_buf.copy(), expected


def check_fault_caught(rows: list, expected: tuple | None) -> None:
    """The second step's verify rows hold the planted fault (none at all without one)."""
    if expected is None:
        assert rows == [([], []), ([], [])], rows
        return
    slot, bit = expected
    assert any(row[1] == slot and row[7] & bit for row in rows[1][0]), rows
