"""Replay of SGLang's golden vectors (``tests/data/vectors``, or ``$KVCANARY_VECTORS``) through any backend.

A backend is described by :class:`Ops`: three callables taking exactly the
keyword arguments of the public ``launch_canary_plan_kernels``,
``launch_canary_verify_kernel`` and ``launch_canary_write_kernel``, plus array
transfer functions. :func:`replay` runs every step of a scenario
(plan -> verify -> write on one persistent ring and counter set) and asserts
each output equals SGLang's bit for bit. Ring rows compare as multisets; when a
launch overflows the ring part-way (which rows land is then a race on a GPU),
the new rows must be a sub-multiset of the rows ``oracle`` (a sequential
backend run with an unbounded ring) produces for that launch.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvcanary_numba import CanaryContext, CanaryLaunchTag, RealKvHashMode, RealKvSource, VerifyPlan, WritePlan

#: The vectors committed with the tests (a copy of SGLang's generator output, with its README).
IN_REPO = pathlib.Path(__file__).resolve().parent / "data" / "vectors"
#: Environment variable naming another folder of scenarios in the same format.
ENV = "KVCANARY_VECTORS"

#: Value SGLang's generator pre-filled fresh plans with; overflowed steps leave it in place.
PLAN_FILL = -7777


@dataclass
class Ops:
    name: str
    plan: Callable[..., None]
    verify: Callable[..., None]
    write: Callable[..., None]
    device: str = "cpu"
    to_device: Callable[[np.ndarray], Any] = np.array
    to_host: Callable[[Any], np.ndarray] = np.asarray
    #: True when ring rows land in a deterministic order even on overflow.
    sequential: bool = True


def vectors_folder() -> pathlib.Path:
    """The one folder every vector test reads: ``$KVCANARY_VECTORS`` if set, else :data:`IN_REPO`."""
    value = os.environ.get(ENV)
    return pathlib.Path(value).resolve() if value else IN_REPO


def scenario_paths(folder: pathlib.Path) -> list[pathlib.Path]:
    return sorted(folder.glob("scenario_*.npz"))


def _rows(ring: np.ndarray, count: int) -> Counter:
    return Counter(tuple(int(v) for v in row) for row in ring[:count])


def _fresh_plans(meta: dict, ops: Ops) -> tuple[VerifyPlan, WritePlan]:
    vplan = VerifyPlan.allocate(verify_capacity=meta["verify_cap"], device=ops.device)
    wplan = WritePlan.allocate(write_req_capacity=meta["write_cap"], device=ops.device)
    for arr in (*vplan.arrays().values(), *wplan.arrays().values()):
        arr[...] = PLAN_FILL
    return vplan, wplan


def _sources(data, prefix: str, meta: dict, ops: Ops) -> tuple[RealKvSource, ...]:
    return tuple(
        RealKvSource(tensor=ops.to_device(data[f"{prefix}source{i}"]), page_size=p, num_bytes_per_token=n, read_bytes=r)
        for i, (p, n, r) in enumerate(meta["sources"])
    )


def _check_ring(
    ops, oracle, label, ring_before, widx_before, ring_after, widx_after, want_ring, want_widx, launch_rows
):
    cap = ring_after.shape[0]
    assert widx_after == want_widx, f"{label}: write index {widx_after} != {want_widx}"
    stored = min(widx_after, cap)
    assert not ring_after[stored:].any(), f"{label}: ring rows past the write index are not zero"
    if widx_before >= cap:
        # Full before the launch: nothing may land, whichever rows an earlier racy overflow kept.
        np.testing.assert_array_equal(ring_after, ring_before, err_msg=f"{label}: a full ring changed")
        if not ops.sequential:
            return
    overflowed_mid_launch = widx_before < cap < widx_after
    if ops.sequential or not overflowed_mid_launch:
        assert _rows(ring_after, stored) == _rows(want_ring, stored), f"{label}: ring rows differ"
        return
    kept = min(widx_before, cap)
    np.testing.assert_array_equal(ring_after[:kept], ring_before[:kept], err_msg=f"{label}: old rows changed")
    new_rows = _rows(ring_after[kept:], stored - kept)
    possible = launch_rows()
    assert not (new_rows - possible), f"{label}: rows not produced by the oracle: {new_rows - possible}"


def replay(path: pathlib.Path, ops: Ops, oracle: Ops | None = None) -> int:
    """Replay one scenario file; returns the number of steps checked."""
    data = np.load(path)
    meta = json.loads(str(data["meta"]))
    ctx = CanaryContext.allocate(
        num_slots=meta["canary_slots"],
        slot_stride_bytes=meta["stride"],
        ring_capacity=meta["ring_cap"],
        kernel_kind=CanaryLaunchTag(meta["tag"]),
        real_kv_hash_mode=RealKvHashMode(meta["mode"]),
        device=ops.device,
    )
    ctx.enable_chain_position_assert[...] = int(meta["chain_assert"])
    lut = ops.to_device(data["lut"]) if meta["swa"] else None
    steps = int(data["steps"])
    for step in range(steps):
        p = f"s{step}_"
        label = f"{path.name} step {step} ({ops.name}, fault={data[p + 'fault']})"
        ctx.canary_buf[...] = ops.to_device(data[p + "buf_before"])
        step_ctx = ctx.replace(real_kv_sources=_sources(data, p, meta, ops))
        vplan, wplan = _fresh_plans(meta, ops)
        bs = data[p + "rpi"].shape[0]
        plan_kwargs = dict(
            req_pool_indices=ops.to_device(data[p + "rpi"]),
            prefix_lens=ops.to_device(data[p + "prefix"]),
            extend_seq_lens=ops.to_device(data[p + "ext"]),
            req_to_token=ops.to_device(data[p + "req_to_token"]),
            swa_window_size=int(meta["W"]),
            full_to_swa_index_mapping=lut,
            verify_capacity=int(meta["verify_cap"]),
            req_to_verify_expected_tokens=ops.to_device(data[p + "pool"]) if meta["check_tok"] else None,
            req_to_verify_expected_tokens_valid_lens=ops.to_device(data[p + "valid_lens"])
            if meta["check_tok"]
            else None,
            kv_token_id_vs_position_offset=int(meta["offset"]),
        )
        ops.plan(verify_plan_out=vplan, write_plan_out=wplan, **plan_kwargs)
        num_valid = int(data[p + "verify_num_valid"])
        assert int(ops.to_host(vplan.verify_num_valid)[0]) == num_valid, label
        assert int(ops.to_host(vplan.enable)[0]) == int(data[p + "enable"]), label
        for ours, theirs in [
            (vplan.verify_slot_indices, "v_slots"),
            (vplan.verify_expected_tokens, "v_tokens"),
            (vplan.verify_expected_positions, "v_positions"),
            (vplan.verify_prev_slot_indices, "v_prev"),
        ]:
            np.testing.assert_array_equal(ops.to_host(ours)[:num_valid], data[p + theirs], err_msg=f"{label}: {theirs}")
        np.testing.assert_array_equal(ops.to_host(wplan.write_offsets)[: bs + 1], data[p + "w_offsets"], err_msg=label)
        np.testing.assert_array_equal(
            ops.to_host(wplan.write_seed_slot_indices)[:bs], data[p + "w_seeds"], err_msg=label
        )
        assert int(ops.to_host(wplan.write_num_valid_reqs)[0]) == int(data[p + "w_num_valid"]), label

        for stage, launch, kwargs in [
            ("after_verify", ops.verify, dict(plan=vplan, check_verify_expected_token=bool(meta["check_tok"]))),
            (
                "after",
                ops.write,
                dict(
                    plan=wplan,
                    input_ids=ops.to_device(data[p + "input_ids"]),
                    positions=ops.to_device(data[p + "positions"]),
                    out_cache_loc=ops.to_device(data[p + "out_cache_loc"]),
                    enable_write_input_assert=bool(meta["write_assert"]),
                    expected_input_tokens=ops.to_device(data[p + "exp_tokens"]) if meta["write_assert"] else None,
                    expected_input_positions=ops.to_device(data[p + "exp_positions"]) if meta["write_assert"] else None,
                ),
            ),
        ]:
            ring_before = ops.to_host(ctx.violation_ring).copy()
            widx_before = int(ops.to_host(ctx.violation_write_index)[0])
            buf_before = ops.to_host(ctx.canary_buf).copy()
            launch(context=step_ctx, **kwargs)

            def launch_rows(launch_name=stage, kwargs=kwargs, buf=buf_before):
                assert oracle is not None, "a non-sequential backend needs an oracle"
                return _oracle_rows(oracle, launch_name, step_ctx, ops, buf, kwargs)

            _check_ring(
                ops,
                oracle,
                f"{label} {stage}",
                ring_before,
                widx_before,
                ops.to_host(ctx.violation_ring),
                int(ops.to_host(ctx.violation_write_index)[0]),
                data[p + f"ring_{stage}"],
                int(data[p + f"widx_{stage}"]),
                launch_rows,
            )
            assert int(ops.to_host(ctx.slot_run_counter)[0]) == int(data[p + f"slot_ctr_{stage}"]), f"{label} {stage}"
            assert int(ops.to_host(ctx.kernel_run_counter)[0]) == int(data[p + f"krc_{stage}"]), f"{label} {stage}"
            if stage == "after_verify":
                np.testing.assert_array_equal(ops.to_host(ctx.canary_buf), buf_before, err_msg=f"{label}: verify wrote")
        np.testing.assert_array_equal(ops.to_host(ctx.canary_buf), data[p + "buf_after"], err_msg=f"{label}: buffer")
    return steps


def _oracle_rows(oracle: Ops, stage: str, ctx: CanaryContext, ops: Ops, buf: np.ndarray, kwargs: dict) -> Counter:
    """All rows one launch records, from a sequential backend with an unbounded ring."""

    def host(value):
        if value is None or isinstance(value, (bool, int)):
            return value
        if isinstance(value, (VerifyPlan, WritePlan)):
            return type(value)(**{k: ops.to_host(v).copy() for k, v in value.arrays().items()})
        return ops.to_host(value).copy()

    big = 1 << 16
    octx = CanaryContext.allocate(
        num_slots=buf.shape[0],
        slot_stride_bytes=buf.shape[1],
        ring_capacity=big,
        kernel_kind=ctx.kernel_kind,
        real_kv_hash_mode=ctx.real_kv_hash_mode,
    ).replace(
        real_kv_sources=tuple(
            RealKvSource(
                tensor=host(s.tensor),
                page_size=s.page_size,
                num_bytes_per_token=s.num_bytes_per_token,
                read_bytes=s.read_bytes,
            )
            for s in ctx.real_kv_sources
        )
    )
    octx.canary_buf[...] = buf
    octx.enable_chain_position_assert[...] = ops.to_host(ctx.enable_chain_position_assert)
    launch = oracle.verify if stage == "after_verify" else oracle.write
    launch(context=octx, **{k: host(v) for k, v in kwargs.items()})
    return _rows(octx.violation_ring, min(int(octx.violation_write_index[0]), big))
