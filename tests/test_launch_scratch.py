"""Launch scratch during CUDA-graph capture (``fast/scratch.py``): the first call of a size class
on a capturing stream is refused with KVC-C015 naming the public call, before anything is
allocated or written; a call whose scratch exists captures as any other. The simulator tests
stand in for the capture with a patched ``stream_capturing``; the GPU test captures for real."""

from __future__ import annotations

import numpy as np
import pytest
from canary_helpers import HEAD, make_context, run_write, stamp, write_plan
from kernel_pairs import KERNEL_DEVICE, run_pair, to_device, to_host

from kvcanary_numba import KvCanaryError, launch_canary_write_kernel
from kvcanary_numba.fast import chain as chain_glue, scratch

LENGTHS = [40, 24]
SEEDS = [90, -1]
TOKENS = list(range(500, 564))
POSITIONS = list(range(3, 43)) + list(range(24))
SLOTS = list(range(1, 65))


def _context():
    ctx = make_context(128, ring_capacity=64)
    stamp(ctx, 90, 7, 2, HEAD)
    return ctx


#: Every fresh scratch table a test used, kept for the process: launches packed by the memo still
#: name its arrays after the test (launch scratch is never freed, and a test must not free it either).
_USED_SCRATCH: list[dict] = []


@pytest.fixture
def long_writes_publish(monkeypatch):
    """Fresh scratch for this test, and these writes long enough to publish their own chain."""
    fresh: dict = {}
    _USED_SCRATCH.append(fresh)
    monkeypatch.setattr(scratch.STREAM_SCRATCH, "_arrays", fresh)
    monkeypatch.setattr(chain_glue, "OWN_TILED_MIN_TOKENS", 8)


def _kernel_write(ctx, args: dict | None = None):
    """The write on the kernels; ``args`` (from :func:`_write_kwargs` on the context's device) default
    to :func:`_write_kwargs` copied to ``KERNEL_DEVICE`` (where :func:`to_device` put ``ctx``)."""
    if args is None:
        args = {name: to_device(value, KERNEL_DEVICE) for name, value in _write_kwargs().items()}
    launch_canary_write_kernel(context=ctx, backend="cuda", **args)


@pytest.mark.simulator
def test_first_allocation_while_capturing_is_coded(monkeypatch, long_writes_publish):
    monkeypatch.setattr(scratch, "stream_capturing", lambda stream: True)
    ctx = to_device(_context(), KERNEL_DEVICE)
    before = to_host(ctx.canary_buf).copy()
    with pytest.raises(KvCanaryError) as info:
        _kernel_write(ctx)
    assert info.value.code == "KVC-C015"
    message = str(info.value)
    assert message.startswith("launch_canary_write_kernel: published=")
    assert "capturing a CUDA graph" in message and "before the capture" in message
    np.testing.assert_array_equal(to_host(ctx.canary_buf), before)  # refused before any launch
    assert int(to_host(ctx.violation_write_index)[0]) == 0


@pytest.mark.simulator
def test_scratch_allocated_before_the_capture_is_reused(monkeypatch, long_writes_publish):
    # The warm-up contract: one call of the same sizes before capturing, then the call captures.
    run_pair(_context(), "write", **_write_kwargs())
    assert {"published", "published_seeds"} <= {key[0] for key in scratch.STREAM_SCRATCH.arrays(0)}
    monkeypatch.setattr(scratch, "stream_capturing", lambda stream: True)
    run_pair(_context(), "write", **_write_kwargs())  # allocates nothing, records equal the reference


@pytest.mark.simulator
def test_allocation_outside_a_capture_asks_once(monkeypatch, long_writes_publish):
    asked = []
    monkeypatch.setattr(scratch, "stream_capturing", lambda stream: asked.append(stream) or False)
    first = scratch.STREAM_SCRATCH.zeros("probe", (3,), np.int64, 0)
    assert scratch.STREAM_SCRATCH.zeros("probe", (3,), np.int64, 0) is first
    assert asked == [0]  # the driver is asked before an allocation only, never on a hit


def _write_kwargs() -> dict:
    from canary_helpers import write_args

    return write_args(write_plan(LENGTHS, SEEDS), TOKENS, POSITIONS, SLOTS)


@pytest.mark.gpu
def test_gpu_capture_refuses_then_captures_after_a_warm_up(monkeypatch):
    import cupy

    monkeypatch.setattr(chain_glue, "OWN_TILED_MIN_TOKENS", 8)
    reference = _context()
    for _ in range(2):
        run_write(reference, write_plan(LENGTHS, SEEDS), TOKENS, POSITIONS, SLOTS)
    ctx = to_device(_context(), "cuda")
    # Copied to the GPU before any capture: a host-to-device copy inside one would end it.
    args = {name: to_device(value, "cuda") for name, value in _write_kwargs().items()}
    marker = cupy.zeros(1, dtype=cupy.int64)
    marker += 1  # its kernel is loaded before any capture
    # The marker's two kernels ran on the legacy stream, which a non-blocking stream does not wait
    # for: without this, the graph's increment can race them on a busy GPU and the marker end at 1.
    cupy.cuda.Device().synchronize()
    # A stream no call has used: no scratch yet. CUDA may hand a new stream the handle of one that
    # ended, whose scratch is still kept under that handle: then take another (the others stay alive).
    streams = [cupy.cuda.Stream(non_blocking=True)]
    while scratch.STREAM_SCRATCH.arrays(streams[-1].ptr):
        streams.append(cupy.cuda.Stream(non_blocking=True))
    stream = streams[-1]
    with stream:
        stream.begin_capture()
        try:
            marker += 1  # one node whatever the refused call does (an empty graph is not the point)
            with pytest.raises(KvCanaryError) as info:
                _kernel_write(ctx, args)
        finally:
            stream.end_capture().launch(stream)  # the refusal left the capture valid: it instantiates and runs
    stream.synchronize()
    assert info.value.code == "KVC-C015", str(info.value)
    assert int(marker[0]) == 2, _marker_diagnosis(marker, stream)
    with stream:
        _kernel_write(ctx, args)  # warm-up: allocates this stream's scratch
        stream.begin_capture()
        try:
            _kernel_write(ctx, args)
        finally:
            graph = stream.end_capture()
        graph.launch(stream)
    stream.synchronize()
    np.testing.assert_array_equal(to_host(ctx.canary_buf), reference.canary_buf)
    np.testing.assert_array_equal(to_host(ctx.violation_write_index), reference.violation_write_index)


def _marker_diagnosis(marker, stream) -> str:
    """What a failure of the capture test should say: whether the marker's memory is inside any
    cached launch scratch array, and which streams hold scratch (this test once failed on a busy
    H100 because its marker raced the capture stream; NOTES.md)."""
    import cupy

    pointer, inside = marker.data.ptr, []
    for key, arrays in scratch.STREAM_SCRATCH._arrays.items():
        for name, array in arrays.items():
            start = int(array.__cuda_array_interface__["data"][0])
            if start <= pointer < start + array.nbytes:
                inside.append((key, name))
    # A key's lane is a stream handle or a monitor's ("owner", token): only the handles sort.
    handles = sorted(
        {lane for (_, lane), arrays in scratch.STREAM_SCRATCH._arrays.items() if isinstance(lane, int) and arrays}
    )
    cupy.cuda.Device().synchronize()
    return (
        f"marker {int(marker[0])} at {pointer:#x}, inside scratch {inside or 'none'}; "
        f"capture stream {stream.ptr:#x}; streams with scratch {[hex(h) for h in handles]}"
    )


@pytest.fixture
def fresh_lookup():
    """libcuda's function is looked up once per process: forget it around a test that fakes libcuda."""
    scratch._is_capturing_function.cache_clear()
    yield
    scratch._is_capturing_function.cache_clear()


class _FakeLibcuda:
    """``cuStreamIsCapturing`` answering (result, capture status) for the stream it is asked about."""

    def __init__(self, result: int, status: int):
        self.asked = []

        def is_capturing(stream, status_out):
            self.asked.append(stream.value)
            status_out._obj.value = status
            return result

        self.cuStreamIsCapturing = is_capturing


@pytest.mark.parametrize(
    ("result", "status", "capturing"),
    [(0, 0, False), (0, 1, True), (0, 2, True), (906, 0, True), (900, 0, True), (201, 0, False)],
    ids=["idle", "active", "invalidated", "implicit-global-capture", "unsupported", "no-context"],
)
def test_capture_status_decoding(monkeypatch, fresh_lookup, result, status, capturing):
    # CUDA_SUCCESS with a status, or a 900-908 capture error, is a capture; any other driver error
    # (no context, say) is not, and the allocation then meets the driver's own answer.
    fake = _FakeLibcuda(result, status)
    monkeypatch.setattr(scratch, "ON_SIMULATOR", False)
    monkeypatch.setattr(scratch, "libcuda_function", lambda name: getattr(fake, name))
    assert scratch.stream_capturing(0x5000) is capturing
    assert scratch.stream_capturing(0x5000) is capturing
    assert fake.asked == [0x5000] * 2  # the call's stream, not the default one
    assert scratch._is_capturing_function.cache_info().misses == 1  # libcuda opened once


def test_no_libcuda_means_not_capturing(monkeypatch, fresh_lookup):
    from kvcanary_numba.fast import driver

    def missing(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(scratch, "ON_SIMULATOR", False)
    monkeypatch.setattr(driver.ctypes, "CDLL", missing)
    assert scratch.stream_capturing(0) is False
