"""Launch glue of the verify kernel (:mod:`kvcanary_numba.kernels.verify`).

Called by :func:`kvcanary_numba.verify.run` with validated arguments: CUDA arrays on a GPU,
NumPy arrays under the simulator.
"""

from __future__ import annotations

import numpy as np

from ..kernels import verify as kernels
from ._launch import block_size, launch, persistent_views, reinterpret, resident_grid
from .context import context_args

__all__ = ["launch_canary_verify_kernel"]


def launch_canary_verify_kernel(*, context, plan, check_verify_expected_token: bool, stream: int | None = None) -> None:
    """Queue the verify kernel for ``plan`` on ``stream``.

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
    stream : int or None
        CUDA stream handle (None: CuPy's current stream).

    Notes
    -----
    The grid is sized from ``verify_capacity`` (the host never reads
    ``verify_num_valid``) and capped at what the compiled variant keeps resident;
    the kernel grid-strides over the active entries.
    """
    # Unused source slots get a read-only view of a plan array (never read by the variant).
    fallback = reinterpret(plan.verify_slot_indices, np.uint64, persistent=True)
    nsrc, words, tail = context_args(context, fallback)
    name = kernels.kernel_name(check_verify_expected_token, nsrc)
    kernel, signature = kernels.KERNELS[name], kernels.SIGNATURES[name][0]
    block = block_size(kernels.VERIFY_THREADS)
    grid = resident_grid(kernel, signature, plan.verify_slot_indices.shape[0], block)
    args = (
        words,
        *persistent_views(
            plan.verify_slot_indices,
            plan.verify_expected_tokens,
            plan.verify_expected_positions,
            plan.verify_prev_slot_indices,
            plan.verify_num_valid,
            plan.enable,
        ),
        *tail,
    )
    launch(kernel, signature, grid, block, args, stream)
