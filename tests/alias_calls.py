"""Calls of every public launch whose arrays are carved out of one byte pool, so any two can share memory.

Used by ``tests/test_reliability_alias.py`` (named aliasings) and ``tests/test_properties_alias.py``
(random ones). A *placement* maps an array's name to its byte offset in the pool; :func:`place` builds
one from "put ``name`` at ``target``'s offset plus ``delta``" rules. Every offset is a multiple of 16
(the real-KV sources' alignment), so every layout passes validation and only the sharing differs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np
from kernel_pairs import KERNEL_DEVICE

from kvcanary_numba import (
    CanaryContext,
    CanaryLaunchTag,
    RealKvHashMode,
    RealKvSource,
    VerifyPlan,
    WritePlan,
    compute_real_kv_hash,
    launch_canary_plan_kernels,
    launch_canary_verify_kernel,
    launch_canary_write_kernel,
    launch_plan_offsets_kernel,
    scatter_req_token_ids,
)

ALIGN = 16
SLOTS, ROWS, WIDTH, BS, CAP = 8, 3, 8, 2, 4


class Slot(NamedTuple):
    """One array of a call: its name, dtype, shape, whether the call writes it, and its valid values."""

    name: str
    dtype: type
    shape: tuple[int, ...]
    output: bool
    fill: Callable[[np.random.Generator, tuple], np.ndarray]


def _ints(low, high):
    return lambda rng, shape: rng.integers(low, high, size=shape)


def _const(value):
    return lambda rng, shape: np.full(shape, value)


def _distinct(low, high):
    # Kernels run requests concurrently: two storing one slot (or one pool row) is a race, as in SGLang.
    return lambda rng, shape: rng.permutation(np.arange(low, high))[: shape[0]]


def _sorted_ranges(total):
    return lambda rng, shape: np.sort(rng.integers(0, total + 1, size=shape)) * (np.arange(shape[0]) > 0)


_BATCH = [
    Slot("req_pool_indices", np.int64, (BS,), False, _ints(0, ROWS)),
    Slot("prefix_lens", np.int64, (BS,), False, _ints(0, 7)),
    Slot("extend_seq_lens", np.int64, (BS,), False, _ints(0, 3)),
    Slot("req_to_token", np.int32, (ROWS, WIDTH), False, _ints(0, SLOTS)),
]
_CONTEXT = [
    Slot("canary_buf", np.uint8, (SLOTS, 32), None, _ints(0, 256)),  # output of write only
    Slot("violation_ring", np.int64, (8, 8), True, _const(0)),
    Slot("violation_write_index", np.int32, (1,), True, _const(0)),
    Slot("slot_run_counter", np.int64, (1,), True, _const(0)),
    Slot("kernel_run_counter", np.int64, (1,), True, _const(0)),
    Slot("kv", np.uint8, (SLOTS, 32), False, _ints(0, 256)),
]

#: function -> the arrays of one small valid call, in argument order.
LAYOUTS: dict[str, list[Slot]] = {
    "scatter_req_token_ids": [
        Slot("flat_in", np.int64, (6,), False, _ints(0, 100)),
        Slot("offsets", np.int64, (BS + 1,), False, _sorted_ranges(6)),
        Slot("req_pool_indices", np.int64, (BS,), False, _distinct(0, ROWS)),
        Slot("pool_out", np.int32, (ROWS, WIDTH), True, _const(-1)),
    ],
    "compute_real_kv_hash": [
        Slot("kv", np.uint8, (SLOTS, 32), False, _ints(0, 256)),
        Slot("slot_indices", np.int64, (4,), False, _ints(-1, SLOTS + 1)),
        Slot("out", np.int64, (4,), True, _const(-7)),
    ],
    "launch_plan_offsets_kernel": _BATCH
    + [
        Slot(f"out_{name}", dtype, shape, True, _const(-7))
        for name, dtype, shape in (
            ("verify_offsets_scratch", np.int64, (BS + 1,)),
            ("write_offsets", np.int64, (BS + 1,)),
            ("write_seed_slot_indices", np.int64, (BS,)),
            ("verify_num_valid", np.int32, (1,)),
            ("verify_enable", np.int32, (1,)),
            ("write_num_valid_reqs", np.int32, (1,)),
        )
    ],
    "launch_canary_plan_kernels": _BATCH
    + [
        Slot("pool", np.int32, (ROWS, WIDTH), False, _ints(0, 50)),
        Slot("lens", np.int64, (BS,), False, _ints(0, WIDTH + 1)),
        *[
            Slot(name, np.int64, (CAP,), True, _const(-7))
            for name in (
                "verify_slot_indices",
                "verify_expected_tokens",
                "verify_expected_positions",
                "verify_prev_slot_indices",
            )
        ],
        Slot("verify_num_valid", np.int32, (1,), True, _const(-7)),
        Slot("enable", np.int32, (1,), True, _const(-7)),
        Slot("write_offsets", np.int64, (BS + 1,), True, _const(-7)),
        Slot("write_seed_slot_indices", np.int64, (BS,), True, _const(-7)),
        Slot("write_num_valid_reqs", np.int32, (1,), True, _const(-7)),
    ],
    "launch_canary_verify_kernel": _CONTEXT
    + [
        Slot("verify_slot_indices", np.int64, (CAP,), False, _ints(0, SLOTS)),
        Slot("verify_expected_tokens", np.int64, (CAP,), False, _ints(-1, 3)),
        Slot("verify_expected_positions", np.int64, (CAP,), False, _ints(0, 4)),
        Slot("verify_prev_slot_indices", np.int64, (CAP,), False, _ints(-1, SLOTS)),
        Slot("verify_num_valid", np.int32, (1,), False, _ints(0, CAP + 1)),
        Slot("enable", np.int32, (1,), False, _const(1)),
    ],
    "launch_canary_write_kernel": _CONTEXT
    + [
        Slot("enable_chain_position_assert", np.int32, (1,), False, _ints(0, 2)),
        Slot("write_offsets", np.int64, (BS + 1,), False, _sorted_ranges(3)),
        Slot("write_seed_slot_indices", np.int64, (BS,), False, _ints(-1, SLOTS // 2)),
        Slot("write_num_valid_reqs", np.int32, (1,), False, _const(BS)),
        Slot("input_ids", np.int64, (3,), False, _ints(0, 100)),
        Slot("positions", np.int64, (3,), False, _ints(0, 6)),
        Slot("out_cache_loc", np.int64, (3,), False, _distinct(SLOTS // 2, SLOTS)),
    ],
}


#: Names of the pool that are not the name of their argument (messages use the argument's).
ARGUMENT = {
    "pool": "req_to_verify_expected_tokens",
    "lens": "req_to_verify_expected_tokens_valid_lens",
    "kv": "real_kv_sources[0].tensor",
}


def outputs(function: str) -> set[str]:
    """Names of the arrays ``function`` writes."""
    writes_buffer = function == "launch_canary_write_kernel"
    return {s.name for s in LAYOUTS[function] if s.output or (s.output is None and writes_buffer)}


def nbytes(slot: Slot) -> int:
    return int(np.prod(slot.shape)) * np.dtype(slot.dtype).itemsize


def place(function: str, rules: dict[str, tuple[str, int]] | None = None) -> dict[str, int]:
    """Byte offsets: each array on its own (``ALIGN``-aligned, in order), except ``rules``:
    name -> (target, delta), ``name`` at ``target``'s offset + ``delta`` bytes."""
    offsets, cursor = {}, 0
    for slot in LAYOUTS[function]:
        offsets[slot.name] = cursor
        cursor += -(-nbytes(slot) // ALIGN) * ALIGN
    for name, (target, delta) in (rules or {}).items():
        offsets[name] = offsets[target] + delta
    return offsets


def carve(function: str, offsets: dict[str, int], seed: int = 0) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The pool and every array of the call as a view of it at its offset, filled in argument order
    (an array overlapping an earlier one overwrites some of its values: any values are valid)."""
    layout = LAYOUTS[function]
    size = max(offsets[s.name] + nbytes(s) for s in layout)
    raw = np.zeros(size + 2 * ALIGN, np.uint8)
    start = -raw.__array_interface__["data"][0] % ALIGN
    pool = raw[start : start + size + ALIGN]
    rng, arrays = np.random.default_rng(seed), {}
    for slot in layout:
        at = offsets[slot.name]
        array = pool[at : at + nbytes(slot)].view(slot.dtype).reshape(slot.shape)
        array[...] = slot.fill(rng, slot.shape)
        arrays[slot.name] = array
    return pool, arrays


def shares(function: str, arrays: dict[str, np.ndarray]) -> bool:
    """The rule's oracle: does an output share memory with any other array of the call?"""
    written = outputs(function)
    names = list(arrays)
    return any(
        (a in written or b in written) and np.shares_memory(arrays[a], arrays[b])
        for i, a in enumerate(names)
        for b in names[i + 1 :]
    )


def _context(a: dict) -> CanaryContext:
    source = RealKvSource(tensor=a["kv"], page_size=1, num_bytes_per_token=32, read_bytes=32)
    return CanaryContext(
        canary_buf=a["canary_buf"],
        kernel_kind=CanaryLaunchTag.TAIL_K_FULL,
        violation_ring=a["violation_ring"],
        violation_write_index=a["violation_write_index"],
        slot_run_counter=a["slot_run_counter"],
        kernel_run_counter=a["kernel_run_counter"],
        real_kv_sources=(source,),
        real_kv_hash_mode=RealKvHashMode.PARTIAL,
        enable_chain_position_assert=a.get("enable_chain_position_assert"),
    )


def _pick(a: dict, cls: type):
    return cls(**{name: a[name] for name in cls.__dataclass_fields__})


def call(function: str, a: dict[str, np.ndarray], backend: str) -> Callable[[], None]:
    """The public call of ``function`` on the arrays ``a`` (views of one pool; on a GPU, of its
    :func:`mirrored` device copy)."""

    def run() -> None:
        with mirrored(a, backend) as views:
            _host_call(function, views, backend)()

    return run


@contextmanager
def mirrored(arrays: dict[str, np.ndarray], backend: str) -> Iterator[dict]:
    """``arrays`` as the kernels of ``backend`` take them: unchanged on NumPy and under the simulator;
    on a GPU, CuPy views at the same byte offsets of one device copy per host buffer (so the same
    arrays share memory, at the same alignment), copied back into the host buffers on exit,
    whether the block raised or not."""
    if backend != "cuda" or KERNEL_DEVICE != "cuda":
        yield arrays
        return
    import cupy as cp

    mirrors, views = {}, {}
    for name, array in arrays.items():
        root = array
        while isinstance(root.base, np.ndarray):
            root = root.base
        address = root.__array_interface__["data"][0]
        if id(root) not in mirrors:
            device = cp.empty(root.nbytes + 256, np.uint8)[address % 256 : address % 256 + root.nbytes]
            device.set(root.view(np.uint8).reshape(-1))
            mirrors[id(root)] = (root, device)
        device = mirrors[id(root)][1]
        start = array.__array_interface__["data"][0] - address
        views[name] = cp.ndarray(array.shape, array.dtype, memptr=device.data + start, strides=array.strides)
    try:
        yield views
    finally:
        cp.cuda.runtime.deviceSynchronize()
        for root, device in mirrors.values():
            root.view(np.uint8).reshape(-1)[...] = device.get()


def _host_call(function: str, a: dict, backend: str) -> Callable[[], None]:
    batch = {name: a.get(name) for name in ("req_pool_indices", "prefix_lens", "extend_seq_lens", "req_to_token")}
    if function == "scatter_req_token_ids":
        kw = {name: a[name] for name in ("flat_in", "offsets", "req_pool_indices", "pool_out")}
        return lambda: scatter_req_token_ids(**kw, backend=backend)
    if function == "compute_real_kv_hash":
        source = RealKvSource(tensor=a["kv"], page_size=1, num_bytes_per_token=32, read_bytes=32)
        return lambda: compute_real_kv_hash(
            real_kv_sources=(source,),
            real_kv_hash_mode=RealKvHashMode.PARTIAL,
            slot_indices=a["slot_indices"],
            out=a["out"],
            backend=backend,
        )
    if function == "launch_plan_offsets_kernel":
        outs = {name: a[name] for name in a if name.startswith("out_")}
        return lambda: launch_plan_offsets_kernel(
            **batch, **outs, full_to_swa_index_mapping=None, swa_window_size=0, verify_capacity=CAP, backend=backend
        )
    if function == "launch_canary_plan_kernels":
        return lambda: launch_canary_plan_kernels(
            verify_plan_out=_pick(a, VerifyPlan),
            write_plan_out=_pick(a, WritePlan),
            **batch,
            swa_window_size=0,
            full_to_swa_index_mapping=None,
            verify_capacity=CAP,
            req_to_verify_expected_tokens=a["pool"],
            req_to_verify_expected_tokens_valid_lens=a["lens"],
            kv_token_id_vs_position_offset=0,
            backend=backend,
        )
    if function == "launch_canary_verify_kernel":
        return lambda: launch_canary_verify_kernel(
            context=_context(a), plan=_pick(a, VerifyPlan), check_verify_expected_token=True, backend=backend
        )
    return lambda: launch_canary_write_kernel(
        context=_context(a),
        plan=_pick(a, WritePlan),
        input_ids=a["input_ids"],
        positions=a["positions"],
        out_cache_loc=a["out_cache_loc"],
        enable_write_input_assert=False,
        expected_input_tokens=None,
        expected_input_positions=None,
        backend=backend,
    )


def assert_same_result(got: dict[str, np.ndarray], want: dict[str, np.ndarray], backend: str) -> None:
    """Every array equal; on the kernels the ring's rows as a set (threads append them in any order)."""
    for name, array in got.items():
        if name == "violation_ring" and backend == "cuda":
            assert sorted(map(tuple, array.tolist())) == sorted(map(tuple, want[name].tolist())), name
        else:
            np.testing.assert_array_equal(array, want[name], err_msg=name)


def unaliased(function: str, arrays: dict[str, np.ndarray], backend: str) -> dict[str, np.ndarray]:
    """What the call leaves in each array when every array is a copy of its own (the spec's result)."""
    copies = {name: array.copy() for name, array in arrays.items()}
    call(function, copies, backend)()
    return copies
