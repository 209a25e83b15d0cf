"""Host-only micro-benchmark of the monitor's per-step Python work, launches stubbed (no GPU needed).

The monitor runs on NumPy arrays with the kernel backend (``backend="cuda"``)
under Numba's CUDA simulator, so its prepared steps (``prepared=True``,
:class:`~kvcanary_numba.fast.steps.PreparedSteps`) record the real phases of
the decode case (256 requests x 1 token, FULL pool, K and V: 6 launches per
step, 2 plan and per phase one verify and one write for K and V together; 10
before the endpoint launches of ``launch/endpoints.py``). Launches, two ways
(``--driver``):

``stub``
    Every :class:`~kvcanary_numba.fast.prepared.PreparedLaunch` launch is
    replaced by the host work a raw launch does before its driver call (the
    stream lookup): the Python work *outside* the launch calls.
``fake``
    The phases' launches are made raw (fake handles and parameter arrays) and
    run the real launch path -- the phase's launch table, compiled (``--loop
    compiled``) or each launch through cuda-bindings (``--loop python``) --
    against a do-nothing ``libcuda.so.1`` (:mod:`benchmarks.fake_driver`, built
    with the C compiler): the Python work of the whole step but the driver's.
    With ``--loop compiled`` the readback's calls are compiled too and reach
    the fake's functions; with ``--loop python`` they go to :class:`NullRuntime`
    (Python no-ops: CuPy's wrappers and cudart's layer are not counted).
``--path eager`` times the eager GPU path instead (``prepared=False``: the step plan's public
plan call and endpoint glue every step, ``fast/endpoints.py``) with the launch layer as
on a GPU (:func:`benchmarks.fake_launch.gpu_launch_layer`: packing, eager refills, memo
replay) and every raw launch stubbed as above (``stub`` only).
``end_step`` runs the GPU readback (:class:`~kvcanary_numba.monitor.readback.CudaReadback`)
against a runtime whose calls do nothing (:class:`NullRuntime`; :class:`FakeRuntime`,
which copies and can hold copies back, is for tests).

Usage::

    NUMBA_ENABLE_CUDASIM=1 python -m benchmarks.host_step [--steps N] [--prefix P] [--driver fake] [--path eager]

Prints, for the prepared path and for graph replay (graphs stubbed too), or for the
eager path, the median / min µs per step of pre_forward + post_forward and of end_step.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time
import types

import numpy as np

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")  # before numba is imported

from kvcanary_numba import RealKvHashMode  # noqa: E402
from kvcanary_numba.fast.capture import CapturedStep  # noqa: E402
from kvcanary_numba.fast.prepared import PreparedLaunch  # noqa: E402
from kvcanary_numba.launch._launch import current_stream  # noqa: E402

from .fake_runtime import FakeRuntime, NullRuntime, fake_cuda_readback  # noqa: E402

__all__ = [
    "FakeRuntime",
    "NullRuntime",
    "decode_monitor",
    "fake_cuda_readback",
    "raw_phases",
    "stub_launches",
    "time_steps",
]


def stub_launches():
    """Replace PreparedLaunch.launch by a raw launch's host work without its driver call; returns a restorer."""
    original = PreparedLaunch.launch

    def launch(self, stream=None):
        current_stream() if stream is None else int(stream)

    PreparedLaunch.launch = launch
    return lambda: setattr(PreparedLaunch, "launch", original)


def raw_phases(m, *, compiled: bool) -> int:
    """Make every prepared launch of ``m``'s phases raw on the process's driver (fake handles and
    parameter arrays: the fake libcuda reads neither) and rebuild the phases' launch tables;
    returns the number of launches. ``compiled``: whether the tables run the compiled loop."""
    from cuda.bindings import driver as cu

    from kvcanary_numba.fast import driver as _driver

    try:
        from kvcanary_numba.fast.table import LaunchTable
    except ImportError:  # an older tree (no launch tables): its phases loop over their launches
        LaunchTable = None  # noqa: N806

    drv, count = _driver.driver, 0
    for phases in m.fast.phase_pairs:
        for phase in phases:
            for p in phase.launches:
                count += 1
                p.handle = cu.CUfunction(0x1000 + count)
                drv.select(p.handle)
                p._pointers = (ctypes.c_void_p * 1)()
                p._func, p._params = drv.func_arg(p.handle), drv.params_arg(ctypes.addressof(p._pointers))
                p.raw = True
            if LaunchTable is None:
                assert not compiled, "this tree has no compiled launch loop"
                continue
            native, drv.native = getattr(drv, "native", None), drv.native if compiled else None
            phase.table = LaunchTable(phase.launches)
            drv.native = native
            assert phase.table.compiled == compiled, "the compiled loop is not available here"
    return count


def decode_monitor(*, requests: int = 256, prefix: int = 4096, prepared: bool = True):
    """The decode case's monitor on NumPy, GPU readback faked; (workload, runtime). The kernel glue
    runs on NumPy arrays (simulator), so the prepared steps (``prepared``) record real phases."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks.workloads import MonitorWorkload

    w = MonitorWorkload(
        np, requests=requests, prefix=prefix, extend=1, mode=RealKvHashMode.PARTIAL, backend="cuda", prepared=prepared
    )
    w.fill(w.batch, w.length, w.extend)
    m = w.monitor
    for lanes in m.status.plan_lanes:
        lanes[0] = 1  # each plan "ran" (enable = 1): no overflow warning per step
    runtime = NullRuntime()
    m.readback = m.pump.readback = fake_cuda_readback(m.status, runtime)
    return w, runtime


def time_steps(m, batch, steps: int) -> dict:
    """Median / min µs of pre_forward + post_forward and of end_step over ``steps`` steps."""
    launch, end = [], []
    clock = time.perf_counter
    for i in range(steps + 5):
        t0 = clock()
        m.pre_forward(batch)
        t1 = clock()
        t2 = clock()
        m.post_forward()
        t3 = clock()
        m.end_step()
        t4 = clock()
        if i >= 5:
            launch.append((t1 - t0 + t3 - t2) * 1e6)
            end.append((t4 - t3) * 1e6)
    return {name: (statistics.median(v), min(v)) for name, v in (("pre+post", launch), ("end_step", end))}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--prefix", type=int, default=4096)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--driver", choices=("stub", "fake"), default="stub")
    parser.add_argument("--loop", choices=("compiled", "python"), default="compiled")
    parser.add_argument("--path", choices=("prepared", "eager"), default="prepared")
    args = parser.parse_args(argv)
    if args.path == "eager":
        if args.driver != "stub":
            parser.error("--path eager runs with --driver stub only")
        eager(args)
        return
    fake = None
    if args.driver == "fake":
        from benchmarks import fake_driver

        fake = fake_driver.load()  # before cuda-bindings first calls the driver
    w, _ = decode_monitor(requests=args.requests, prefix=args.prefix)
    m = w.monitor
    restore = stub_launches()
    if fake is not None:
        m.pre_forward(w.batch)  # records the phases (stubbed: the simulator would run the kernels)
        m.post_forward()
        m.end_step()
        restore()
        restore = lambda: None  # noqa: E731
        raw_phases(m, compiled=args.loop == "compiled")
        if args.loop == "compiled":  # the readback's driver calls from compiled code, on the fake too
            from kvcanary_numba.fast import driver as _driver, native as _native

            functions = _driver.libcuda_functions(_native.READBACK_FUNCTIONS)
            m.readback = m.pump.readback = fake_cuda_readback(m.status, NullRuntime(), functions=functions)
            assert m.readback.native is not None, "the compiled readback is not available here"
    try:
        before = None if fake is None else fake.launches()
        results = {"prepared": time_steps(m, w.batch, args.steps)}
        if fake is not None:
            per_step = (fake.launches() - before) / (args.steps + 5)
            print(
                f"fake driver: {per_step:g} cuLaunchKernel calls per step ({args.loop} loop), "
                f"{fake.readback_calls() / (args.steps + 5):.3g} readback calls per step"
            )
        # Graph replay: a CapturedStep (its batch check runs) over two stand-in graphs whose launch
        # does nothing (the replay path's Python only).
        stand_in = types.SimpleNamespace(launch=lambda: None)
        graph = CapturedStep(w.batch, stand_in, stand_in, roles=m.fast.batch_roles)
        m.graph = graph
        results["graph replay"] = time_steps(m, w.batch, args.steps)
        m.graph = None
    finally:
        restore()
    launches = sum(len(p.launches) for phases in m.fast.phase_pairs for p in phases)
    how = "stubbed" if fake is None else f"fake driver, {args.loop} loop"
    print(f"decode {args.requests} x 1, prefix {args.prefix}: {launches} prepared launches per step ({how})")
    for path, result in results.items():
        for name, (median, low) in result.items():
            print(f"  {path:<13} {name:<9} median {median:7.2f} us   min {low:7.2f} us")


def eager(args) -> None:
    """``--path eager``: the eager GPU path's host time (see the module docstring)."""
    from .fake_launch import gpu_launch_layer

    w, _ = decode_monitor(requests=args.requests, prefix=args.prefix, prepared=False)
    m = w.monitor
    restore_layer = gpu_launch_layer()
    restore = stub_launches()
    stub, calls = PreparedLaunch.launch, [0]

    def counted(self, stream=None):  # eager, packing and replayed launches alike end here
        calls[0] += 1
        stub(self, stream)

    PreparedLaunch.launch = counted
    try:
        result = time_steps(m, w.batch, args.steps)
    finally:
        restore()
        restore_layer()
    per_step = calls[0] / (args.steps + 5)
    print(
        f"decode {args.requests} x 1, prefix {args.prefix}: eager path, launch layer as on a GPU, "
        f"{per_step:g} raw launches per step (stubbed)"
    )
    for name, (median, low) in result.items():
        print(f"  {'eager':<13} {name:<9} median {median:7.2f} us   min {low:7.2f} us")


if __name__ == "__main__":
    main()
