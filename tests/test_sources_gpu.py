"""Memory that moves under the monitor on a GPU: CuPy sources and batch arrays reshaped in place, a
PyTorch-like tensor given other storage, rebinding on the eager, prepared and graph paths.

Run under ``compute-sanitizer --tool memcheck`` on a device: a source or batch array changed in
place must be refused (or followed) before any kernel reads it, so memcheck reports 0 errors.
The same scenarios run here on NumPy (``xp=numpy``, the CPU monitor) where they can, so their
logic is checked without a GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import raises_code

from kvcanary_numba import RealKvHashMode, RealKvSource, compute_real_kv_hash
from kvcanary_numba.monitor import CanaryMonitor, KvGroup, StepBatch

SLOTS, BYTES, ROWS, WIDTH = 64, 64, 2, 32


def _xp(name: str):
    if name == "numpy":
        return np
    pytest.importorskip("cupy")
    from conftest import HAS_GPU

    if not HAS_GPU:
        pytest.skip("needs a CUDA GPU with CuPy")
    import cupy

    return cupy


def _kv_bytes(token: int, salt: int) -> np.ndarray:
    return ((np.arange(BYTES) * 5 + token * 11 + salt) % 253).astype(np.uint8)


def _source(tensor) -> RealKvSource:
    return RealKvSource(tensor=tensor, page_size=1, num_bytes_per_token=BYTES, read_bytes=BYTES)


class Engine:
    """One request on ``xp`` arrays: a 4-token prefill, then decode steps on one batch refilled in
    place (the same objects every step, so a captured graph replays)."""

    def __init__(self, xp, *, path: str = "prepared"):
        self.xp, self.path = xp, path
        self.k = xp.zeros((SLOTS, BYTES), dtype=np.uint8)
        self.v = xp.zeros((SLOTS, BYTES), dtype=np.uint8)
        self.table = xp.zeros((ROWS, WIDTH), dtype=np.int32)
        full = KvGroup(kind="full", num_slots=SLOTS, k_sources=(_source(self.k),), v_sources=(_source(self.v),))
        options = {} if xp is np else {"prepared": path != "eager"}
        self.monitor = CanaryMonitor(
            full=full,
            device="cpu" if xp is np else "cuda",
            write_req_capacity=ROWS - 1,
            real_kv_hash_mode=RealKvHashMode.ALL,
            health_interval=0,
            **options,
        )
        self.tokens = 0
        i64 = lambda n: xp.zeros(n, dtype=np.int64)  # noqa: E731
        self.prefill = StepBatch(
            req_pool_indices=xp.ones(1, dtype=np.int64),
            prefix_lens=i64(1),
            extend_seq_lens=xp.full(1, 4, dtype=np.int64),
            req_to_token=self.table,
            input_ids=i64(4),
            positions=i64(4),
            out_cache_loc=i64(4),
        )
        self.decode = StepBatch(
            req_pool_indices=xp.ones(1, dtype=np.int64),
            prefix_lens=i64(1),
            extend_seq_lens=xp.ones(1, dtype=np.int64),
            req_to_token=self.table,
            input_ids=i64(1),
            positions=i64(1),
            out_cache_loc=i64(1),
        )
        self.step(self.prefill, 4)

    def _fill(self, batch: StepBatch, n: int) -> None:
        xp, start = self.xp, self.tokens
        positions = np.arange(start, start + n, dtype=np.int64)
        slots = positions + 1  # slot 0 is padding
        self.table[1, start : start + n] = xp.asarray(slots.astype(np.int32))
        batch.prefix_lens[...] = start
        batch.input_ids[...] = xp.asarray(100 + positions)
        batch.positions[...] = xp.asarray(positions)
        batch.out_cache_loc[...] = xp.asarray(slots)

    def forward(self, batch: StepBatch, n: int) -> None:
        """The engine's KV write of the step's ``n`` new tokens (into ``self.k`` / ``self.v`` as they are now)."""
        for position in range(self.tokens, self.tokens + n):
            self.k[position + 1] = self.xp.asarray(_kv_bytes(100 + position, 0))
            self.v[position + 1] = self.xp.asarray(_kv_bytes(100 + position, 1))

    def step(self, batch: StepBatch | None = None, n: int = 1, *, before_tail=None) -> None:
        batch = self.decode if batch is None else batch
        self._fill(batch, n)
        self.monitor.pre_forward(batch)
        self.forward(batch, n)
        if before_tail is not None:
            before_tail()
        self.monitor.post_forward()
        self.tokens += n
        self.monitor.end_step()

    def capture(self) -> None:
        self._fill(self.decode, 1)
        self.monitor.capture_graph(self.decode)

    def caught(self) -> set[tuple[str, int]]:
        self.monitor.flush()
        return {(v.tag, v.slot_idx) for v in self.monitor.violations if "verify_real_kv_hash" in v.reasons}

    def moved(self) -> None:
        """K and V copied to new memory and rebound; the old arrays are flipped at cached slot 2."""
        old_k, old_v = self.k, self.v
        self.k, self.v = self.k.copy(), self.v.copy()
        self.monitor.rebind_sources(k_sources=(_source(self.k),), v_sources=(_source(self.v),))
        old_k[2, 0] ^= 1
        old_v[2, 0] ^= 1


PATHS = [("numpy", "eager"), ("cupy", "eager"), ("cupy", "prepared"), ("cupy", "graph")]
gpu_paths = pytest.mark.parametrize(
    "lib, path", [pytest.param(*p, marks=[pytest.mark.gpu] if p[0] == "cupy" else []) for p in PATHS]
)


@gpu_paths
@pytest.mark.parametrize("when", ["between steps", "before post_forward"])
def test_a_rebind_is_followed_on_every_path(lib, path, when):
    e = Engine(_xp(lib), path=path)
    e.step()
    if path == "graph":
        e.capture()
        e.step()
    if when == "between steps":
        e.moved()
        e.step()
    else:
        e.step(before_tail=e.moved)  # the forward wrote the old buffers, copied into the new ones
    e.step()
    assert e.caught() == set()  # the old memory's flips: not what the monitor reads now
    e.k[3, 1] ^= 1
    e.step()
    assert e.caught() == {("TAIL_K_FULL", 3)}
    if path == "graph":
        assert e.monitor.graph is None  # it launched on the old pointers: dropped


@pytest.mark.gpu
def test_a_rebind_onto_the_same_memory_keeps_the_graph():
    e = Engine(_xp("cupy"), path="graph")
    e.step()
    e.capture()
    e.step()
    graph = e.monitor.graph
    e.monitor.rebind_sources(k_sources=(_source(e.k[:]),), v_sources=(_source(e.v[:]),))
    e.step()
    e.k[3, 1] ^= 1
    e.step()
    assert e.monitor.graph is graph and graph.replays == 3
    assert e.caught() == {("TAIL_K_FULL", 3)}


@gpu_paths
def test_a_source_reshaped_in_place_is_refused_before_any_launch(lib, path):
    e = Engine(_xp(lib), path=path)
    e.step()
    if path == "graph":
        e.capture()
        e.step()
    e.k[3, 1] ^= 1
    batch = e.decode
    e._fill(batch, 1)
    e.monitor.pre_forward(batch)
    e.forward(batch, 1)
    e.k.shape = (2 * SLOTS, BYTES // 2)  # a fingerprint on these rows would read past the array
    with raises_code("KVC-R011"):
        e.monitor.post_forward()
    e.k.shape = (SLOTS, BYTES)
    e.monitor.post_forward()
    e.tokens += 1
    e.monitor.end_step()
    assert e.caught() == {("TAIL_K_FULL", 3)}


class StorageTensor:
    """What a PyTorch tensor looks like to the package: a shape and a CUDA array interface, whose
    memory can change under the same object (``set_``, a growing ``resize_``)."""

    def __init__(self, backing):
        self.backing = backing

    @property
    def shape(self):
        return self.backing.shape

    @property
    def __cuda_array_interface__(self):
        return self.backing.__cuda_array_interface__


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["eager", "prepared", "graph"])
def test_a_tensor_given_other_storage_is_followed(path):
    xp = _xp("cupy")
    e = Engine(xp, path=path)
    tensor = StorageTensor(e.k)
    e.monitor.rebind_sources(k_sources=(_source(tensor),), v_sources=(_source(e.v),))
    e.step()
    if path == "graph":
        e.capture()
        e.step()
    old = e.k
    e.k = tensor.backing = old.copy()  # same object, other memory: seen at the next post_forward
    old[2, 0] ^= 1
    e.step()
    e.step()
    assert e.caught() == set()
    e.k[3, 1] ^= 1
    e.step()
    assert e.caught() == {("TAIL_K_FULL", 3)}
    assert (e.monitor.graph is None) == (path == "graph")


@gpu_paths
@pytest.mark.parametrize(
    "field, move, code",
    [
        ("out_cache_loc", lambda a: setattr(a, "shape", (1, 1)), "KVC-C003"),
        ("req_to_token", lambda a: setattr(a, "shape", (2 * ROWS, WIDTH // 2)), None),  # valid: checked, used
    ],
    ids=["refused", "followed"],
)
def test_a_batch_array_reshaped_in_place_is_checked_before_any_launch(lib, path, field, move, code):
    e = Engine(_xp(lib), path=path)
    e.step()
    if path == "graph":
        e.capture()
        e.step()
    move(getattr(e.decode, field))
    if code is not None:
        with raises_code(code):
            e.monitor.pre_forward(e.decode)
        return
    e._fill(e.decode, 1)
    e.monitor.pre_forward(e.decode)  # the table is read as [4, 16] now: other slots (reported), in bounds
    e.monitor.post_forward()
    e.monitor.end_step()
    e.monitor.flush()
    if path == "graph":
        assert e.monitor.graph.replays == 1  # the step after capture only: this one took the prepared path


@pytest.mark.parametrize("lib", ["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
def test_a_public_fingerprint_of_a_source_reshaped_in_place_is_refused(lib):
    xp = _xp(lib)
    kv = xp.zeros((SLOTS, BYTES), dtype=np.uint8)
    source = _source(kv)
    out = xp.zeros(4, dtype=np.int64)
    compute_real_kv_hash(
        real_kv_sources=(source,), real_kv_hash_mode=RealKvHashMode.ALL, slot_indices=xp.arange(4), out=out
    )
    kv.shape = (2 * SLOTS, BYTES // 2)
    with raises_code("KVC-R011"):
        compute_real_kv_hash(
            real_kv_sources=(source,), real_kv_hash_mode=RealKvHashMode.ALL, slot_indices=xp.arange(4), out=out
        )
