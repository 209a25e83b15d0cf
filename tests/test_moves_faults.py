"""Faults in transit, each planted and caught: on the CPU (NumPy) and by the kernels under the simulator.

The scene is a device pool and a host tier. A request's KV and records go to host slots
(offload: the KV copied, the records gathered and scattered into the host copy, the departure
digest taken), rest there (the host-tier check), and come back to other device slots, the ones
the page table lists (reload: the records check of the landed runs at once, and the digest of
what landed compared with the departure digest). Each fault class of the issue is planted on
the way and must show up where the docs say (docs/concepts/moves.md):

==========================  =====================================================================
fault                       caught by
==========================  =====================================================================
bit flip in host KV         host-tier check (bit 4), landing check (bit 4), digest
bit flip in a host record   host-tier check (chain / position), landing check, digest
stale copy reloaded         digest (the stale copy is a valid chain of the old content)
two pages swapped           landing check (position, chain), digest
a page missing              landing check, digest
records not moved with KV   landing check (what the slots held before), digest
reload into other slots     landing check of the page table's slots, digest
==========================  =====================================================================
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from move_helpers import copy_kv, make_pool, ring, runs, write_request

from kvcanary_numba import (
    HandoffDigest,
    HandoffSignature,
    KvCanaryError,
    RealKvHashMode,
    check_handoff_digest,
    compute_handoff_digest,
    gather_canary_records,
    scatter_canary_records,
    verify_canary_records,
)

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
BACKENDS = [
    "numpy",
    pytest.param("cuda", marks=[pytest.mark.simulator, pytest.mark.skipif(not SIMULATOR, reason="simulator only")]),
]
PAGE = 4
LENGTH = 12  # three pages
i64 = lambda values: np.asarray(values, dtype=np.int64)  # noqa: E731


class Scene:
    """A device pool and a host copy (NumPy under the simulator too: ``backend`` picks the code)."""

    def __init__(self, backend: str, seed: int = 0):
        self.backend = backend
        rng = self.rng = np.random.default_rng(seed)
        options = dict(mode=RealKvHashMode.ALL, nsrc=2, page_size=PAGE, nbytes=32, ring_capacity=512)
        self.device = make_pool(rng, 64, **options)
        self.host = make_pool(rng, 32, **options)
        self.old = [int(s) for s in rng.permutation(np.arange(8, 32))[:LENGTH]]  # device slots before
        self.tokens = [int(t) for t in rng.integers(0, 50000, LENGTH)]
        write_request(self.device, self.old, self.tokens)
        self.host_slots = list(range(17, 17 + LENGTH))
        self.page_table = list(range(44, 44 + LENGTH))  # where the reload must land (whole pages)

    def digest(self, ctx, slots) -> HandoffDigest:
        out = np.zeros(1, np.int64)
        table = runs(slots)
        compute_handoff_digest(
            context=ctx, slot_indices=table[0], run_offsets=table[1], out_digests=out, backend=self.backend
        )
        return HandoffDigest(signature=HandoffSignature.of(ctx), digests=out)

    def offload(self) -> HandoffDigest:
        self.sent = self.digest(self.device, self.old)
        copy_kv(self.device, self.old, self.host, self.host_slots)
        pack = np.zeros((LENGTH, 32), np.uint8)
        gather_canary_records(context=self.device, slot_indices=i64(self.old), out_records=pack, backend=self.backend)
        scatter_canary_records(context=self.host, records=pack, slot_indices=i64(self.host_slots), backend=self.backend)
        return self.sent

    def check(self, ctx, slots) -> set[tuple[int, int]]:
        """(slot, bits) of the rows the records check of ``slots`` (one run from position 0) records."""
        before = int(ctx.violation_write_index[0])
        table = runs(slots)
        verify_canary_records(
            context=ctx,
            slot_indices=table[0],
            run_offsets=table[1],
            run_start_positions=table[2],
            run_prev_slots=table[3],
            backend=self.backend,
        )
        return {(row[1], row[7]) for row in ring(ctx)[before:]}

    def reload(self, *, host_slots=None, device_slots=None, records=True, kv=True) -> None:
        host_slots = self.host_slots if host_slots is None else host_slots
        device_slots = self.page_table if device_slots is None else device_slots
        if kv:
            copy_kv(self.host, host_slots, self.device, device_slots)
        if records:
            pack = np.zeros((len(host_slots), 32), np.uint8)
            gather = dict(slot_indices=i64(host_slots), out_records=pack, backend=self.backend)
            gather_canary_records(context=self.host, **gather)
            scatter = dict(records=pack, slot_indices=i64(device_slots), backend=self.backend)
            scatter_canary_records(context=self.device, **scatter)

    def landed(self) -> tuple[set, np.ndarray]:
        """The landing check of the page table's slots, and the digest comparison (a mask)."""
        rows = self.check(self.device, self.page_table)
        return rows, check_handoff_digest(self.sent, self.digest(self.device, self.page_table), on_mismatch="miss")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_clean_round_trip_is_silent(backend):
    scene = Scene(backend)
    scene.offload()
    assert scene.check(scene.host, scene.host_slots) == set()
    scene.reload()
    assert scene.landed() == (set(), [True])
    assert ring(scene.device) == ring(scene.host) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_bit_flip_in_host_kv(backend):
    scene = Scene(backend)
    scene.offload()
    slot = scene.host_slots[5]
    scene.host.real_kv_sources[1].bytes_view()[slot // PAGE, (slot % PAGE) * 32 + 20] ^= 0x10
    assert scene.check(scene.host, scene.host_slots) == {(slot, 4)}
    scene.reload()
    rows, intact = scene.landed()
    assert rows == {(scene.page_table[5], 4)} and intact.tolist() == [False]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_bit_flip_in_a_host_record(backend):
    scene = Scene(backend)
    scene.offload()
    slot = scene.host_slots[7]
    scene.host.canary_buf[slot, 0] ^= 1  # the token: the next record's link breaks
    assert scene.check(scene.host, scene.host_slots) == {(scene.host_slots[8], 1)}
    scene.reload()
    rows, intact = scene.landed()
    assert rows == {(scene.page_table[8], 1)} and intact.tolist() == [False]
    with pytest.raises(KvCanaryError) as caught:
        check_handoff_digest(scene.sent, scene.digest(scene.device, scene.page_table))
    assert caught.value.code == "KVC-K012"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_stale_host_copy_reloaded(backend):
    scene = Scene(backend)
    scene.offload()  # version 1 goes to the host
    scene.tokens[3] += 1  # the request is recomputed on the device (version 2) and offloaded again ...
    write_request(scene.device, scene.old, scene.tokens)
    scene.sent = scene.digest(scene.device, scene.old)  # ... but the host copy is not rewritten
    scene.reload()
    rows, intact = scene.landed()
    assert rows == set()  # version 1 is a valid chain of its own content: only the digest knows
    assert intact.tolist() == [False]


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_pages_swapped(backend):
    scene = Scene(backend)
    scene.offload()
    pages = [scene.page_table[i : i + PAGE] for i in range(0, LENGTH, PAGE)]
    scene.reload(device_slots=pages[1] + pages[0] + pages[2])  # KV and records land together, pages swapped
    rows, intact = scene.landed()
    # Each slot of the two pages holds another position; the third page's first link breaks too.
    assert {slot for slot, bits in rows if bits & 2} == set(pages[0] + pages[1])
    assert {slot for slot, _ in rows} - set(pages[0] + pages[1]) == {pages[2][0]}
    assert intact.tolist() == [False]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_page_missing(backend):
    scene = Scene(backend)
    scene.offload()
    keep = list(range(0, 4)) + list(range(8, 12))  # the middle page never comes back
    scene.reload(host_slots=[scene.host_slots[i] for i in keep], device_slots=[scene.page_table[i] for i in keep])
    rows, intact = scene.landed()
    missing = set(scene.page_table[4:8])
    assert missing <= {slot for slot, _ in rows} and intact.tolist() == [False]


@pytest.mark.parametrize("backend", BACKENDS)
def test_records_not_moved_with_their_kv(backend):
    scene = Scene(backend)
    write_request(scene.device, scene.page_table, list(range(LENGTH)))  # what the slots held before
    scene.offload()
    scene.reload(records=False)
    rows, intact = scene.landed()
    assert {slot for slot, _ in rows} == set(scene.page_table) and intact.tolist() == [False]
    assert all(bits & 4 for _, bits in rows)  # the old records do not fingerprint the new KV


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_reload_into_slots_other_than_the_page_table_says(backend):
    scene = Scene(backend)
    scene.offload()
    wrong = list(scene.page_table)
    wrong[9] = 60  # the allocator handed out 60, the page table says page_table[9]
    scene.reload(device_slots=wrong)
    rows, intact = scene.landed()
    assert scene.page_table[9] in {slot for slot, _ in rows} and intact.tolist() == [False]
