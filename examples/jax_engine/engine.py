"""JaxEngine: the scheduler, the device state and the jitted step, with the canary's hooks.

One :meth:`JaxEngine.step`:

1. the scheduler picks the step's tokens and slots (host);
2. ``write_table`` adds the new slots to the device page table (jitted);
3. ``forward`` writes the new tokens' K and V into the pool and samples (jitted,
   dispatched: XLA runs it while the host goes on);
4. ``canary.pre_forward`` -- plan, HEAD verify and write. HEAD reads only the page table and
   the canary's own buffers, never the KV, so it runs beside the forward (on the GPU on the
   canary's stream) and its host time hides behind the model's;
5. ``canary.post_forward`` -- re-point the sources at the pool ``forward`` returned,
   TAIL verify and write against the live KV;
6. ``canary.end_step`` -- readback (of the previous step's status on a GPU: no wait for
   this one), reports; its :meth:`~.canary.JaxCanary.fence` goes into the next step's
   jitted calls;
7. the sampled tokens come back to the host; the scheduler appends and retires.

Steps 3 to 6 are host calls that queue device work: on a GPU they all run while the
model computes, and the host waits only for the sampled tokens.

The device state (pool, page table) is updated in place by buffer donation, or
functionally (``EngineConfig.donate=False``): either way the engine holds a new
``jax.Array`` after every update, and the canary is told about it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from .canary import JaxCanary
from .config import TINY, TINY_ENGINE, EngineConfig, ModelConfig
from .faults import FaultInjector
from .model import DeviceBatch, forward, init_params, new_kv_pool, write_table
from .scheduler import HostBatch, Scheduler

__all__ = ["JaxEngine", "jitted"]


@functools.cache
def jitted(donate: bool):
    """``(write_table, forward)`` jitted once per process (engines share their compiled steps).

    ``donate``: the page table and the pool are donated, so XLA updates them in place.
    ``keep_unused``: the fence argument is never read, and XLA must still wait for it.
    """
    table = jax.jit(write_table, donate_argnums=(0,) if donate else (), keep_unused=True)
    step = jax.jit(
        forward,
        static_argnames=("cfg", "ctx_len", "attention", "q_block"),
        donate_argnums=(1, 2) if donate else (),
        keep_unused=True,
    )
    return table, step


class JaxEngine:
    """A paged-KV serving engine for a Llama-shaped JAX model.

    Parameters
    ----------
    model : ModelConfig
    config : EngineConfig
    faults : mapping of str to int, optional
        Fault class -> first step it may fire (:mod:`.faults`).
    device : jax.Device, optional
        Where the weights, the pool and the page table live (default: JAX's default device).
    """

    def __init__(
        self,
        model: ModelConfig = TINY,
        config: EngineConfig = TINY_ENGINE,
        *,
        faults: Mapping[str, int] | None = None,
        device: jax.Device | None = None,
    ):
        self.model, self.config = model, config
        self.device = device or jax.devices()[0]
        with jax.default_device(self.device):
            self.params = init_params(model, config.seed)
            self.k_pool, self.v_pool = new_kv_pool(model, config.num_slots)
            self.req_to_token = jnp.zeros((config.req_rows, config.max_context), jnp.int32)
            self._fence = jnp.zeros(1, jnp.int32)
        self.sched = Scheduler(config, model.vocab_size)
        self._write_table, self._forward = jitted(config.donate)
        self.injector = FaultInjector(self, dict(faults or {}))
        self.canary: JaxCanary | None = None
        self.step_index = 0

    def attach_canary(self, **options) -> JaxCanary:
        """Build a :class:`~.canary.JaxCanary` over this engine's pool; it runs every step from now on.

        ``options`` go to :class:`~.canary.JaxCanary` (``real_kv``, ``mode``, ...); the sizes
        come from the engine's configuration.
        """
        c = self.config
        with jax.default_device(self.device):
            self.canary = JaxCanary(
                k_arrays=self.k_pool[:1],
                v_arrays=self.v_pool[:1],
                num_slots=c.num_slots,
                max_requests=c.req_rows,
                max_context=c.max_context,
                write_req_capacity=c.max_running,
                write_token_capacity=c.step_tokens,
                **options,
            )
        return self.canary

    def device_batch(self, hb: HostBatch) -> DeviceBatch:
        """The model's padded inputs: every row, one token wide for pure decode, a chunk wide otherwise."""
        width = 1 if int(hb.extend_seq_lens.max(initial=0)) <= 1 else self.config.chunk_size
        return DeviceBatch(**{k: jnp.asarray(v) for k, v in hb.padded(self.config.max_running, width).items()})

    def step(self) -> HostBatch:
        """Run one engine step (see the module docstring)."""
        with jax.default_device(self.device):
            return self._step()

    def _step(self) -> HostBatch:
        t, injector, canary = self.step_index, self.injector, self.canary
        injector.before_schedule(t)
        hb = self.sched.schedule()
        injector.after_schedule(t, hb)
        rows, cols, slots = hb.table_writes(self.config.step_tokens)
        self.req_to_token = self._write_table(self.req_to_token, rows, cols, slots, self._fence)
        self.req_to_token = injector.after_table(t, self.req_to_token)
        next_tokens, self.k_pool, self.v_pool = self._forward(
            self.params,
            self.k_pool,
            self.v_pool,
            self.req_to_token,
            self.device_batch(hb),
            self._fence,
            cfg=self.model,
            ctx_len=self.config.max_context,
        )
        if canary is not None:
            canary.pre_forward(hb, self.req_to_token)
            canary.post_forward(self.k_pool[:1], self.v_pool[:1])
        injector.after_forward(t)
        if canary is not None:  # while the model runs: end_step reads the previous step's status
            canary.end_step()
            self._fence = canary.fence()
        self.sched.complete(hb, np.asarray(next_tokens))  # the engine's own host sync: it needs the tokens
        self.step_index += 1
        return hb

    def run(self, steps: int) -> None:
        """Run ``steps`` steps, then flush the canary's pending readback."""
        for _ in range(steps):
            self.step()
        if self.canary is not None:
            self.canary.flush()

    @property
    def faults(self):
        """Faults that fired so far (:class:`~.faults.FaultRecord`)."""
        return list(self.injector.records)

    def catches(self) -> dict[str, list]:
        """Fault class -> the canary's violations that report it (empty list: missed)."""
        return self.injector.catches(self.canary.violations if self.canary is not None else [])
