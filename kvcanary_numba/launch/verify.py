"""Launch glue of the verify kernel (``kvcanary_numba.kernels.verify``)."""

from __future__ import annotations

import numpy as np

from ..kernels import verify as _kernels
from . import _common
from .fingerprint import source_args

__all__ = ["context_args", "launch_canary_verify_kernel"]


def context_args(context, fallback) -> tuple[int, object, tuple]:
    """Kernel arguments that come from a CanaryContext, shared by verify and write.

    Returns ``nsrc`` (real-KV sources folded, selects the variant), the canary
    buffer as int64 ``[num_slots, stride // 8]`` (the kernels' first argument)
    and their last arguments: ring, write index, slot and kernel counters,
    tag, the four source spans and the source parameters. ``fallback``: see
    :func:`.fingerprint.source_args`.
    """
    buf = context.canary_buf
    words = _common.reinterpret(buf, np.int64, (buf.shape[0], buf.shape[1] // 8), persistent=True)
    nsrc, spans, params, _ = source_args(context.real_kv_sources, context.real_kv_hash_mode, fallback)
    tail = (
        *_common.persistent_views(
            context.violation_ring, context.violation_write_index, context.slot_run_counter, context.kernel_run_counter
        ),
        int(context.kernel_kind),
        *spans,
        params,
    )
    return nsrc, words, tail


def launch_canary_verify_kernel(*, context, plan, check_verify_expected_token) -> None:
    """Run the verify kernel for ``plan`` on CuPy's current stream (or the simulator).

    Arguments are those of :func:`kvcanary_numba.launch_canary_verify_kernel`
    minus ``backend``, already validated: CUDA arrays on a GPU, NumPy arrays
    under the simulator.

    Parameters
    ----------
    context : CanaryContext
        Canary buffer (uint8 [num_slots, stride], read only), ring (int64
        [capacity, 8]), write index (int32 [1]), counters (int64 [1]), tag,
        real-KV sources and mode.
    plan : VerifyPlan
        int64 [verify_capacity] slots / expected tokens / positions / prev
        slots, int32 [1] ``verify_num_valid`` and ``enable``.
    check_verify_expected_token : bool
        Selects the variant that reads ``verify_expected_tokens``.

    Notes
    -----
    The grid is sized from ``verify_capacity`` (the host never reads
    ``verify_num_valid``) and capped at what the compiled variant keeps resident; the kernel
    grid-strides over the active entries.
    """
    fallback = _common.reinterpret(plan.verify_slot_indices, np.uint64, persistent=True)  # read-only alias
    nsrc, words, tail = context_args(context, fallback)
    name = _kernels.kernel_name(check_verify_expected_token, nsrc)
    block = _common.block_size(_kernels.VERIFY_THREADS)
    args = (
        words,
        *_common.persistent_views(
            plan.verify_slot_indices, plan.verify_expected_tokens, plan.verify_expected_positions,
            plan.verify_prev_slot_indices, plan.verify_num_valid, plan.enable,
        ),  # fmt: skip
        *tail,
    )
    kernel, signature = _kernels.KERNELS[name], _kernels.SIGNATURES[name][0]
    grid = _common.resident_grid(kernel, signature, plan.verify_slot_indices.shape[0], block)
    _common.launch(kernel, signature, grid, block, args)
