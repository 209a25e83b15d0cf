"""Checks, on a GPU, the assumptions the attach layer (``canary.py``) makes about JAX and XLA.

They were derived from JAX's and XLA's sources and checked on JAX's CPU backend only;
this script settles them on a GPU. Each check prints one line and returns a dict;
``--out FILE`` writes them all as JSON. Needs JAX with CUDA and CuPy.

1. ``donation_reuses_address``: a donated pool (and page table) is written in place.
2. ``view_blocks_donation``: a live ``cupy.from_dlpack`` view of a donated array makes the
   donating call fail, or silently copy (the CPU backend copies).
3. ``dlpack_stream_wait_is_async``: ``x.__dlpack__(stream=s)`` returns before ``x`` is
   computed, and a CuPy read of ``x`` on ``s`` still sees the final values.
4. ``cai_does_not_wait``: ``__cuda_array_interface__`` returns at once, with no stream: it
   orders nothing (the canary must not rely on it without a host sync).
5. ``fence_orders_xla``: a jitted call taking a fence imported from the canary's stream (not
   reading it) starts only after the canary's queued work.
6. ``host_costs``: host microseconds of the per-step calls the attach layer makes.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import jax.numpy as jnp
import numpy as np

from .canary import alias

_SPIN = r"""
extern "C" __global__ void spin(long long cycles, int* flag, int value) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
    *flag = value;
}
"""


def _slow_square(n: int):
    """A jitted computation that takes a while on the device: repeated matmuls of an n x n matrix."""

    @jax.jit
    def f(x):
        for _ in range(20):
            x = jnp.tanh(x @ x / n)
        return x

    return f


def donation_reuses_address() -> dict:
    pool = jnp.zeros((1 << 16, 8, 64), jnp.uint16)
    table = jnp.zeros((65, 4096), jnp.int32)
    step = jax.jit(lambda p, t, i: (p.at[i].set(jnp.uint16(1)), t.at[1, i].set(i)), donate_argnums=(0, 1))
    pointers = set()
    for i in range(20):
        before = (pool.unsafe_buffer_pointer(), table.unsafe_buffer_pointer())
        pool, table = step(pool, table, i)
        pointers.add((before, (pool.unsafe_buffer_pointer(), table.unsafe_buffer_pointer())))
    same = all(b == a for b, a in pointers)
    return dict(ok=same, distinct_addresses=len({a for _, a in pointers}))


def view_blocks_donation() -> dict:
    import cupy

    x = jnp.zeros((1024, 64), jnp.uint16).block_until_ready()
    v = cupy.from_dlpack(x)
    f = jax.jit(lambda k: k.at[0].set(jnp.uint16(7)), donate_argnums=0)
    try:
        y = f(x).block_until_ready()
    except Exception as exc:
        return dict(ok=True, outcome="raises", error=f"{type(exc).__name__}: {str(exc)[:160]}")
    copied = not x.is_deleted() and y.unsafe_buffer_pointer() != v.data.ptr
    return dict(ok=True, outcome="copies" if copied else "donated in place despite the view")


def dlpack_stream_wait_is_async() -> dict:
    import cupy

    n, f = 4096, _slow_square(4096)
    x0 = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    f(x0).block_until_ready()  # compile
    expected = float(jnp.sum(f(x0)))
    stream = cupy.cuda.Stream(non_blocking=True)
    t0 = time.perf_counter()
    x = f(x0)
    x.__dlpack__(stream=stream.ptr)  # the attach layer's order_after
    t_dlpack = time.perf_counter() - t0
    with stream:
        got = float(alias(x, gpu=True).sum())  # CuPy reads on the canary stream
    t_total = time.perf_counter() - t0
    x.block_until_ready()
    return dict(
        ok=abs(got - expected) <= 1e-3 * max(1.0, abs(expected)) and t_dlpack < 0.5 * t_total,
        dlpack_call_ms=1e3 * t_dlpack,
        compute_ms=1e3 * t_total,
        sum_on_stream=got,
        sum_expected=expected,
    )


def cai_does_not_wait() -> dict:
    n, f = 4096, _slow_square(4096)
    x0 = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
    f(x0).block_until_ready()
    t0 = time.perf_counter()
    x = f(x0)
    cai = x.__cuda_array_interface__
    t_cai = time.perf_counter() - t0
    x.block_until_ready()
    t_total = time.perf_counter() - t0
    return dict(
        ok=t_cai < 0.5 * t_total and "stream" not in cai,
        cai_call_ms=1e3 * t_cai,
        compute_ms=1e3 * t_total,
        version=cai.get("version"),
        read_only=cai["data"][1],
    )


def fence_orders_xla() -> dict:
    import cupy

    spin = cupy.RawKernel(_SPIN, "spin")
    rate = cupy.cuda.Device().attributes["ClockRate"] * 1e3  # cycles per second
    stream = cupy.cuda.Stream(non_blocking=True)
    flag = cupy.zeros(1, dtype=np.int32)
    z = jnp.ones(16)
    waits = jax.jit(lambda fence, v: v * 2, keep_unused=True)
    waits(jnp.zeros(1, jnp.int32), z).block_until_ready()  # compile
    with stream:
        spin((1,), (1,), (np.int64(0.2 * rate), flag, np.int32(1)))  # ~200 ms of canary work
        fence = jax.dlpack.from_dlpack(flag)
    t0 = time.perf_counter()
    waits(fence, z).block_until_ready()
    waited = time.perf_counter() - t0
    stream.synchronize()
    return dict(ok=waited > 0.1, waited_ms=1e3 * waited, spin_ms=200.0)


def host_costs(repeat: int = 2000) -> dict:
    import cupy

    stream = cupy.cuda.Stream(non_blocking=True)
    x = jnp.zeros((1 << 16, 8, 64), jnp.uint16).block_until_ready()
    flag = cupy.zeros(1, dtype=np.int32)

    def per_call(fn) -> float:
        fn()
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        return 1e6 * (time.perf_counter() - t0) / repeat

    with stream:
        out = dict(
            dlpack_stream_wait_us=per_call(lambda: x.__dlpack__(stream=stream.ptr)),
            unsafe_buffer_pointer_us=per_call(x.unsafe_buffer_pointer),
            alias_us=per_call(lambda: alias(x, gpu=True)),
            fence_import_us=per_call(lambda: jax.dlpack.from_dlpack(flag)),
            block_until_ready_idle_us=per_call(x.block_until_ready),
        )
    return dict(ok=True, **out)


CHECKS = (
    donation_reuses_address,
    view_blocks_donation,
    dlpack_stream_wait_is_async,
    cai_does_not_wait,
    fence_orders_xla,
    host_costs,
)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args(argv)
    if jax.default_backend() != "gpu":
        print(f"needs JAX on a GPU (default backend: {jax.default_backend()})")
        return 0
    results = dict(jax=jax.__version__, device=str(jax.devices()[0]))
    for check in CHECKS:
        try:
            results[check.__name__] = r = check()
        except Exception as exc:
            results[check.__name__] = r = dict(ok=False, error=f"{type(exc).__name__}: {exc}")
        print(
            f"{check.__name__:<30} {'yes' if r.get('ok') else 'NO '}  "
            + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items() if k != "ok")
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
