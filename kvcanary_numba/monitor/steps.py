"""The step plan: which launches one monitor step makes, phase by phase.

:class:`EagerSteps` reads the monitor's buffers and issues the launches of one
phase with no host reads and no allocation, so what it issues can be recorded
(``kvcanary_numba.fast.steps.PreparedSteps``) or captured into a CUDA graph.
Run as it is every step, it is the eager path: the whole step on the CPU, and on a
GPU when the monitor has no prepared steps.

On NumPy each endpoint goes through the public verify and write
(``kvcanary_numba.fast.calls``). On the CUDA kernels (a GPU, or the simulator in
tests) each phase of a group verifies all its endpoints (K, V) in one launch and
writes them in one launch (``fast/endpoints.py``: internal glue, since the hooks
validated the batch and the contexts and plans are the monitor's own): a decode
step with K and V is 7 launches (scatter, 2 plan, 2 HEAD, 2 TAIL) instead of 11.

The write launches of one group share one chain per step: the first HEAD write
publishes it (``fast/chain.py``), the others consume it and only stamp (each still
checks that the published chain applies to its own buffer and inputs, so records
stay those of a launch that runs its own chain); in a fused HEAD write the V
endpoint runs its own chain beside the publishing K (it cannot wait for it inside
one launch). A long (prefill-shaped) step takes the tiled path
(``fast.chain.long_step`` of the batch size): HEAD runs the chain alone
(``chain_publish``) first, then each phase stamps K and V in one tiled launch.
"""

from __future__ import annotations

from typing import Any

from .._runtime import CUDA_IMPORTS
from ..fast.calls import (
    launch_canary_plan_kernels,
    launch_canary_verify_kernel,
    launch_canary_write_kernel,
    scatter_req_token_ids,
)
from ..fast.chain import SharedChain, sharing
from .batch import StepBatch
from .buffers import MonitorBuffers

__all__ = ["BATCH_ROLES", "FREE_ROLES", "EagerSteps"]

#: StepBatch fields the launches read (the engine's per-step arrays), by role name.
BATCH_ROLES = (
    "req_pool_indices",
    "prefix_lens",
    "extend_seq_lens",
    "req_to_token",
    "input_ids",
    "positions",
    "out_cache_loc",
    "expected_input_tokens",
    "expected_input_positions",
    "token_offsets",
    "token_ids_flat",
)
#: Roles whose length is no part of which launches a step makes (they read it from the array
#: argument): the flat token list grows every decode step.
FREE_ROLES = ("token_ids_flat",)


class EagerSteps:
    """HEAD and TAIL launches of a monitor step (see the module docstring).

    Parameters
    ----------
    buffers : MonitorBuffers
        The monitor's arrays: its groups (buffers, contexts, plans; FULL first), the
        expected-token pool and valid lengths (``check_tokens`` only) and the capacities
        (largest batch; sizes of each group's shared-chain scratch).
    xp : module
        NumPy or CuPy: the module of every buffer.
    backend : {"numpy", "cuda"}
        The monitor's resolved backend, passed to every public call; ``"cuda"`` on
        NumPy buffers runs the kernels under Numba's CUDA simulator (tests).
    check_tokens : bool
        Whether the plans check stored tokens against the token pool.
    budget : BudgetState or None
        Budgeted verification: each phase verifies only the entries due this step.
    verdict : VerdictState, optional
        The monitor's verdict word, written by the TAIL phase's last launch.

    Attributes
    ----------
    locs : list
        Each group's slots of the new tokens of the step last prepared
        (:meth:`prepare_inputs`): the batch's ``out_cache_loc`` for FULL, a view of
        the group's scratch for SWA. The TAIL phase reads them.
    batch_roles, free_roles : tuple of str
        :data:`BATCH_ROLES` and :data:`FREE_ROLES`.
    """

    batch_roles = BATCH_ROLES
    free_roles = FREE_ROLES

    def __init__(self, buffers: MonitorBuffers, *, xp, backend: str, check_tokens: bool, budget, verdict=None):
        self.groups, self.xp, self.budget, self.check_tokens = buffers.groups, xp, budget, check_tokens
        self.verdict = verdict
        self.token_pool, self.valid_lens = buffers.token_pool, buffers.valid_lens
        caps = buffers.caps
        self._capacities = dict(tokens=caps["write_token_capacity"], requests=caps["write_req_capacity"])
        self.use_backend(backend)
        self.locs: list = []

    def use_backend(self, backend: str) -> None:
        """Launch on ``backend`` (resolved: ``"numpy"`` or ``"cuda"``) from the next phase on."""
        self.backend = backend
        self.kernels = backend == "cuda"  # the fused endpoint glue; else the public calls per endpoint
        # Allocated at a group's first step on the kernels (every path's first step, before any capture).
        self._chains: list[SharedChain | None] = [None] * len(self.groups)

    def prepare_inputs(self, batch: StepBatch, *, eager: bool = True) -> tuple[Any, Any]:
        """Expected-token scatter (pool, valid lengths) and each group's slots of the new tokens.

        Parameters
        ----------
        batch : StepBatch
            A batch the monitor checked.
        eager : bool
            False: the pool, this step's view of the valid lengths and each SWA group's view
            of its slots are returned unfilled; the phase that follows starts with
            :meth:`launch_inputs`, which fills them on the device (the prepared path).

        Returns
        -------
        (pool, lens)
            The token pool and the step's valid lengths (int64 [bs] view), or (None, None)
            without the token check.
        """
        pool = lens = None
        if self.check_tokens:
            pool, lens = self.token_pool, self.valid_lens[: batch.batch_size]
            if eager:
                scatter_req_token_ids(
                    flat_in=batch.token_ids_flat,
                    offsets=batch.token_offsets,
                    req_pool_indices=batch.req_pool_indices,
                    pool_out=pool,
                    backend=self.backend,
                )
                self.xp.subtract(batch.token_offsets[1:], batch.token_offsets[:-1], out=lens)
        n = batch.num_tokens
        self.locs = [g.translate_loc(self.xp, batch.out_cache_loc, n, eager=eager) for g in self.groups]
        return pool, lens

    def launch_inputs(self, batch: StepBatch, pool, lens) -> None:
        """What :meth:`prepare_inputs` computes, as kernel launches: the token scatter and the valid
        lengths in one launch, one slot translation per SWA group.

        Recorded into the prepared HEAD phase, so a prepared step makes no public scatter call and
        no CuPy operation (~10 us of host time each on a GPU host).

        Parameters
        ----------
        batch : StepBatch
            A batch the monitor checked.
        pool, lens
            What ``prepare_inputs(batch, eager=False)`` returned (filled here).
        """
        # The kernel glue needs numba.cuda, which a CPU-only install lacks: imported on the GPU path only.
        with CUDA_IMPORTS:
            from ..fast.inputs import scatter_tokens_and_lens, translate_slots

        if self.check_tokens:
            scatter_tokens_and_lens(
                flat_in=batch.token_ids_flat,
                offsets=batch.token_offsets,
                req_pool_indices=batch.req_pool_indices,
                pool_out=pool,
                lens_out=lens,
            )
        for g, loc in zip(self.groups, self.locs):
            if g.lut is not None:
                translate_slots(lut=g.lut, index=batch.out_cache_loc, out=loc)

    def head(self, batch: StepBatch, pool, lens) -> None:
        """HEAD phase after :meth:`prepare_inputs`: per group the plans, then the HEAD verify and write.

        Parameters
        ----------
        batch : StepBatch
            A batch the monitor checked.
        pool, lens
            What :meth:`prepare_inputs` returned for it.
        """
        asserted = batch.expected_input_tokens is not None
        for i, (g, loc) in enumerate(zip(self.groups, self.locs)):
            launch_canary_plan_kernels(
                verify_plan_out=g.verify_plan,
                write_plan_out=g.write_plan,
                req_pool_indices=batch.req_pool_indices,
                prefix_lens=batch.prefix_lens,
                extend_seq_lens=batch.extend_seq_lens,
                req_to_token=batch.req_to_token,
                swa_window_size=g.window,
                full_to_swa_index_mapping=g.lut,
                verify_capacity=g.verify_plan.verify_capacity,
                req_to_verify_expected_tokens=pool,
                req_to_verify_expected_tokens_valid_lens=lens,
                kv_token_id_vs_position_offset=0,
                backend=self.backend,
            )
            if self.budget is not None:  # budgeted mode: verify only the entries due this step
                self.budget.select(i, g, self.backend)
            self._endpoints(i, g.head, batch, loc, asserted, publish=True)

    def tail(self, batch: StepBatch) -> None:
        """TAIL phase of the batch the HEAD phase ran (the step's plans and slots, live-KV sources).

        Parameters
        ----------
        batch : StepBatch
            The fields as they were at the HEAD phase: the hooks keep a copy, so a field the
            engine reassigned in between is not launched on.
        """
        asserted = batch.expected_input_tokens is not None
        for i, (g, loc) in enumerate(zip(self.groups, self.locs)):
            self._endpoints(i, g.tail, batch, loc, asserted, publish=False)
        if self.verdict is not None:  # after every launch that may record a row this step
            self.verdict.write(self.backend)

    def roles(self, batch: StepBatch, lens) -> dict[str, Any]:
        """The per-step arrays the launches read, by role: every :data:`BATCH_ROLES` field, the
        step's valid lengths (``valid_lens``) and each group's slots (``loc0``, ``loc1``)."""
        roles = {name: getattr(batch, name) for name in BATCH_ROLES}
        roles["valid_lens"] = lens
        roles.update((f"loc{i}", loc) for i, loc in enumerate(self.locs))
        return roles

    def _chain(self, index: int) -> SharedChain:
        chain = self._chains[index]
        if chain is None:
            chain = self._chains[index] = SharedChain(self.xp, **self._capacities)
        return chain

    def _endpoints(self, index: int, endpoints, batch: StepBatch, loc, asserted: bool, *, publish: bool) -> None:
        g, chain = self.groups[index], self._chain(index)
        plan = g.verify_plan if self.budget is None else self.budget.plans[index]
        if self.kernels:
            with CUDA_IMPORTS:  # the kernels' glue: numba.cuda, not on the CPU path
                from ..fast import endpoints as glue

            contexts = [endpoint.context for endpoint in endpoints]
            glue.launch_endpoint_verifies(contexts=contexts, plan=plan, check_verify_expected_token=self.check_tokens)
            glue.launch_endpoint_writes(
                contexts=contexts,
                plan=g.write_plan,
                input_ids=batch.input_ids,
                positions=batch.positions,
                out_cache_loc=loc,
                enable_write_input_assert=asserted,
                expected_input_tokens=batch.expected_input_tokens,
                expected_input_positions=batch.expected_input_positions,
                chain=chain,
                publish=publish,
                requests=batch.batch_size,
            )
            return
        for i, endpoint in enumerate(endpoints):
            launch_canary_verify_kernel(
                context=endpoint.context, plan=plan, check_verify_expected_token=self.check_tokens, backend=self.backend
            )
            with sharing(chain, publish=publish and i == 0, requests=batch.batch_size):
                launch_canary_write_kernel(
                    context=endpoint.context,
                    plan=g.write_plan,
                    input_ids=batch.input_ids,
                    positions=batch.positions,
                    out_cache_loc=loc,
                    enable_write_input_assert=asserted,
                    expected_input_tokens=batch.expected_input_tokens,
                    expected_input_positions=batch.expected_input_positions,
                    backend=self.backend,
                )
