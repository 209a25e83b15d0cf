"""Launch glue of ``kvcanary_numba.fast.kernels.endpoints``: the verify, and the write, of every
endpoint of one monitor phase in one launch each.

Internal host entry of the monitor's steps (it needs numba.cuda), not a public function:
its callers pass their own contexts and plans and a batch they have validated
(``StepBatch.check_arrays`` and the monitor's construction checks cover what
the public wrappers would check), CUDA arrays on a GPU, NumPy arrays under the
simulator. The public single-endpoint launches are unchanged.

What is fused, and what is not:

- verify: one launch for all endpoints when they fold the same number of real-KV
  sources (the kernel variant; always so for HEAD, and for TAIL when K and V have
  as many sources), else one plain launch per endpoint;
- write, decode-shaped step (:func:`.chain.long_step` False): one launch. With a
  shared chain the first endpoint publishes it when ``publish`` (HEAD) and the
  others run their own chain in the same launch (a consumer cannot wait for a
  publisher of the same launch; the chain of a decode step is one ``mix3`` per
  entry), or all consume the published one (TAIL);
- write, long (prefill-shaped) step with a shared chain: when ``publish`` (HEAD)
  ``chain_publish`` first runs the chain alone on the first endpoint's buffer (as
  the plain path's publisher does, ``fast/chain.py``), then one tiled launch
  (``fast/kernels/tiled_endpoints.py``) stamps every endpoint from it (role CONSUME);
  TAIL is the tiled launch alone. Two launches per long step fewer than one
  ``write_tiled`` per endpoint;
- one endpoint: the plain launches (nothing to save).

Records, rows, counters and write indices are those of the plain launches, one
per endpoint (``fast/kernels/endpoints.py``). Every array in a tuple argument is a
persistent view (contexts, plans), as prepared phases require (``fast/recording.py``);
the per-step arrays (token arrays, slots, expected inputs) are top-level arguments
viewed from the batch, which prepared phases rebind by role. The chain role is an
argument, not thread state (``chain.sharing`` is entered here only around the plain
launches), so the glue reads nothing besides its arguments: no replay key to register.

Repeated calls replay: the monitor's eager path (no prepared phases) calls both entries
every step with the same contexts, plans and (refilled in place) batch arrays, and
re-deriving the launches and re-packing each launch's 211-259 parameters cost ~1.3 ms of
host time per decode step on an H200. Both go through :func:`.glue_memo.run_memoised`:
the first call runs the glue, the second packs its launches, later ones replay them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import numpy as np

from ..constants import MAX_ENDPOINTS, MAX_REAL_KV_SOURCES, RealKvHashMode
from ..context import CanaryContext
from ..kernels.verify import VERIFY_THREADS
from ..launch import _launch as _common, verify as _verify
from ..launch.context import context_args
from ..plans import VerifyPlan, WritePlan
from . import write as _write
from .chain import SharedChain, launch_chain_publish, long_step, sharing
from .dlpack import native_views
from .glue_memo import run_memoised
from .kernels import endpoints as _kernels, share as _share, tiled_endpoints as _tiled_endpoints

__all__ = ["fused_count", "launch_endpoint_verifies", "launch_endpoint_writes", "source_count"]


def source_count(context: CanaryContext) -> int:
    """Real-KV sources a launch on ``context`` folds (0 in NONE mode): its kernel variant."""
    if RealKvHashMode(context.real_kv_hash_mode) == RealKvHashMode.NONE:
        return 0
    return min(len(context.real_kv_sources), MAX_REAL_KV_SOURCES)


def fused_count(contexts: Sequence[CanaryContext]) -> int:
    """Endpoints one launch serves for ``contexts`` (0: they take one plain launch each)."""
    if not 2 <= len(contexts) <= MAX_ENDPOINTS:
        return 0
    first = source_count(contexts[0])
    return len(contexts) if all(source_count(c) == first for c in contexts[1:]) else 0


def _each(items: list) -> tuple:
    """Per-endpoint items as the kernels' ``UniTuple``: unused slots repeat the first item."""
    return tuple(items) + (items[0],) * (MAX_ENDPOINTS - len(items))


def _contexts(contexts: Sequence[CanaryContext], fallback) -> tuple[int, tuple]:
    """(sources folded, per-endpoint arguments: buffers, rings, write indices, slot counters,
    kernel counters, tags, spans, source parameters)."""
    parts = [context_args(c, fallback) for c in contexts]
    tails = [tail for _, _, tail in parts]
    columns = [[tail[k] for tail in tails] for k in range(5)]  # ring, index, counters, tag
    spans = [tuple(tail[5:9]) for tail in tails]
    params = [tail[9] for tail in tails]
    return parts[0][0], tuple(_each(c) for c in ([w for _, w, _ in parts], *columns, spans, params))


def launch_endpoint_verifies(
    *, contexts: Sequence[CanaryContext], plan: VerifyPlan, check_verify_expected_token: bool, stream: int | None = None
) -> None:
    """Verify ``plan`` against every context in ``contexts``: one launch when they fuse
    (:func:`fused_count`), else the plain verify per context, in order.

    A call repeated with the same arguments replays the launches of the first ones
    (:func:`.glue_memo.run_memoised`): the monitor's eager path makes it every step.
    """
    run_memoised(
        "verifies",
        _verifies,
        dict(contexts=contexts, plan=plan, check_verify_expected_token=check_verify_expected_token),
        stream,
    )


def launch_endpoint_writes(
    *,
    contexts: Sequence[CanaryContext],
    plan: WritePlan,
    input_ids,
    positions,
    out_cache_loc,
    enable_write_input_assert: bool,
    expected_input_tokens,
    expected_input_positions,
    chain: SharedChain | None = None,
    publish: bool = False,
    requests: int | None = None,
    stream: int | None = None,
) -> None:
    """Stamp the step's entries into every context in ``contexts`` (see the module docstring).

    ``chain``: the step's shared chain (None: every endpoint runs its own);
    ``publish``: the first endpoint publishes it (HEAD), else all consume it;
    ``requests``: the step's batch size (None: the plan's capacity), which with the
    token count picks the path. Repeated calls replay as :func:`launch_endpoint_verifies`'s.
    """
    kwargs = dict(
        contexts=contexts,
        plan=plan,
        input_ids=input_ids,
        positions=positions,
        out_cache_loc=out_cache_loc,
        enable_write_input_assert=enable_write_input_assert,
        expected_input_tokens=expected_input_tokens,
        expected_input_positions=expected_input_positions,
        chain=chain,
        publish=publish,
        requests=requests,
    )
    run_memoised("writes", _writes, kwargs, stream)


def _verifies(
    *, contexts: Sequence[CanaryContext], plan: VerifyPlan, check_verify_expected_token: bool, stream: int | None
) -> None:
    count = fused_count(contexts)
    if not count:
        for context in contexts:
            _verify.launch_canary_verify_kernel(
                context=context, plan=plan, stream=stream, check_verify_expected_token=check_verify_expected_token
            )
        return
    fallback = _common.reinterpret(plan.verify_slot_indices, np.uint64, persistent=True)  # read-only alias
    nsrc, (bufs, *per_endpoint) = _contexts(contexts, fallback)
    name = _kernels.verify_name(check_verify_expected_token, nsrc)
    kernel, signature = _kernels.KERNELS[name], _kernels.SIGNATURES[name][0]
    block = _common.block_size(VERIFY_THREADS)
    per = _common.resident_grid(kernel, signature, plan.verify_slot_indices.shape[0], block, parts=count)
    args = (
        bufs,
        *_common.persistent_views(
            plan.verify_slot_indices,
            plan.verify_expected_tokens,
            plan.verify_expected_positions,
            plan.verify_prev_slot_indices,
            plan.verify_num_valid,
            plan.enable,
        ),
        *per_endpoint,
        per,
    )
    _common.launch(kernel, signature, per * count, block, args, stream)


def _writes(
    *,
    contexts: Sequence[CanaryContext],
    plan: WritePlan,
    input_ids,
    positions,
    out_cache_loc,
    enable_write_input_assert: bool,
    expected_input_tokens,
    expected_input_positions,
    chain: SharedChain | None,
    publish: bool,
    requests: int | None,
    stream: int,
) -> None:
    kwargs = dict(
        input_ids=input_ids,
        positions=positions,
        out_cache_loc=out_cache_loc,
        expected_input_tokens=expected_input_tokens,
        expected_input_positions=expected_input_positions,
    )
    kwargs = {name: native_views(value) for name, value in kwargs.items()}  # DLPack-only: as the public path
    capacity = plan.write_seed_slot_indices.shape[0]
    count = fused_count(contexts)
    tiled = chain is not None and long_step(int(input_ids.shape[0]), capacity if requests is None else requests)
    if not count:
        for i, context in enumerate(contexts):
            shared = (
                contextlib.nullcontext()
                if chain is None
                else sharing(chain, publish=publish and i == 0, requests=requests)
            )
            with shared:
                _write.launch_canary_write_kernel(
                    context=context,
                    plan=plan,
                    stream=stream,
                    enable_write_input_assert=enable_write_input_assert,
                    **kwargs,
                )
        return
    tokens = _common.kernel_array(kwargs["input_ids"])
    token_positions = _common.kernel_array(kwargs["positions"])
    expected_tokens, expected_positions = kwargs["expected_input_tokens"], kwargs["expected_input_positions"]
    # Unused source spans: a read-only view of a plan array, persistent as a tuple item must be.
    fallback = _common.reinterpret(plan.write_seed_slot_indices, np.uint64, persistent=True)
    nsrc, (bufs, rings, indices, slot_counters, kernel_counters, kinds, spans, params) = _contexts(contexts, fallback)
    own, consume = int(_share.OWN), int(_share.CONSUME)
    if chain is None:
        stand_in = _write.unshared_scratch(bufs[0])
        roles, scratch = [own] * count, (stand_in, stand_in)
    elif tiled:  # the chain alone first (HEAD), then every endpoint stamps from it
        roles, scratch = [consume] * count, _common.persistent_views(chain.published, chain.published_seeds)
    else:
        roles = [int(_share.PUBLISH)] + [own] * (count - 1) if publish else [consume] * count
        scratch = _common.persistent_views(chain.published, chain.published_seeds)
    head = (
        *_common.persistent_views(plan.write_offsets, plan.write_seed_slot_indices, plan.write_num_valid_reqs),
        tokens,
        token_positions,
        _common.kernel_array(kwargs["out_cache_loc"]),
    )
    args = (
        bufs,
        *head,
        tokens if expected_tokens is None else _common.kernel_array(expected_tokens),
        token_positions if expected_positions is None else _common.kernel_array(expected_positions),
        _each(list(_common.persistent_views(*(c.enable_chain_position_assert for c in contexts)))),
        rings,
        indices,
        slot_counters,
        kernel_counters,
        kinds,
        spans,
        params,
        _each(roles),
        *scratch,
    )
    if tiled:
        if publish:  # the first endpoint's buffer holds the seed states the chain starts from
            launch_chain_publish((bufs[0], *head, *scratch), capacity, stream)
        _launch_tiled(args, capacity, count, enable_write_input_assert, nsrc, stream)
        return
    name = _kernels.write_name(enable_write_input_assert, nsrc)
    kernel, signature = _kernels.KERNELS[name], _kernels.SIGNATURES[name][0]
    block, per_sm = _write.write_shape()
    # Blocks of each endpoint's part (requests spread over blocks first, as the plain write).
    per = _common.persistent_grid(capacity, 1, blocks_per_sm=per_sm, parts=count)
    _common.launch(kernel, signature, per * count, block, (*args, per), stream)


def _launch_tiled(args: tuple, capacity: int, count: int, input_assert: bool, nsrc: int, stream: int) -> None:
    """The tiled stamps of ``count`` endpoints in one launch (``fast/kernels/tiled_endpoints.py``): a
    block per request and endpoint, up to what stays resident (as ``launch/write.py``'s)."""
    block = _write.tiled_block()
    name = _tiled_endpoints.kernel_name(input_assert, nsrc)
    kernel, signature = _tiled_endpoints.KERNELS[name], _tiled_endpoints.SIGNATURES[name][0]
    per = _common.resident_grid(kernel, signature, capacity * block, block, parts=count)
    _common.launch(kernel, signature, per * count, block, (*args, per), stream)
