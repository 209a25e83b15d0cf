"""The canary attached to a JAX engine: views of XLA's buffers, stream order, rebinding.

Three things make a JAX engine different from the package's toy engine.

1. **The KV pool is a new array after every step.** A functional update
   (``kv.at[slots].set(...)``) returns a new buffer; a donated one
   (``jax.jit(..., donate_argnums=...)``) is written in place but its old
   ``jax.Array`` is deleted. A ``RealKvSource`` built once would read a buffer the
   model no longer reads, or fail. :func:`rebind` is the one place that points the
   monitor at the current buffers (``CanaryMonitor.rebind_sources``);
   :meth:`JaxCanary.post_forward` calls it every step, before the TAIL launches read KV.

2. **A view must not pin the buffer.** ``np.asarray`` of a CPU array and
   ``cupy.from_dlpack`` of a GPU array hold an *external reference* on XLA's buffer
   for as long as the view lives. While one does, XLA cannot donate that buffer:
   the CPU backend then silently copies the whole array instead (measured with
   jax 0.4.35 and 0.10.2), and PJRT's GPU clients refuse ("Donation requested for
   buffer with external reference"). :func:`alias` therefore views the memory
   without a reference (it keeps the ``jax.Array`` object alive, not the buffer hold).

3. **XLA computes on its own stream.** On a GPU the canary's launches go to a
   CuPy stream of their own. Reads are ordered after XLA's writes by the DLPack
   handshake (``x.__dlpack__(stream=s)`` makes stream ``s`` wait on the device
   for ``x``'s producer, no host sync); XLA's next step is ordered after the
   canary's reads by a *fence* (:meth:`JaxCanary.fence`): a tiny CuPy array
   imported into JAX on the canary's stream, which the next jitted call takes as
   an argument and therefore waits for. ``order="block"`` replaces both with host
   synchronisation, for comparison.
"""

from __future__ import annotations

import contextlib
import ctypes

import jax
import jax.numpy as jnp
import numpy as np

from kvcanary_numba import CanaryMonitor, KvGroup, RealKvHashMode, RealKvSource

from .batches import BatchArrays

__all__ = ["JaxCanary", "alias", "order_after", "rebind", "view"]


def order_after(x: jax.Array, *, gpu: bool, stream=None) -> None:
    """Make the canary's next reads of ``x`` come after whatever XLA queued to produce it.

    CPU: the host waits (the NumPy path reads on the host as soon as a hook is called).
    GPU: DLPack's stream handshake: ``x.__dlpack__(stream=...)`` enqueues "wait for ``x``'s
    definition event" on the canary's stream and returns at once; the capsule, and the
    buffer hold it carries, is dropped right away.
    """
    if gpu:
        x.__dlpack__(stream=stream.ptr)
    else:
        x.block_until_ready()


def alias(x: jax.Array, *, gpu: bool):
    """A read-only NumPy (CPU) or CuPy (GPU) array over ``x``'s memory, holding no buffer reference.

    It keeps the ``jax.Array`` object alive, not XLA's hold on the buffer, so a later call
    may still donate ``x``. It is valid while ``x`` is neither deleted nor donated, and after
    a donation while XLA keeps writing the output into the same buffer (``jit`` aliases a
    donated input to the output of the same shape). The caller orders reads first
    (:func:`order_after`).
    """
    if not gpu:
        raw = (ctypes.c_char * x.nbytes).from_address(x.unsafe_buffer_pointer())
        raw.owner = x
        out = np.frombuffer(raw, dtype=x.dtype).reshape(x.shape)
        out.flags.writeable = False
        return out
    import cupy

    memory = cupy.cuda.UnownedMemory(x.unsafe_buffer_pointer(), x.nbytes, owner=x)
    return cupy.ndarray(x.shape, dtype=x.dtype, memptr=cupy.cuda.MemoryPointer(memory, 0))


def view(x: jax.Array, *, gpu: bool, stream=None, wait: bool = True):
    """:func:`alias` of ``x``, ordered after its producer when ``wait`` (see :func:`order_after`)."""
    if wait:
        order_after(x, gpu=gpu, stream=stream)
    return alias(x, gpu=gpu)


def _source(rows) -> RealKvSource:
    """A source over ``rows`` ([num_slots, elements]): one slot per row (page_size 1), every byte
    folded in ALL mode (PARTIAL reads the first 16)."""
    nbytes = rows.shape[1] * rows.dtype.itemsize
    return RealKvSource(tensor=rows, page_size=1, num_bytes_per_token=nbytes, read_bytes=nbytes)


def _sources(arrays, *, gpu: bool, stream, wait: bool) -> tuple[RealKvSource, ...]:
    """Sources over the current buffers of ``arrays`` (each ``[num_slots, kv_heads, head_dim]``)."""
    return tuple(_source(view(x, gpu=gpu, stream=stream, wait=wait).reshape(x.shape[0], -1)) for x in arrays)


def rebind(monitor: CanaryMonitor, k_arrays, v_arrays, *, stream=None, wait: bool = True) -> None:
    """Point ``monitor``'s FULL-group real-KV sources at the pool's current buffers.

    The only place the canary learns where the KV is: called after every forward, before
    the TAIL launches (and any sweep) read it. With donation the buffers stay put and the
    monitor keeps its prepared launches and captured graph; with functional updates they
    move, and the monitor re-points its launches (and drops a graph).

    Parameters
    ----------
    monitor : CanaryMonitor
    k_arrays, v_arrays : tuple of jax.Array
        The current K and V arrays to fingerprint (layer 0, as SGLang does).
    stream : cupy.cuda.Stream, optional
        The canary's stream (GPU).
    wait : bool
        Order the reads after the arrays' producer (see :func:`view`).
    """
    kw = dict(gpu=monitor.device == "cuda", stream=stream, wait=wait)
    monitor.rebind_sources(k_sources=_sources(k_arrays, **kw), v_sources=_sources(v_arrays, **kw))


class JaxCanary:
    """A :class:`~kvcanary_numba.CanaryMonitor` over a JAX engine's KV pool, and its step hooks.

    The engine calls, every step: :meth:`pre_forward` once the device page table holds
    the step's slots, the forward, :meth:`post_forward` with the pool the forward
    returned, then :meth:`end_step`; the next step's first jitted call takes
    :meth:`fence` as an argument.

    Parameters
    ----------
    k_arrays, v_arrays : tuple of jax.Array
        The K and V arrays to fingerprint (``[num_slots, kv_heads, head_dim]``; layer 0).
    num_slots, max_requests, max_context, write_req_capacity, write_token_capacity : int
        Pool and batch sizes (see :class:`~kvcanary_numba.CanaryMonitor`).
    real_kv : bool
        Fingerprint the live KV (default; rebound when the pool moves, see :func:`rebind`). Without it the canary
        still checks chains, positions and tokens.
    real_kv_hash_mode : RealKvHashMode
        PARTIAL (16 bytes per slot, SGLang's default) or ALL.
    order : {"stream", "block"}
        GPU ordering between XLA and the canary: device-side waits and a fence, or host syncs.
    staged : bool, optional
        Build batches the GPU way on the CPU too (tests).
    **monitor_options
        Passed to the monitor (``mode``, ``health_interval``, ``verify_budget``, ...).
    """

    def __init__(
        self,
        *,
        k_arrays,
        v_arrays,
        num_slots: int,
        max_requests: int,
        max_context: int,
        write_req_capacity: int,
        write_token_capacity: int,
        real_kv: bool = True,
        real_kv_hash_mode: RealKvHashMode = RealKvHashMode.PARTIAL,
        order: str = "stream",
        staged: bool | None = None,
        **monitor_options,
    ):
        if order not in ("stream", "block"):
            raise ValueError(f"JaxCanary: order must be 'stream' or 'block', got {order!r}")
        self.gpu = k_arrays[0].devices().pop().platform == "gpu"
        self.order, self.real_kv = order, real_kv
        if self.gpu:
            import cupy

            xp, self.stream = cupy, cupy.cuda.Stream(non_blocking=True)
            self._fence_buffer = cupy.zeros(1, dtype=np.int32)
        else:
            xp, self.stream = np, None
        # What a jitted call takes when no fence is needed (CPU, or the host already waited).
        self._no_fence = jnp.zeros(1, jnp.int32)

        # Until the first rebind the monitor holds placeholders: rows of zeros that take no memory
        # (stride-0 broadcasts), never a view of the pool that could go stale.
        def placeholders(arrays):
            return tuple(
                _source(
                    xp.broadcast_to(
                        xp.zeros((1, x.shape[1] * x.shape[2]), x.dtype), (x.shape[0], x.shape[1] * x.shape[2])
                    )
                )
                for x in arrays
            )

        full = KvGroup(
            kind="full",
            num_slots=num_slots,
            has_v=True,
            k_sources=placeholders(k_arrays) if real_kv else (),
            v_sources=placeholders(v_arrays) if real_kv else (),
        )
        self.monitor = CanaryMonitor(
            full=full,
            device="cuda" if self.gpu else "cpu",
            real_kv_hash_mode=real_kv_hash_mode if real_kv else RealKvHashMode.NONE,
            write_req_capacity=write_req_capacity,
            write_token_capacity=write_token_capacity,
            check_verify_expected_token=True,
            max_requests=max_requests,
            max_context_len=max_context,
            **monitor_options,
        )
        capacity = 3 * write_req_capacity + 1 + 5 * write_token_capacity + write_req_capacity * max_context
        self.batches = BatchArrays(xp=xp, capacity=capacity, stream=self.stream, staged=staged)
        self._table = (None, None)  # (pointer, view) of the device page table's last view
        self._pool = ()  # the pool buffers' pointers the sources were last rebound to
        if real_kv:
            with self._on_stream():
                rebind(self.monitor, tuple(k_arrays), tuple(v_arrays), stream=self.stream)

    def _on_stream(self):
        """``with`` block in which the monitor launches on the canary's stream (CPU: nothing)."""
        return self.stream if self.gpu else contextlib.nullcontext()

    def _wait(self, arrays) -> bool:
        """Block order: the host waits for ``arrays`` now, returns False. Otherwise True: the
        caller orders the reads itself (:func:`order_after`)."""
        if self.gpu and self.order == "block":
            jax.block_until_ready(arrays)  # host sync: the comparison point for the stream order
            return False
        return True

    def _table_view(self, req_to_token: jax.Array):
        """The canary's view of the device page table: ordered after this step's table write,
        and the same object as long as the table's buffer stays put (donation)."""
        if self._wait(req_to_token):
            order_after(req_to_token, gpu=self.gpu, stream=self.stream)
        pointer = req_to_token.unsafe_buffer_pointer()
        if self._table[0] != pointer:
            self._table = (pointer, alias(req_to_token, gpu=self.gpu))
        return self._table[1]

    def pre_forward(self, hb, req_to_token: jax.Array):
        """Plan and HEAD launches for ``hb`` (a :class:`~.scheduler.HostBatch`); returns the StepBatch."""
        with self._on_stream():
            batch = self.batches.batch(hb, self._table_view(req_to_token))
            self.monitor.pre_forward(batch)
        return batch

    def capture_graph(self, hb, req_to_token: jax.Array) -> None:
        """Capture the monitor's launches for ``hb``'s shape (GPU): later steps of the same shape replay them.

        The StepBatch is the one :meth:`pre_forward` builds for that shape (refilled in place
        every step), so the monitor recognises it; run one eager step of the shape first.
        """
        with self._on_stream():
            self.monitor.capture_graph(self.batches.batch(hb, self._table_view(req_to_token)))

    def post_forward(self, k_arrays, v_arrays) -> None:
        """Point the sources at the pool the forward returned, then the TAIL launches.

        A donated pool keeps its buffers: then the sources already name them (the reads are
        ordered after this step's writes all the same), and the monitor's prepared launches
        and graph stay as they are. A functional update moved them: rebound.
        """
        with self._on_stream():
            if self.real_kv:
                arrays = (*k_arrays, *v_arrays)
                wait = self._wait(arrays)
                pointers = tuple(x.unsafe_buffer_pointer() for x in arrays)
                if pointers != self._pool:
                    rebind(self.monitor, tuple(k_arrays), tuple(v_arrays), stream=self.stream, wait=wait)
                    self._pool = pointers
                elif wait:
                    for x in arrays:
                        order_after(x, gpu=self.gpu, stream=self.stream)
            self.monitor.post_forward()

    def end_step(self, **kwargs) -> None:
        """The monitor's end of step (sweep, readback); keyword arguments go to ``end_step``."""
        with self._on_stream():
            self.monitor.end_step(**kwargs)

    def fence(self) -> jax.Array:
        """An array the next jitted call must take: XLA starts it after the canary's queued work.

        GPU, stream order: a CuPy array imported into JAX on the canary's stream. JAX asks
        CuPy for it with ``__dlpack__(stream=<JAX's stream>)``; CuPy makes that stream wait
        for the canary's stream, and XLA waits for an argument's producer before it runs.
        Block order: the host waits for the canary's stream instead.
        """
        if not self.gpu:
            return self._no_fence
        if self.order == "block":
            self.stream.synchronize()
            return self._no_fence
        with self.stream:
            return jax.dlpack.from_dlpack(self._fence_buffer)

    def flush(self) -> None:
        with self._on_stream():
            self.monitor.flush()

    @property
    def violations(self):
        return self.monitor.violations
