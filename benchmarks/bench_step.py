"""Per-step cost on a GPU: launch overhead per path, the plan -> verify -> write step,
and whole CanaryMonitor steps (decode and prefill) eager, prepared and graph-replayed.

Host time is what the CPU spends issuing the canary's launches (the device is
idle before each timed call); device time is the CUDA-event time of those
launches on the GPU (the engine's KV write in between is excluded).
``monitor step host split`` rows divide the prepared and replayed steps' host
time into the driver calls (launches; end_step's runtime calls) and everything
else, without a profiler (``benchmarks/host_step.py`` measures the latter on a CPU).
"""

from __future__ import annotations

import contextlib
import time

import numpy as np

from kvcanary_numba import (
    RealKvHashMode,
    launch_canary_plan_kernels,
    launch_canary_verify_kernel,
    launch_canary_write_kernel,
)
from kvcanary_numba.constants import CanaryLaunchTag
from kvcanary_numba.fast.capture import capture_graph
from kvcanary_numba.fast.prepared import PreparedLaunch
from kvcanary_numba.fast.recording import recording
from kvcanary_numba.fast.table import LaunchTable

from .baselines import naive_launch
from .bench_kernels import _free
from .timing import _spin, device_times, host_times, stats, synchronize
from .workloads import MonitorWorkload, plan_case, verify_case

__all__ = ["SIZES", "launch_overhead", "monitor_steps", "op_step"]

#: (bs, prefix) of the plan -> verify -> write step; (name, requests, prefix, extend) monitor cases.
SIZES = {
    "step": {"quick": (64, 256), "full": (256, 4096)},
    "monitor": {
        "quick": [("decode", 16, 256, 1), ("prefill", 2, 0, 512)],
        "full": [("decode", 256, 4096, 1), ("prefill", 8, 0, 8192)],
    },
}


def _capture(fn):
    """``fn()`` captured into a CUDA graph on a side stream; returns the graph."""
    import cupy

    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        fn()  # allocations and scratch happen outside the capture
        stream.synchronize()
        return capture_graph(stream, fn)


def launch_overhead(run) -> None:
    """Host µs per launch of one verify kernel (empty plan: the device work is ~nothing).

    Paths: Numba's dispatcher on the caller's CuPy arrays; the public call (validated, memo
    replay); the core's launch glue with the fast wing's raw eager launch (what a public call
    runs the first time a snapshot is seen); the same glue through the core's launch (numba-cuda's
    public ``kernel[grid, block, stream](*args)`` on :class:`View` descriptions); a prepared
    launch (one ``cuLaunchKernel``); ten prepared launches replayed from a CUDA graph.
    """
    import cupy

    from kvcanary_numba.fast.replay import eager
    from kvcanary_numba.launch import verify as glue
    from kvcanary_numba.launch._launch import current_stream, sink

    ctx, plan, _ = verify_case(cupy, entries=1024, mode=RealKvHashMode.NONE)
    plan.enable[...] = 0  # the kernel only bumps its run counter
    kwargs = dict(context=ctx, plan=plan, check_verify_expected_token=False)
    stream = current_stream()

    def glue_eager(_):
        with sink(eager):
            glue.launch_canary_verify_kernel(**kwargs, stream=stream)

    with recording() as rec:
        launch_canary_verify_kernel(**kwargs)
    prepared = PreparedLaunch.from_spec(rec.launches[0])
    graph = _capture(lambda: [prepared.launch() for _ in range(10)])
    paths = {
        "naive numba dispatcher (CuPy args)": naive_launch(rec.launches[0]),
        "public API (validated)": lambda _: launch_canary_verify_kernel(**kwargs),
        "launch glue (no validation)": glue_eager,
        "launch glue, core launch (numba-cuda dispatcher)": lambda _: glue.launch_canary_verify_kernel(
            **kwargs, stream=stream
        ),
        "prepared (cuLaunchKernel)": lambda _: prepared.launch(),
    }
    for name, fn in paths.items():
        result = host_times(fn, iters=run.iters * 5, warmup=5, sync=synchronize)
        run.add({"op": "launch overhead", "variant": name, "launches": 1, **result, "raw": prepared.raw})
    result = host_times(lambda _: graph.launch(), iters=run.iters * 5, warmup=5, sync=synchronize)
    run.add(
        {
            "op": "launch overhead",
            "variant": "graph replay of 10 launches",
            "launches": 10,
            **result,
            "per_launch_us": round(result["median_us"] / 10, 3),
        }
    )


def op_step(run) -> None:
    """plan -> verify -> write of one decode batch (one canary endpoint): host time eager and replayed."""
    import cupy

    bs, prefix = SIZES["step"][run.mode]
    # Clean chains of prefix + 1 positions: the plan verifies [0, prefix), the write re-stamps position prefix.
    ctx, _, meta = verify_case(cupy, entries=bs * (prefix + 1), mode=RealKvHashMode.PARTIAL, chain_len=prefix + 1)
    plan_kwargs = plan_case(cupy, bs=bs, prefix=prefix, slots=meta["slots"])
    column = lambda a: cupy.asarray(np.ascontiguousarray(a[:, prefix]))  # noqa: E731
    inputs = dict(
        input_ids=column(meta["tokens"]),
        positions=cupy.full(bs, prefix, dtype=np.int64),
        out_cache_loc=column(meta["slots"]),
        enable_write_input_assert=False,
        expected_input_tokens=None,
        expected_input_positions=None,
    )
    vplan, wplan = plan_kwargs["verify_plan_out"], plan_kwargs["write_plan_out"]
    ctx = ctx.replace(kernel_kind=CanaryLaunchTag.HEAD_K_FULL)

    def eager(_=None):
        launch_canary_plan_kernels(**plan_kwargs)
        launch_canary_verify_kernel(context=ctx, plan=vplan, check_verify_expected_token=False)
        launch_canary_write_kernel(context=ctx, plan=wplan, **inputs)

    with recording() as rec:
        eager()
    prepared = [PreparedLaunch.from_spec(spec) for spec in rec.launches]

    def fast(_=None):
        for launch in prepared:
            launch.launch()

    graph = _capture(fast)
    for name, fn in (("eager (public API)", eager), ("prepared", fast), ("graph replay", lambda _: graph.launch())):
        result = host_times(fn, iters=run.iters * 2, warmup=3, sync=synchronize)
        run.add(
            {
                "op": "step plan+verify+write host",
                "variant": name,
                "bs": bs,
                "prefix": prefix,
                "launches": len(prepared),
                **result,
            }
        )
    rows = int(ctx.violation_write_index.get()[0])
    run.add(
        {
            "op": "step plan+verify+write device",
            "variant": "prepared",
            "bs": bs,
            "prefix": prefix,
            **device_times(fast, iters=run.iters, host_us=60),
            "rows": rows,
        }
    )


def _monitor_case(run, name: str, requests: int, prefix: int, extend: int) -> None:
    # Re-check after the monitor composition merge: the eager path is ``m.fast = None`` and the
    # graph is released by ``m.graph = None`` (monitor attributes, not public API).
    import cupy

    w = MonitorWorkload(cupy, requests=requests, prefix=prefix, extend=extend, mode=RealKvHashMode.PARTIAL)
    w.prefill()
    w.fill(w.batch, w.length, w.extend)  # the repeated (idempotent) step
    m, fast = w.monitor, w.monitor.fast
    for path in ("eager (public API)", "prepared", "graph replay"):

        def body(path=path):
            try:
                m.fast = None if path.startswith("eager") else fast
                if path == "graph replay":
                    m.capture_graph(w.batch)
                _monitor_path(run, w, f"{name} {path}", spin_us=4000 if path.startswith("eager") else 1500)
                if not path.startswith("eager"):
                    _host_split(run, w, f"{name} {path}")
            finally:
                m.fast, m.graph = fast, None

        run.case("monitor", f"{name} {path}", body, reserve=20)


def _host_iters(run) -> int:
    # Host rows of one step move 1.5-2.5x between runs at 20 samples (H200, 2026-12-04, three
    # runs at 2e94477..d70791c: graph replay 17.9 / 44.1 / 26.2 us); a step costs ~2 ms here, so
    # three times the samples is cheap.
    return 3 * run.iters


def _monitor_path(run, w, variant: str, *, spin_us: int) -> None:
    """Host time of pre_forward + post_forward (and of end_step), device time of their launches."""
    import cupy

    m = w.monitor
    host, device, end = [], [], []
    events = [cupy.cuda.Event() for _ in range(4)]
    for i in range(3 + _host_iters(run)):
        synchronize()
        _spin(spin_us)  # the GPU stays busy while the host issues, so the events time only the GPU
        events[0].record()
        t0 = time.perf_counter()
        m.pre_forward(w.batch)
        t1 = time.perf_counter()
        events[1].record()
        w.write_kv(w.batch)
        events[2].record()
        t2 = time.perf_counter()
        m.post_forward()
        t3 = time.perf_counter()
        events[3].record()
        m.end_step()
        t4 = time.perf_counter()
        events[3].synchronize()
        if i >= 3:
            host.append((t1 - t0 + t3 - t2) * 1e6)
            end.append((t4 - t3) * 1e6)
            device.append(
                (cupy.cuda.get_elapsed_time(events[0], events[1]) + cupy.cuda.get_elapsed_time(events[2], events[3]))
                * 1e3
            )
    launches = int(sum(int(np.asarray(phase).sum()) for phase in m.phase_launches))
    rows = int(m.stats()["violations_recorded"])
    common = {
        "variant": variant,
        "bs": w.requests,
        "prefix": w.prefix,
        "extend": w.extend,
        "launches": launches,
        "rows": rows,
    }
    run.add({"op": "monitor step host", **common, **stats(host)})
    run.add({"op": "monitor step device", **common, **stats(device)})
    run.add({"op": "monitor end_step host", **common, **stats(end)})


class _Stopwatch:
    """Accumulates the time spent inside the calls it wraps (~0.1-0.2 µs of its own per call).

    A wrapped call made inside another one (a launch table looping over its launches in Python)
    is neither timed nor counted again; ``count(args)`` says how many calls one call stands for
    (a compiled launch table: its number of launches).
    """

    def __init__(self):
        self.seconds, self.calls, self._depth = 0.0, 0, 0

    def wrap(self, fn, count=None):
        clock = time.perf_counter

        def timed(*args, **kwargs):
            if self._depth:
                return fn(*args, **kwargs)
            self._depth += 1
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += clock() - t0
                self.calls += 1 if count is None else count(args)
                self._depth -= 1

        return timed

    def take(self) -> tuple[float, int]:
        """(µs, calls) since the last take."""
        out = (self.seconds * 1e6, self.calls)
        self.seconds, self.calls = 0.0, 0
        return out


class _TimedGraph:
    def __init__(self, graph, watch: _Stopwatch):
        self.graph, self.launch = graph, watch.wrap(graph.launch)


@contextlib.contextmanager
def timed_driver_calls(m, launches: _Stopwatch, runtime: _Stopwatch):
    """Within the block, monitor ``m``'s launch calls (launch tables, prepared launches, its
    graph's two launches) run under ``launches`` and its readback's runtime calls (CuPy's, or
    the compiled call standing for the usual step's five, four without a copy in flight) under
    ``runtime``. Monitor internals (its graph's phases, its readback's calls): re-check after the
    monitor composition merge."""
    original, original_table = PreparedLaunch.launch, LaunchTable.launch
    rb, graph = m.readback, m.graph
    saved = {name: getattr(rb, name) for name in ("_record", "_wait", "_query", "_copy", "native")}
    try:
        PreparedLaunch.launch = launches.wrap(original)
        LaunchTable.launch = launches.wrap(original_table, count=lambda args: len(args[0]))
        if graph is not None:
            graph.head, graph.tail = _TimedGraph(graph.head, launches), _TimedGraph(graph.tail, launches)
        for name in ("_record", "_wait", "_query"):
            setattr(rb, name, runtime.wrap(saved[name]))
        rb._copy = (runtime.wrap(saved["_copy"][0]), *saved["_copy"][1:])
        if rb.native is not None:
            # (functions, query, ...): the query only if a copy is in flight
            rb.native = (runtime.wrap(rb.native[0], count=lambda args: 5 if args[1] else 4), rb.native[1])
        yield
    finally:
        PreparedLaunch.launch, LaunchTable.launch = original, original_table
        if graph is not None:
            graph.head, graph.tail = graph.head.graph, graph.tail.graph
        for name, value in saved.items():
            setattr(rb, name, value)


def _host_split(run, w, variant: str) -> None:
    """Host time of the step split into its driver calls and everything else (the Python around them).

    pre_forward + post_forward: the launch calls (the phases' ``LaunchTable.launch``, one
    call for all of a phase's launches when the compiled loop runs them, each
    ``PreparedLaunch.launch`` otherwise, or the two graph launches) against the rest;
    end_step: the readback's runtime calls (event record / wait / query, the status copy,
    through CuPy or one compiled call standing for them) against the rest (wrapped by
    :func:`timed_driver_calls`, ~0.1-0.2 µs per call, half of it in "everything else"). The spin
    kernel queued before each step is not counted (results up to the H200 run 1 of 2026-12-04,
    2e94477, counted it).
    """
    m = w.monitor
    launches, runtime = _Stopwatch(), _Stopwatch()
    with timed_driver_calls(m, launches, runtime):
        split = {key: [] for key in ("launches", "other", "runtime", "end_other")}
        calls = [0, 0]
        for i in range(3 + _host_iters(run)):
            synchronize()
            _spin(1500)
            launches.take()  # the spin's own launch is not the step's
            t0 = time.perf_counter()
            m.pre_forward(w.batch)
            t1 = time.perf_counter()
            w.write_kv(w.batch)
            t2 = time.perf_counter()
            m.post_forward()
            t3 = time.perf_counter()
            launch_us, launch_calls = launches.take()
            m.end_step()
            t4 = time.perf_counter()
            runtime_us, runtime_calls = runtime.take()
            if i >= 3:
                split["launches"].append(launch_us)
                split["other"].append((t1 - t0 + t3 - t2) * 1e6 - launch_us)
                split["runtime"].append(runtime_us)
                split["end_other"].append((t4 - t3) * 1e6 - runtime_us)
                calls = [launch_calls, runtime_calls]
    common = {"bs": w.requests, "prefix": w.prefix, "extend": w.extend}
    for key, label, n in (
        ("launches", "pre+post: launch calls", calls[0]),
        ("other", "pre+post: everything else", None),
        ("runtime", "end_step: runtime calls", calls[1]),
        ("end_other", "end_step: everything else", None),
    ):
        run.add(
            {
                "op": "monitor step host split",
                "variant": f"{variant}, {label}",
                **common,
                **({"launches": n} if n is not None else {}),
                **stats(split[key]),
            }
        )


def monitor_steps(run) -> None:
    for case in SIZES["monitor"][run.mode]:
        _monitor_case(run, *case)
        _free()
