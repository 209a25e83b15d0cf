"""The write operation: stamp the canary records of the slots a forward pass writes.

:func:`validate` checks every argument and picks the backend, :func:`run` dispatches with
one explicit ``if`` to the NumPy specification (:mod:`kvcanary_numba.reference.write`) or
to the launch glue (:mod:`kvcanary_numba.launch.write`, which launches
:mod:`kvcanary_numba.kernels.write`), and :func:`launch_canary_write_kernel` is the two
in a row. The package's top level exports the same function wrapped by the fast wing
(``kvcanary_numba/fast/calls.py``).

Slot 0 is SGLang's padding slot: verify never checks it, so a real token stored there is not
protected. :func:`check_values` warns once per process (:class:`CanarySlotZeroWarning`) when a
write's own requests store into slot 0, seen only where that costs no device read: when
``out_cache_loc`` and the write plan are NumPy arrays.

``input_ids``, ``positions`` and ``out_cache_loc`` may be int32 or int64, as SGLang's launcher
takes them (:data:`INDEX_ARGUMENTS`); the kernels and the specification read int64, so int32
arrays are widened first (:func:`host_int64` on NumPy, a launch into scratch on CUDA arrays:
``launch/write.py``), which the caller never sees.
"""

from __future__ import annotations

import os
import sys
import warnings

import numpy as np

from . import _overlap
from ._runtime import CUDA_IMPORTS
from ._validate import (
    as_native,
    check_array,
    check_bool,
    check_bundle,
    check_type,
    inspect_array,
    resolve_backend,
    stream_handle,
)
from .constants import CanaryLaunchTag
from .context import check_context
from .errors import KvCanaryError, error
from .plans import WritePlan
from .reference import write as reference

__all__ = [
    "INDEX_ARGUMENTS",
    "SLOT_ZERO_MESSAGE",
    "CanarySlotZeroWarning",
    "check_index_array",
    "check_values",
    "host_int64",
    "launch_canary_write_kernel",
    "run",
    "slot_zero_written",
    "validate",
    "warn_slot_zero",
]

FUNCTION = "launch_canary_write_kernel"
_EXPECTED = ("expected_input_tokens", "expected_input_positions")
#: The arguments SGLang's launcher accepts as int32 or int64 (it hands int64 to its kernels).
INDEX_ARGUMENTS = ("input_ids", "positions", "out_cache_loc")


def check_index_array(function: str, argument: str, array, *, shape=None, shape_of=None):
    """A 1-D C-contiguous index array of dtype int64 or int32; returns its ArrayInfo.

    Raises KVC-C002 (naming both dtypes) for any other dtype, and check_array's codes.
    """
    try:
        return check_array(function, argument, array, dtype=np.int64, ndim=1, shape=shape, shape_of=shape_of)
    except KvCanaryError as exc:
        if exc.code != "KVC-C002":
            raise
        if inspect_array(function, argument, array).dtype != np.int32:
            got = exc.fields["got"]
            raise error("KVC-C002", function=function, argument=argument, expected="int64 or int32", got=got) from None
    return check_array(function, argument, array, dtype=np.int32, ndim=1, shape=shape, shape_of=shape_of)


class CanarySlotZeroWarning(UserWarning):
    """A write stores a real token's record in slot 0, SGLang's padding slot, which verify never checks."""


SLOT_ZERO_MESSAGE = (
    "kv-canary slot 0: {function} stores a real token in slot 0, the padding slot that verify never "
    "checks; allocate KV slots from 1 (warned once per process)"
)
_slot_zero_warned = False
_SWA_TAGS = frozenset(int(tag) for tag in CanaryLaunchTag if tag.name.endswith("_SWA"))
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside this package (the user's call, whichever
    path of the package led here)."""
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    return level


def warn_slot_zero(function: str) -> None:
    """Warn (:class:`CanarySlotZeroWarning`), once per process, that ``function`` writes slot 0."""
    global _slot_zero_warned
    if not _slot_zero_warned:
        _slot_zero_warned = True
        message = SLOT_ZERO_MESSAGE.format(function=function)
        warnings.warn(message, CanarySlotZeroWarning, stacklevel=_caller_level())


def slot_zero_written(out_cache_loc, write_offsets, write_num_valid_reqs) -> bool:
    """Whether an entry of a request the write walks targets slot 0 (host arrays; False for others).

    Padding rows have no entries in a plan (their write length is 0), so an entry of a walked
    request is a real token. Vectorised: a request range's entries are marked by a running sum.
    """
    arrays = (out_cache_loc, write_offsets, write_num_valid_reqs)
    if not all(isinstance(a, np.ndarray) for a in arrays):
        return False  # device memory: reading it would sync the stream
    zero = out_cache_loc == 0
    if not zero.any():
        return False
    n, capacity = zero.shape[0], write_offsets.shape[0] - 1
    valid = min(max(int(write_num_valid_reqs[0]), 0), capacity)
    starts = np.clip(write_offsets[:valid], 0, n)
    ends = np.clip(write_offsets[1 : valid + 1], 0, n)
    walked = ends > starts
    marks = np.zeros(n + 1, dtype=np.int64)
    np.add.at(marks, starts[walked], 1)
    np.add.at(marks, ends[walked], -1)
    return bool((zero & (np.cumsum(marks[:n]) > 0)).any())


def check_values(kwargs: dict) -> None:
    """The checks of a write that read array contents: the slot-0 warning. Part of validation, and
    what the fast wing's memo runs again on every call it serves (it knows layouts, not contents).

    An SWA context is left alone: its slots come through the full-to-SWA LUT, where 0 stands for
    a token out of the window or evicted (SGLang writes those into slot 0 on purpose).
    """
    if not _slot_zero_warned and int(kwargs["context"].kernel_kind) not in _SWA_TAGS:
        plan = kwargs["plan"]
        if slot_zero_written(kwargs["out_cache_loc"], plan.write_offsets, plan.write_num_valid_reqs):
            warn_slot_zero(FUNCTION)


def host_int64(kwargs: dict) -> dict:
    """``kwargs`` with each NumPy int32 array of :data:`INDEX_ARGUMENTS` as an int64 copy."""
    out = dict(kwargs)
    for name in INDEX_ARGUMENTS:
        array = out[name]
        if isinstance(array, np.ndarray) and array.dtype == np.int32:
            out[name] = array.astype(np.int64)
    return out


def validate(
    *,
    context,
    plan,
    input_ids,
    positions,
    out_cache_loc,
    enable_write_input_assert,
    expected_input_tokens,
    expected_input_positions,
    backend: str = "auto",
) -> tuple[str, list]:
    """Every check of a write call; returns (backend, every array of the call as (name, ArrayInfo))."""
    arrays = check_context(FUNCTION, context, writes_buffer=True, needs_chain_flag=True)
    check_type(FUNCTION, "plan", plan, WritePlan)
    seeds = check_array(FUNCTION, "plan.write_seed_slot_indices", plan.write_seed_slot_indices, dtype=np.int64, ndim=1)
    offsets = check_array(FUNCTION, "plan.write_offsets", plan.write_offsets, dtype=np.int64, ndim=1)
    if offsets.shape[0] != seeds.shape[0] + 1:
        raise error(
            "KVC-W001",
            function=FUNCTION,
            argument="plan.write_offsets",
            expected=seeds.shape[0] + 1,
            got=offsets.shape[0],
        )
    arrays += [("plan.write_seed_slot_indices", seeds), ("plan.write_offsets", offsets)]
    arrays += check_bundle(FUNCTION, "plan", plan, [("write_num_valid_reqs", np.int32, (1,))])
    tokens = check_index_array(FUNCTION, "input_ids", input_ids)
    arrays.append(("input_ids", tokens))
    for name, array in (("positions", positions), ("out_cache_loc", out_cache_loc)):
        arrays.append((name, check_index_array(FUNCTION, name, array, shape=tokens.shape, shape_of="input_ids")))
    asserted = check_bool(FUNCTION, "enable_write_input_assert", enable_write_input_assert)
    for name, array in zip(_EXPECTED, (expected_input_tokens, expected_input_positions)):
        if asserted and array is None:
            raise error("KVC-W002", function=FUNCTION, argument=name)
        if not asserted and array is not None:
            raise error("KVC-W003", function=FUNCTION, argument=name)
        if array is not None:
            arrays.append((name, check_array(FUNCTION, name, array, dtype=np.int64, ndim=1, shape=tokens.shape)))
    chosen = resolve_backend(FUNCTION, backend, arrays)
    _overlap.check(FUNCTION, arrays)
    check_values(dict(context=context, plan=plan, out_cache_loc=out_cache_loc))
    return chosen, arrays


def run(backend: str, *, stream=None, **kwargs) -> None:
    """Run a validated write call on ``backend`` (``kwargs``: :func:`launch_canary_write_kernel`'s
    arguments); ``stream`` is a CUDA stream handle or None."""
    kwargs["enable_write_input_assert"] = bool(kwargs["enable_write_input_assert"])
    if backend == "numpy":
        reference.launch_canary_write_kernel(**host_int64(kwargs))
    else:
        with CUDA_IMPORTS:  # needs numba-cuda: imported on the kernel path only, one thread at a time
            from .launch import write as glue

        glue.launch_canary_write_kernel(**kwargs, stream=stream)


def launch_canary_write_kernel(
    *,
    context,
    plan,
    input_ids,
    positions,
    out_cache_loc,
    enable_write_input_assert=False,
    expected_input_tokens=None,
    expected_input_positions=None,
    backend: str = "auto",
    stream=None,
) -> None:
    """Stamp the canary records of the slots a forward pass writes.

    For each request ``r < clamp(write_num_valid_reqs, 0, capacity)`` the
    entries ``i`` in ``[write_offsets[r], write_offsets[r + 1])`` are walked in
    order from the chain hash of ``write_seed_slot_indices[r]`` (negative =
    chain head). An entry with ``out_cache_loc[i] < 0`` is skipped; otherwise
    its slot receives (token, position, running prev_hash, real-KV
    fingerprint) and the running hash advances on the actual token and
    position. Optional asserts record rows: the write-input assert (bits 8/16
    against the expected arrays) and the chain-step position assert
    (``position == previous position + 1``, bit 16, on when
    ``context.enable_chain_position_assert[0] != 0`` and the seed is a real
    slot). Out-of-range ranges, seeds and slots are reported with the
    extension bits 256 / 128 / 64 (docs/concepts/semantics.md).
    ``kernel_run_counter`` += 1 per call; ``slot_run_counter`` += slots stored.

    Parameters
    ----------
    context : CanaryContext
        canary_buf uint8 [num_slots, stride >= 32] (written);
        violation_ring int64 [ring_capacity, 8]; violation_write_index int32
        [1]; slot_run_counter, kernel_run_counter int64 [1];
        enable_chain_position_assert int32 [1]; up to 4 real_kv_sources
        covering every slot; real_kv_hash_mode; kernel_kind.
    plan : WritePlan
        write_offsets int64 [write_req_capacity + 1]; write_seed_slot_indices
        int64 [write_req_capacity]; write_num_valid_reqs int32 [1].
    input_ids : int64 or int32 [num_tokens]
        Token id of every entry of the step (padding allowed).
    positions : int64 or int32 [num_tokens]
        Position of every entry in its request.
    out_cache_loc : int64 or int32 [num_tokens]
        KV slot every entry is written to (negative: skipped). Slot 0 is SGLang's padding
        slot, which verify never checks.
    enable_write_input_assert : bool, default False
        Run the write-input assert.
    expected_input_tokens : int64 [num_tokens] or None, default None
        Tokens the write-input assert compares ``input_ids`` with; required when
        ``enable_write_input_assert`` is True, None otherwise.
    expected_input_positions : int64 [num_tokens] or None, default None
        Positions the write-input assert compares ``positions`` with; required when
        ``enable_write_input_assert`` is True, None otherwise.
    backend : {"auto", "numpy", "cuda"}
        ``"auto"`` follows the arrays (NumPy -> reference, CUDA -> kernels).
    stream : CUDA stream, int handle or None
        Where the kernel is queued (None: CuPy's current stream).

    Notes
    -----
    On a GPU one warp walks each request. The package's top-level function (the
    fast wing's) runs a long write (``num_tokens >= 256 * write_req_capacity``)
    in two launches instead: the chain alone into launch scratch (40 bytes per
    token, allocated by the first such call of each power-of-two size on each
    stream, then kept), then a parallel stamp, a block per request. Both stamp
    the same records and report the same rows. Capture such a long write into a
    CUDA graph only after one eager call of its size on that stream
    (allocation is not allowed during capture).

    Raises
    ------
    KvCanaryError
        KVC-V001, KVC-W001 (offsets length), KVC-W002 / KVC-W003 (expected
        inputs vs the flag), KVC-C001 … KVC-C016 for arrays, bools, the
        backend and the stream, KVC-R007 … KVC-R009 for real-KV sources,
        KVC-C017 (a written context array sharing memory with another array).
    """
    handle = stream_handle(FUNCTION, stream)
    kwargs = as_native(
        FUNCTION,
        dict(
            context=context,
            plan=plan,
            input_ids=input_ids,
            positions=positions,
            out_cache_loc=out_cache_loc,
            enable_write_input_assert=enable_write_input_assert,
            expected_input_tokens=expected_input_tokens,
            expected_input_positions=expected_input_positions,
        ),
    )
    chosen, _ = validate(**kwargs, backend=backend)
    run(chosen, **kwargs, stream=handle)
