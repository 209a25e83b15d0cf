"""The status copy captured into the TAIL graph (``readback.GRAPH_STATUS_COPY``), on a CPU.

A replayed step's TAIL graph ends with the DtoH copy of the status block into the host buffer of
the step's parity; ``end_step`` then only queries that copy's event. Here the graph's copy is the
fake runtime's ``memcpyAsync`` issued where the graph would run it (``capture_copy``), so the order
of copies, events, waits and snapshots is what is checked; the capture itself needs a GPU
(``tests/test_monitor*.py -m gpu`` with ``KVCANARY_GRAPH_STATUS_COPY=1``).
"""

from __future__ import annotations

import types

import numpy as np
import pytest
from test_monitor_host_step import _readback

from benchmarks.host_step import decode_monitor, stub_launches
from kvcanary_numba.monitor import readback as readback_module
from kvcanary_numba.monitor.capture import CapturedStep
from kvcanary_numba.monitor.fastpath import _ROLE_FIELDS


@pytest.fixture(autouse=True)
def no_libcuda_record(monkeypatch):
    """The fake runtime's handles must never reach libcuda (a GPU machine has it): the graphs'
    external event records are off unless a test fakes them."""
    monkeypatch.setattr(readback_module, "external_record", lambda: None)


def _graph_step(block, rb, step: int, value: int):
    """The TAIL graph of ``step`` replayed: status words written, its copy, then its event."""
    block.words[0] = value
    rb.free_for_graph(step)
    rb.capture_copy(7, step & 1)  # the graph's memcpy node, on the compute stream
    rb.graph_copied(step)


def _read(snapshot):
    return None if snapshot is None else (snapshot.step, snapshot.write_index)


def test_graph_copies_return_this_steps_snapshot_with_one_query_and_no_side_stream():
    block, runtime, rb = _readback(deferred=False)
    got = []
    for step in range(4):
        _graph_step(block, rb, step, 10 + step)
        got.append(_read(rb.push(step)))
    assert got == [(0, 10), (1, 11), (2, 12), (3, 13)]  # the copy was done by end_step: this step's
    # Per step the graph's copy and one event record on the compute stream, one query: no wait, no side stream.
    assert runtime.calls == {"memcpyAsync": 4, "eventRecord": 4, "eventQuery": 4}
    assert runtime.synchronized == []


def test_a_graph_copy_behind_waits_only_for_the_buffer_it_reuses():
    block, runtime, rb = _readback(deferred=True)
    _graph_step(block, rb, 0, 10)
    assert rb.push(0) is None
    _graph_step(block, rb, 1, 11)
    assert rb.push(1) is None and runtime.synchronized == []
    # Step 2 copies into buffer 0 again: step 0's copy is waited for (and read) before the graph runs.
    _graph_step(block, rb, 2, 12)
    assert runtime.synchronized == [rb._buffers[0][1]]
    assert _read(rb.push(2)) == (0, 10)
    runtime.finish()
    _graph_step(block, rb, 3, 13)  # buffer 1: steps 1 and 2 are done, nothing is waited for
    assert len(runtime.synchronized) == 1
    assert _read(rb.push(3)) == (2, 12)
    runtime.finish()
    assert _read(rb.flush()) == (3, 13)


def test_a_step_that_sweeps_copies_again_after_the_sweep():
    block, runtime, rb = _readback(deferred=False)
    _graph_step(block, rb, 0, 10)
    block.words[0] = 20  # the sweep in end_step writes status words after the graph's copy
    assert rb.push(0, swept=True) is None  # the graph's entry is dropped, today's copy issued
    assert runtime.calls["streamWaitEvent"] == 1
    _graph_step(block, rb, 1, 21)
    assert [_read(rb.push(1)), _read(rb.flush())] == [(1, 21), None]
    block2, _, rb2 = _readback(deferred=True)
    _graph_step(block2, rb2, 0, 10)
    block2.words[0] = 20
    rb2.push(0, swept=True)
    assert _read(rb2.flush()) == (0, 20)  # the copy after the sweep, not the graph's


def test_a_monitor_replaying_graphs_that_copy_reads_every_step_back(monkeypatch):
    w, _ = decode_monitor(requests=3, prefix=4)
    m = w.monitor
    restore = stub_launches()
    try:
        block, runtime, rb = _readback(deferred=False, block=m.status)
        m.readback = m.pump.readback = rb
        graph = CapturedStep.__new__(CapturedStep)
        graph.batch, graph._captured, graph.replays, graph.monitor = w.batch, _ROLE_FIELDS(w.batch), 0, m
        graph.head = types.SimpleNamespace(launch=lambda: None)
        graph.tails = [types.SimpleNamespace(launch=lambda i=i: rb.capture_copy(7, i)) for i in (0, 1)]
        m.graph = graph
        pushed = []
        monkeypatch.setattr(rb, "push", lambda step, swept=False, _push=rb.push: pushed.append(
            _read(_push(step, swept))) or None)  # the monitor sees nothing: this test reads the snapshots
        for _ in range(3):
            m.pre_forward(w.batch)
            m.post_forward()
            m.end_step()
    finally:
        restore()
    assert graph.replays == 3 and [s for s, _ in pushed] == [0, 1, 2]
    assert "streamWaitEvent" not in runtime.calls and runtime.calls["memcpyAsync"] == 3
    assert np.array_equal(rb._host[0][:1], m.status.words[:1])


def test_an_external_record_in_the_graph_replaces_the_record_after_its_launch(monkeypatch):
    block, runtime, rb = _readback(deferred=True)
    nodes = []

    def record(event, stream, flags):  # the graph's event-record node, run where the graph runs it
        nodes.append((event, stream, flags))
        runtime.eventRecord(event, stream)
        return 0

    monkeypatch.setattr(readback_module, "external_record", lambda: record)
    for step in range(3):
        _graph_step(block, rb, step, 10 + step)
        rb.push(step)
    assert nodes == [(rb._buffers[s & 1][1], 7, 1) for s in range(3)]  # external (flag 1), on the capture stream
    assert runtime.calls["eventRecord"] == 3  # the nodes' records only: none after a graph launch
    runtime.finish()
    assert _read(rb.flush()) == (2, 12)
