"""Host µs per public call with each array library, beside the prepared path of the same step.

``public`` (GPU): one decode step's plan, verify and write through the validated public
functions with the same device memory seen as CuPy arrays, Numba device arrays, PyTorch
tensors (when installed) and DLPack-only wrappers of CuPy arrays; the prepared launches of
that step (what the monitor's fast path runs) in the same run. ``public-cpu``: the NumPy
public calls with 1 entry, and the optimised CPU path they run (``kvcanary_numba.fast.cpu``)
called alone: what validation and the memo add is the difference.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from kvcanary_numba import (
    RealKvHashMode,
    launch_canary_plan_kernels,
    launch_canary_verify_kernel,
    launch_canary_write_kernel,
    launch_plan_offsets_kernel,
)

from .timing import host_times
from .workloads import plan_case, verify_case

__all__ = ["public_calls", "public_cpu"]

#: (bs, prefix) of the GPU step (small: host time is what is measured).
SIZES = {"quick": (16, 64), "full": (64, 256)}


class DlpackOnly:
    """An array offering only DLPack (no ``__cuda_array_interface__``)."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def _converters() -> dict:
    """library -> function viewing a CuPy array in that library (same memory, no copy)."""
    from numba import cuda

    out = {"cupy": lambda a: a, "numba": cuda.as_cuda_array, "dlpack": DlpackOnly}
    try:
        import torch

        out["torch"] = torch.from_dlpack
    except ImportError:
        pass
    return out


def _viewed(value, convert):
    import cupy

    if isinstance(value, cupy.ndarray):
        return convert(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(
            value, **{f.name: _viewed(getattr(value, f.name), convert) for f in dataclasses.fields(value)}
        )
    if isinstance(value, tuple):
        return tuple(_viewed(v, convert) for v in value)
    return value


def _step(xp, bs: int, prefix: int) -> tuple[dict, dict, dict]:
    """Keyword arguments of the step's plan, verify and write calls (clean chains)."""
    ctx, _, meta = verify_case(xp, entries=bs * (prefix + 1), mode=RealKvHashMode.PARTIAL, chain_len=prefix + 1)
    plan = plan_case(xp, bs=bs, prefix=prefix, slots=meta["slots"])
    column = lambda a: xp.asarray(np.ascontiguousarray(a[:, prefix]))  # noqa: E731
    write = dict(
        context=ctx,
        plan=plan["write_plan_out"],
        input_ids=column(meta["tokens"]),
        positions=xp.full(bs, prefix, dtype=np.int64),
        out_cache_loc=column(meta["slots"]),
        enable_write_input_assert=False,
        expected_input_tokens=None,
        expected_input_positions=None,
    )
    verify = dict(context=ctx, plan=plan["verify_plan_out"], check_verify_expected_token=False)
    return plan, verify, write


def _calls(plan: dict, verify: dict, write: dict) -> dict:
    return {
        "plan": lambda _: launch_canary_plan_kernels(**plan),
        "verify": lambda _: launch_canary_verify_kernel(**verify),
        "write": lambda _: launch_canary_write_kernel(**write),
        "plan+verify+write": lambda _: (
            launch_canary_plan_kernels(**plan),
            launch_canary_verify_kernel(**verify),
            launch_canary_write_kernel(**write),
        ),
    }


def _core_calls(plan: dict, verify: dict, write: dict) -> dict:
    """The same calls through the core operation modules (``kvcanary_numba.<op>``), not the facade."""
    from kvcanary_numba import plan as core_plan, verify as core_verify, write as core_write

    return {
        "plan": lambda _: core_plan.launch_canary_plan_kernels(**plan),
        "verify": lambda _: core_verify.launch_canary_verify_kernel(**verify),
        "write": lambda _: core_write.launch_canary_write_kernel(**write),
    }


def _offsets_kwargs(plan: dict) -> dict:
    """Keyword arguments of ``launch_plan_offsets_kernel`` on the plan case's inputs and plans."""
    vplan, wplan = plan["verify_plan_out"], plan["write_plan_out"]
    bs = plan["req_pool_indices"].shape[0]
    return dict(
        req_pool_indices=plan["req_pool_indices"],
        prefix_lens=plan["prefix_lens"],
        extend_seq_lens=plan["extend_seq_lens"],
        req_to_token=plan["req_to_token"],
        full_to_swa_index_mapping=None,
        out_verify_offsets_scratch=np.zeros(bs + 1, np.int64),
        out_write_offsets=wplan.write_offsets,
        out_write_seed_slot_indices=wplan.write_seed_slot_indices,
        out_verify_num_valid=vplan.verify_num_valid,
        out_verify_enable=vplan.enable,
        out_write_num_valid_reqs=wplan.write_num_valid_reqs,
        swa_window_size=0,
        verify_capacity=plan["verify_capacity"],
    )


def public_calls(run) -> None:
    """Host µs of each public call per array library, and of the prepared step, in one run."""
    import cupy

    from kvcanary_numba.fast.prepared import PreparedLaunch
    from kvcanary_numba.fast.recording import recording

    from .timing import synchronize

    bs, prefix = SIZES[run.mode]
    plan, verify, write = _step(cupy, bs, prefix)
    for library, convert in _converters().items():
        args = [{k: _viewed(v, convert) for k, v in kwargs.items()} for kwargs in (plan, verify, write)]
        for call, fn in _calls(*args).items():
            if not run.deadline.allows(10):
                run.skip("public", f"{library} {call}")
                continue
            with run.guard("public", f"{library} {call}"):
                result = host_times(fn, iters=run.iters * 5, warmup=5, sync=synchronize)
                run.add({"op": "public call host", "variant": f"{library} {call}", "bs": bs, **result})
    # The core operations called directly (validation every call, numba-cuda's dispatcher launch):
    # what docs/concepts/architecture.md compares with the package's top-level (fast wing) calls.
    for call, fn in _core_calls(plan, verify, write).items():
        with run.guard("public", f"core cupy {call}"):
            result = host_times(fn, iters=run.iters * 5, warmup=5, sync=synchronize)
            run.add({"op": "public call host", "variant": f"core cupy {call}", "bs": bs, **result})
    fresh = {**write}

    def new_inputs(_):  # an engine's per-step arrays: new objects every step (the pool may reuse memory)
        for name in ("input_ids", "positions", "out_cache_loc"):
            fresh[name] = write[name].copy()

    step = _calls(plan, verify, fresh)["plan+verify+write"]
    run.add(
        {
            "op": "public call host",
            "variant": "cupy plan+verify+write, new input arrays",
            "bs": bs,
            **host_times(step, iters=run.iters * 5, warmup=5, sync=synchronize, after=new_inputs),
        }
    )
    with recording() as rec:
        _calls(plan, verify, write)["plan+verify+write"](0)
    prepared = [PreparedLaunch.from_spec(spec) for spec in rec.launches]
    result = host_times(lambda _: [p.launch() for p in prepared], iters=run.iters * 5, warmup=5, sync=synchronize)
    run.add(
        {
            "op": "public call host",
            "variant": "prepared plan+verify+write",
            "bs": bs,
            "launches": len(prepared),
            **result,
        }
    )


def public_cpu(run) -> None:
    """Host µs of each NumPy public call with 1 entry, and of the CPU path it runs, called alone
    (``kvcanary_numba.fast.cpu``: no validation, no memo; not the plain NumPy specification of
    ``kvcanary_numba.reference``, which the public calls do not run)."""
    from kvcanary_numba.fast.cpu import plan as cpu_plan, verify as cpu_verify, write as cpu_write

    plan, verify, write = _step(np, 1, 1)
    refs = {
        "plan": lambda _: cpu_plan.launch_canary_plan_kernels(**plan),
        "verify": lambda _: cpu_verify.launch_canary_verify_kernel(**verify),
        "write": lambda _: cpu_write.launch_canary_write_kernel(**write),
    }
    offsets = _offsets_kwargs(plan)
    calls = {**_calls(plan, verify, write), "plan offsets": lambda _: launch_plan_offsets_kernel(**offsets)}
    refs["plan offsets"] = lambda _: cpu_plan.launch_plan_offsets_kernel(**offsets)
    n = 200 if run.quick else 2000
    for call, fn in calls.items():
        run.add(
            {
                "op": "public call host (NumPy)",
                "variant": f"public {call}, 1 entry",
                "n": 1,
                **host_times(fn, iters=n, warmup=10),
            }
        )
        if call in refs:
            run.add(
                {
                    "op": "public call host (NumPy)",
                    "variant": f"CPU path {call} alone, 1 entry",
                    "n": 1,
                    **host_times(refs[call], iters=n, warmup=10),
                }
            )
