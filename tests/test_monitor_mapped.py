"""The mapped readback (``monitor/mapped.py``): the publish kernel writes the status block into host
memory behind a sequence number; the host reads the newest complete publish, never a torn one,
and waits only for a publish two steps old.

The kernel and the readback run under the simulator (and the GPU); the host logic also runs against
a stand-in publisher that holds publishes back like a device running behind.
"""

from __future__ import annotations

import numpy as np
import pytest
import test_monitor
from monitor_helpers import DECODE, PREFILL, Driver, LaggingPublisher, late_write_readback

from kvcanary_numba.launch.publish import StatusPublisher
from kvcanary_numba.monitor import mapped
from kvcanary_numba.monitor import monitor as monitor_module
from kvcanary_numba.monitor.mapped import MappedReadback
from kvcanary_numba.monitor.status import StatusBlock


def _read(snapshot):
    return None if snapshot is None else (snapshot.step, snapshot.write_index)


def _lagging(monkeypatch):
    block = StatusBlock(np, 1)
    publisher = LaggingPublisher(block.words)
    synced = []
    monkeypatch.setattr(mapped, "SPIN_S", 0.0)
    rb = MappedReadback(block, publisher=publisher, synchronize=lambda: (synced.append(1), publisher.run(99)))
    return block, publisher, rb, synced


def _push(block, rb, step: int):
    block.words[0] = 100 + step  # the write index of this step
    return _read(rb.push(step))


def test_one_step_behind_each_push_returns_the_previous_step_and_never_waits(monkeypatch):
    block, publisher, rb, synced = _lagging(monkeypatch)
    assert _push(block, rb, 0) is None  # step 0's publish has not run
    for step in range(1, 5):
        publisher.run()  # the previous step's publish runs while the host issues this one
        assert _push(block, rb, step) == (step - 1, 100 + step - 1)
    publisher.run()
    assert _read(rb.flush()) == (4, 104) and synced == []
    assert rb.flush() is None  # nothing new


def test_a_device_two_steps_behind_is_waited_for(monkeypatch):
    block, publisher, rb, synced = _lagging(monkeypatch)
    assert _push(block, rb, 0) is None
    assert _push(block, rb, 1) is None  # step 0's publish may still run: one step of lag is free
    assert _push(block, rb, 2) == (2, 102)  # step 0's is two steps old: waited for (here: every one ran)
    assert synced == [1]


def test_the_newest_complete_publish_supersedes_older_ones(monkeypatch):
    block, publisher, rb, _ = _lagging(monkeypatch)
    _push(block, rb, 0)
    _push(block, rb, 1)
    publisher.run(2)
    assert _push(block, rb, 2) == (1, 101)  # step 0's snapshot is older: skipped, not returned later
    publisher.run()
    assert _read(rb.flush()) == (2, 102)


def test_a_publish_being_written_is_not_read(monkeypatch):
    block, publisher, rb, _ = _lagging(monkeypatch)
    _push(block, rb, 0)
    publisher.run()
    publisher.host[0] = -2  # publish 2 started: the words may be half old, half new
    assert _push(block, rb, 1) is None
    publisher.run()  # publish 2 completes
    assert _read(rb.flush()) == (1, 101)


class _RewrittenWhileRead(np.ndarray):
    """A buffer whose sequence word changes between the two reads of one ``_try_read``."""

    reads = 0

    def __getitem__(self, key):
        if key == 0:
            type(self).reads += 1
            return np.int64(1 if type(self).reads == 1 else 2)
        return super().__getitem__(key)


def test_a_copy_rewritten_while_read_is_dropped(monkeypatch):
    block = StatusBlock(np, 1)
    publisher = LaggingPublisher(block.words)
    publisher.host = np.zeros(block.words.shape[0] + 1, dtype=np.int64).view(_RewrittenWhileRead)
    rb = MappedReadback(block, publisher=publisher, synchronize=lambda: None)
    assert rb._try_read() is None  # sequence 1 when the copy began, 2 after it: torn


def test_a_publish_that_never_runs_raises_after_the_stream_sync(monkeypatch):
    block = StatusBlock(np, 1)
    publisher = LaggingPublisher(block.words)
    monkeypatch.setattr(mapped, "SPIN_S", 0.0)
    rb = MappedReadback(block, publisher=publisher, synchronize=lambda: None)  # the publishes are lost
    for step in range(2):
        _push(block, rb, step)
    with pytest.raises(RuntimeError, match="publish 1 had not run"):
        _push(block, rb, 2)


# --- the kernel (simulator, GPU) ----------------------------------------------------------------


@pytest.mark.simulator
def test_publish_kernel_writes_the_words_then_the_next_sequence_number():
    from kernel_pairs import KERNEL_DEVICE, to_device, to_host

    words = to_device(np.arange(7, 14, dtype=np.int64), KERNEL_DEVICE)
    publisher = StatusPublisher(words)
    for sequence in (1, 2):
        publisher.launch()
        _synchronize(KERNEL_DEVICE)
        np.testing.assert_array_equal(np.asarray(publisher.host), [sequence, *to_host(words)])
        words[0] = 100  # the next publish copies the block as it is then
    assert int(to_host(publisher.published)[0]) == 2


def _synchronize(device: str) -> None:
    if device == "cuda":
        import cupy

        cupy.cuda.get_current_stream().synchronize()


@pytest.mark.simulator
def test_monitor_on_the_mapped_readback_reports_a_kv_flip(monkeypatch):
    """The whole monitor with its readback replaced (the simulator runs the publish kernel on the
    NumPy status block): the same rows as the host readback."""
    from kernel_pairs import KERNEL_DEVICE

    if KERNEL_DEVICE == "cuda":
        pytest.skip("a NumPy monitor: its publishes run only under the simulator")
    monkeypatch.setattr(monitor_module, "HostReadback", MappedReadback)
    d = Driver()
    assert isinstance(d.monitor.readback, MappedReadback)
    d.step(PREFILL)
    d.k[4, 5] ^= 0x10
    d.step(DECODE)
    assert d.rows() == [("TAIL_K_FULL", 4, 1, ("verify_real_kv_hash",))]
    assert d.monitor.stats()["kernel_runs"] == 16


@pytest.mark.gpu
def test_gpu_each_publish_reads_the_block_after_its_step_s_launches():
    import cupy

    block = StatusBlock(cupy, 1)
    seen = late_write_readback(MappedReadback(block), block)
    assert seen[-1][0] == 5 and [index for _, index in seen] == [100 + step for step, _ in seen]


@pytest.mark.gpu
def test_gpu_monitor_on_the_mapped_readback_is_at_most_one_step_late_and_flush_catches_up(monkeypatch):
    monkeypatch.setattr(mapped, "MAPPED_STATUS", True)
    d = test_monitor.gpu_flip_between_two_steps()
    flip = [("SWEEP_K_FULL", 4, 1, ("verify_real_kv_hash",))]
    # Unlike the copy readback, step 1's end_step reads step 1's own publish when it has already run.
    assert d.rows() in ([], flip)
    d.monitor.flush()
    assert d.rows() == flip and d.monitor.violations[0].step == 1


@pytest.mark.parametrize("switch", [False, True])
@pytest.mark.parametrize("in_order", [False, True], ids=["aarch64", "x86-64"])
def test_the_mapped_readback_is_chosen_only_when_switched_on_for_an_x86_host(monkeypatch, switch, in_order):
    chosen = []
    monkeypatch.setattr(mapped, "MAPPED_STATUS", switch)
    monkeypatch.setattr(mapped, "IN_ORDER_LOADS", in_order)
    monkeypatch.setattr(mapped, "MappedReadback", lambda block: chosen.append("mapped"))
    monkeypatch.setattr(mapped, "CudaReadback", lambda block: chosen.append("copy"))
    mapped.gpu_readback(StatusBlock(np, 1))
    assert chosen == ["mapped" if switch and in_order else "copy"]
