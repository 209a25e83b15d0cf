"""The launches of one monitor step, through the validated public launch functions.

:class:`StepLaunches` is a base of :class:`~kvcanary_numba.monitor.CanaryMonitor`:
the methods read the monitor's buffers and issue the launches of one phase with
no host reads and no allocation, so they can be recorded (:mod:`.fastpath`) or
captured into a CUDA graph. On the CPU path they are the whole step.

On the CUDA kernels (a GPU, or the simulator in tests) each phase of a group
verifies all its endpoints (K, V) in one launch and writes them in one launch
(``launch/endpoints.py``, internal: the batch was validated by the hooks, the
contexts and plans are the monitor's own): a decode step with K and V is 7
launches (scatter, 2 plan, 2 HEAD, 2 TAIL) instead of 11. On NumPy each
endpoint goes through the public verify and write, as before.

The write launches of one group share one chain per step: the first HEAD
write publishes it (``launch/chain.py``), the others consume it and only stamp
(each still checks that the published chain applies to its own buffer and
inputs, so records stay those of a launch that runs its own chain); in a fused
HEAD write the V endpoint runs its own chain beside the publishing K (it cannot
wait for it inside one launch). A long (prefill-shaped) step takes the tiled
path (``launch.chain.long_step`` of the batch size): HEAD runs the chain alone
(``chain_publish``) first, then each phase stamps K and V in one tiled launch
(``kernels/tiled_endpoints.py``): 7 launches for a prefill step with K and V (was 9).
Phases that do not fuse keep one tiled write per endpoint (``launch.chain.write_chain``,
which reads the batch size passed to ``sharing``).
"""

from __future__ import annotations

import numpy as np

from ..fast.calls import (
    launch_canary_plan_kernels,
    launch_canary_verify_kernel,
    launch_canary_write_kernel,
    scatter_req_token_ids,
)
from ..fast.chain import SharedChain, sharing
from .batch import StepBatch
from .groups import GroupState

__all__ = ["StepLaunches"]


class StepLaunches:
    """HEAD and TAIL launches of a step (see the module docstring).

    Expects the monitor's attributes: ``xp``, ``groups``, ``check_tokens``,
    ``token_pool``, ``valid_lens``, ``_backend``, ``budget`` (None or a
    :class:`~.budget.BudgetState`), ``write_token_capacity``,
    ``write_req_capacity``; sets ``_locs`` (each group's
    slots of the new tokens) for the TAIL phase, which reads ``_batch``.
    """

    def _launch_pre(self, batch: StepBatch) -> None:
        """HEAD phase: inputs, then per group the plans and the HEAD verify/write launches."""
        self._launch_plan_head(batch, *self._prepare_inputs(batch))

    def _prepare_inputs(self, batch: StepBatch, *, eager: bool = True):
        """Expected-token scatter (pool, valid lengths) and each group's slots of the new tokens.

        ``eager=False``: the pool, this step's view of the valid lengths and each SWA group's
        view of its slots are returned unfilled; the caller's phase starts with
        :meth:`_launch_inputs`, which fills them on the device (the prepared path).
        """
        pool = lens = None
        if self.check_tokens:
            pool, lens = self.token_pool, self.valid_lens[: batch.batch_size]
            if eager:
                scatter_req_token_ids(flat_in=batch.token_ids_flat, offsets=batch.token_offsets,
                                      req_pool_indices=batch.req_pool_indices, pool_out=pool,
                                      backend=self._backend)  # fmt: skip
                self.xp.subtract(batch.token_offsets[1:], batch.token_offsets[:-1], out=lens)
        n = batch.num_tokens
        self._locs = [g.translate_loc(self.xp, batch.out_cache_loc, n, eager=eager) for g in self.groups]
        return pool, lens

    def _launch_inputs(self, batch: StepBatch, pool, lens) -> None:
        """What :meth:`_prepare_inputs` computes, as kernel launches (recorded into the prepared
        HEAD phase; the batch's arrays are already checked): the token scatter and the valid
        lengths in one launch, one slot translation per SWA group. A prepared step then makes
        no public scatter call and no CuPy operation (~10 us of host time each on a GPU host)."""
        # The kernel glue needs numba.cuda, which a CPU-only install lacks: imported on the GPU path only.
        from ..fast.inputs import scatter_tokens_and_lens, translate_slots

        if self.check_tokens:
            scatter_tokens_and_lens(flat_in=batch.token_ids_flat, offsets=batch.token_offsets,
                                    req_pool_indices=batch.req_pool_indices, pool_out=pool, lens_out=lens)  # fmt: skip
        for g, loc in zip(self.groups, self._locs):
            if g.lut is not None:
                translate_slots(lut=g.lut, index=batch.out_cache_loc, out=loc)

    def _launch_plan_head(self, batch: StepBatch, pool, lens) -> None:
        asserted = batch.expected_input_tokens is not None
        for g, loc in zip(self.groups, self._locs):
            launch_canary_plan_kernels(
                verify_plan_out=g.verify_plan, write_plan_out=g.write_plan,
                req_pool_indices=batch.req_pool_indices, prefix_lens=batch.prefix_lens,
                extend_seq_lens=batch.extend_seq_lens, req_to_token=batch.req_to_token,
                swa_window_size=g.window, full_to_swa_index_mapping=g.lut,
                verify_capacity=g.verify_plan.verify_capacity, req_to_verify_expected_tokens=pool,
                req_to_verify_expected_tokens_valid_lens=lens, kv_token_id_vs_position_offset=0,
                backend=self._backend,
            )  # fmt: skip
            if self.budget is not None:  # budgeted mode: verify only the entries due this step
                self.budget.select(self.groups.index(g), g, self._backend)
            self._launch_endpoints(g, g.head, batch, loc, asserted, publish=True)

    def _launch_post(self, batch: StepBatch | None = None) -> None:
        """TAIL phase of the batch given to the HEAD phase (the step's plans, live-KV sources);
        ``batch``: that batch's fields as they were then (default: ``_batch`` as it is now)."""
        batch = self._batch if batch is None else batch
        asserted = batch.expected_input_tokens is not None
        for g, loc in zip(self.groups, self._locs):
            self._launch_endpoints(g, g.tail, batch, loc, asserted, publish=False)

    def _shared_chain(self, g: GroupState) -> SharedChain:
        """The group's step scratch of the shared chain (allocated on first use, before any capture)."""
        chains = self.__dict__.setdefault("_shared_chains", {})
        chain = chains.get(id(g))
        if chain is None:
            chain = chains[id(g)] = SharedChain(self.xp, tokens=self.write_token_capacity,
                                                requests=self.write_req_capacity)  # fmt: skip
        return chain

    def _launch_endpoints(self, g: GroupState, endpoints, batch: StepBatch, loc, asserted: bool, *,
                          publish: bool) -> None:  # fmt: skip
        chain = self._shared_chain(g)
        plan = g.verify_plan if self.budget is None else self.budget.plans[self.groups.index(g)]
        if self._backend == "cuda" or (self._backend == "auto" and self.xp is not np):
            from ..fast import endpoints as glue  # the kernels' glue: numba.cuda, not on the CPU path

            contexts = [endpoint.context for endpoint in endpoints]
            glue.launch_endpoint_verifies(contexts=contexts, plan=plan, check_verify_expected_token=self.check_tokens)
            glue.launch_endpoint_writes(
                contexts=contexts, plan=g.write_plan, input_ids=batch.input_ids, positions=batch.positions,
                out_cache_loc=loc, enable_write_input_assert=asserted,
                expected_input_tokens=batch.expected_input_tokens,
                expected_input_positions=batch.expected_input_positions, chain=chain, publish=publish,
                requests=batch.batch_size,
            )  # fmt: skip
            return
        for i, endpoint in enumerate(endpoints):
            launch_canary_verify_kernel(context=endpoint.context, plan=plan,
                                        check_verify_expected_token=self.check_tokens, backend=self._backend)  # fmt: skip
            with sharing(chain, publish=publish and i == 0, requests=batch.batch_size):
                launch_canary_write_kernel(
                    context=endpoint.context, plan=g.write_plan, input_ids=batch.input_ids,
                    positions=batch.positions, out_cache_loc=loc, enable_write_input_assert=asserted,
                    expected_input_tokens=batch.expected_input_tokens,
                    expected_input_positions=batch.expected_input_positions, backend=self._backend,
                )  # fmt: skip
