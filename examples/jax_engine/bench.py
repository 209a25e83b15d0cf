"""What the canary costs a JAX model step: canary off, on (prepared), on with graph replay.

Every measured step is the same step repeated (the same slots, tokens and positions):
the model rewrites the same KV and the canary re-stamps the same records, so the
canary's state stays valid while the arms take turns. Shapes (``--tiny --quick``
shrinks them so that the script runs on a CPU in seconds):

- decode: ``bs`` requests x 1 new token, each with ``cached`` tokens already in the pool
  (written, and stamped by every canary, before timing starts);
- prefill: ``bs`` requests x ``n`` new tokens from position 0.

Each (shape, verification) row times the arms in interleaved rounds. A step's time is
wall time bracketed by waiting for the model's outputs and for the canary's stream:
what a step costs when nothing overlaps it. Graph replay needs CuPy on a GPU: the
canary's HEAD and TAIL launches are captured (``CanaryMonitor.capture_graph``);
XLA's own work cannot join that graph (XLA launches on its own streams), so the
model step stays an XLA executable and the canary replays beside it.

``python -m examples.jax_engine.bench --out DIR`` writes ``DIR/jax_engine_bench.json``
and ``DIR/jax_engine_bench.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.8")  # leave the rest to CuPy (the canary)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from kvcanary_numba.monitor import VerifyBudget  # noqa: E402

from .canary import JaxCanary  # noqa: E402
from .config import LLAMA_3_2_1B, MODELS, TINY, ModelConfig  # noqa: E402
from .model import DeviceBatch, forward, init_params, new_kv_pool  # noqa: E402
from .scheduler import HostBatch  # noqa: E402

FULL_SHAPES = [
    ("decode", 1, 1024),
    ("decode", 64, 1024),
    ("decode", 256, 1024),
    ("prefill", 8, 2048),
    ("prefill", 8, 8192),
]
QUICK_SHAPES = [("decode", 1, 32), ("decode", 4, 32), ("prefill", 2, 16)]


class Shape:
    """Pool, page table and the repeated step of one (kind, bs, tokens) shape."""

    def __init__(self, model: ModelConfig, kind: str, bs: int, tokens: int, seed: int = 0):
        self.kind, self.bs, self.tokens = kind, bs, tokens
        cached, new = (tokens, 1) if kind == "decode" else (0, tokens)
        self.cached, self.new, self.ctx = cached, new, cached + new
        self.num_slots = 1 + bs * self.ctx  # slot 0 is padding; request r owns a contiguous run
        table = np.zeros((bs + 1, self.ctx), np.int32)
        table[1:] = 1 + np.arange(bs * self.ctx, dtype=np.int32).reshape(bs, self.ctx)
        self.table = table
        rng = np.random.default_rng(seed)
        self.prompts = rng.integers(1, model.vocab_size, size=(bs, self.ctx)).astype(np.int64)

    def host_batch(self, start: int, stop: int, rows: slice = slice(None)) -> HostBatch:
        """The packed batch writing positions ``[start, stop)`` of the requests in ``rows``."""
        reqs = np.arange(1, self.bs + 1)[rows]
        n = stop - start
        i64 = lambda v: np.asarray(v, dtype=np.int64)  # noqa: E731
        ids = self.prompts[reqs - 1, start:stop].reshape(-1)
        pos = np.tile(np.arange(start, stop), len(reqs))
        loc = self.table[reqs, start:stop].reshape(-1).astype(np.int64)
        flat = self.prompts[reqs - 1, :stop].reshape(-1)
        return HostBatch(
            requests=[],
            req_pool_indices=i64(reqs),
            prefix_lens=i64([start] * len(reqs)),
            extend_seq_lens=i64([n] * len(reqs)),
            input_ids=i64(ids),
            positions=i64(pos),
            out_cache_loc=loc,
            expected_tokens=i64(ids),
            expected_positions=i64(pos),
            token_ids_flat=i64(flat),
            token_offsets=i64(np.arange(len(reqs) + 1) * stop),
        )

    @staticmethod
    def device_batch(hb: HostBatch) -> DeviceBatch:
        bs, n = len(hb.req_pool_indices), int(hb.extend_seq_lens[0])
        as2d = lambda v: jnp.asarray(np.asarray(v, np.int32).reshape(bs, n))  # noqa: E731
        return DeviceBatch(
            tokens=as2d(hb.input_ids),
            positions=as2d(hb.positions),
            out_loc=as2d(hb.out_cache_loc),
            counts=jnp.full(bs, n, jnp.int32),
            rows=jnp.asarray(hb.req_pool_indices, jnp.int32),
            kv_lens=jnp.asarray(hb.prefix_lens + n, jnp.int32),
        )


class Arms:
    """The model step of one shape, with any set of canaries attached, timed per step."""

    def __init__(self, model, params, shape: Shape, args, gpu: bool):
        self.model, self.params, self.shape, self.gpu = model, params, shape, gpu
        self.k_pool, self.v_pool = new_kv_pool(model, shape.num_slots)
        self.table = jnp.asarray(shape.table)
        self.attention = ("cudnn" if gpu else "xla") if args.attention == "auto" else args.attention
        self.real_kv, self.head = args.real_kv, args.head
        # Setup prefills the cached tokens a few requests at a time (bounded attention scores).
        self.setup_rows = max(1, min(shape.bs, args.setup_tokens // max(shape.cached, 1)))
        tokens = max(shape.bs * shape.new, self.setup_rows * shape.cached)
        self.canaries = {}
        for verification, extra in (
            ("full", {}),
            ("budgeted", {"verify_budget": VerifyBudget(period=args.budget_period)}),
        ):
            for arm in ("on", "graph") if gpu else ("on",):
                self.canaries[f"{verification}/{arm}"] = JaxCanary(
                    k_arrays=self.k_pool[:1],
                    v_arrays=self.v_pool[:1],
                    num_slots=shape.num_slots,
                    max_requests=shape.bs + 1,
                    max_context=shape.ctx,
                    write_req_capacity=shape.bs,
                    write_token_capacity=tokens,
                    real_kv=self.real_kv,
                    order=args.order,
                    health_interval=0,
                    **extra,
                )
        self.fences = {name: jnp.zeros(1, jnp.int32) for name in self.canaries}
        self._fwd = jax.jit(
            forward, static_argnames=("cfg", "ctx_len", "attention", "q_block"), donate_argnums=(1, 2), keep_unused=True
        )

    def _forward(self, dev, ctx_len, attention):
        fence = tuple(self.fences.values())  # every canary's: one pytree shape, one compile
        out, self.k_pool, self.v_pool = self._fwd(
            self.params,
            self.k_pool,
            self.v_pool,
            self.table,
            dev,
            fence,
            cfg=self.model,
            ctx_len=ctx_len,
            attention=attention,
        )
        return out

    def step(self, hb, dev, names, ctx_len, attention=None, *, wait_canary: bool = True, phases=None) -> None:
        """One model step with the canaries ``names`` (all hooks). The host waits for the sampled
        tokens (as an engine does) and, with ``wait_canary``, for the canary's stream too.
        ``phases`` (a dict) gets the host seconds of each part of the step, appended by name."""
        active = [(n, self.canaries[n]) for n in names]
        marks = [("start", time.perf_counter())]
        if self.head == "before" and active:
            for _, c in active:
                c.pre_forward(hb, self.table)
            marks.append(("pre_forward", time.perf_counter()))
        attention = attention or self.attention
        try:
            out = self._forward(dev, ctx_len, attention)
        except Exception:  # noqa: BLE001 - cuDNN refused the shape (at its first compile): XLA's attention
            if attention != "cudnn":
                raise
            self.attention = "xla"
            out = self._forward(dev, ctx_len, "xla")
        marks.append(("forward dispatch", time.perf_counter()))
        if self.head == "beside" and active:  # HEAD reads only canary memory and the page table: beside the model
            for _, c in active:
                c.pre_forward(hb, self.table)
            marks.append(("pre_forward", time.perf_counter()))
        for n, c in active:
            c.post_forward(self.k_pool[:1], self.v_pool[:1])
            marks.append(("post_forward", time.perf_counter()))
            # Neither waits for the model (end_step reads the previous step's status): done while it runs.
            c.end_step()
            marks.append(("end_step", time.perf_counter()))
            self.fences[n] = c.fence()
            marks.append(("fence", time.perf_counter()))
        out.block_until_ready()
        marks.append(("model wait", time.perf_counter()))
        for _, c in active:
            if self.gpu and wait_canary:
                c.stream.synchronize()  # the step is over when the canary's work is
                marks.append(("canary wait", time.perf_counter()))
        if phases is not None:
            for (_, t0), (name, t1) in zip(marks, marks[1:]):
                phases.setdefault(name, []).append(t1 - t0)

    def prepare(self) -> tuple:
        """Write and stamp the cached prefix (every canary), capture the graph arms; returns the timed step."""
        s = self.shape
        for lo in range(0, s.bs if s.cached else 0, self.setup_rows):
            hb = s.host_batch(0, s.cached, slice(lo, lo + self.setup_rows))
            self.step(hb, s.device_batch(hb), list(self.canaries), s.cached, attention="xla")
        hb = s.host_batch(s.cached, s.ctx)
        dev = s.device_batch(hb)
        self.step(hb, dev, list(self.canaries), s.ctx)  # every arm's first step of this shape, eager
        for name, c in self.canaries.items():
            if name.endswith("/graph"):
                c.capture_graph(hb, self.table)
        return hb, dev

    def time(self, args) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
        """Seconds per step of every arm ("off" and each canary), arms interleaved in rounds.

        Returns ``(latency, pipelined)``: each step timed alone, the host waiting for the model
        and the canary; and runs of ``args.steps`` steps timed together, the host waiting only
        for the sampled tokens of each step (the canary's stream and fence keep the order),
        one mean per run.
        """
        hb, dev = self.prepare()
        names = ["off", *self.canaries]
        latency, pipelined = {n: [] for n in names}, {n: [] for n in names}
        self.phases = {n: {} for n in names}
        for r in range(args.warmup + args.rounds):
            timed = r >= args.warmup
            for n in names:
                canaries = [] if n == "off" else [n]
                for _ in range(args.steps if timed else 1):
                    t0 = time.perf_counter()
                    self.step(hb, dev, canaries, self.shape.ctx, phases=self.phases[n] if timed else None)
                    if timed:
                        latency[n].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    self.step(hb, dev, canaries, self.shape.ctx, wait_canary=False)
                for c in self.canaries.values():
                    if self.gpu:
                        c.stream.synchronize()
                if timed:
                    pipelined[n].append((time.perf_counter() - t0) / args.steps)
        return latency, pipelined


def run_shape(model, params, kind: str, bs: int, tokens: int, args, gpu: bool) -> list[dict]:
    """One result row per arm of one shape."""
    arms = Arms(model, params, Shape(model, kind, bs, tokens), args, gpu)
    latency, pipelined = arms.time(args)
    for c in arms.canaries.values():
        c.flush()
    off, off_pipe = statistics.median(latency["off"]), statistics.median(pipelined["off"])
    violations = sum(len(c.violations) for c in arms.canaries.values())
    rows = []
    for name, t in latency.items():
        verification, arm = ("-", "off") if name == "off" else name.split("/")
        med, pipe = statistics.median(t), statistics.median(pipelined[name])
        rows.append(
            dict(
                kind=kind,
                bs=bs,
                tokens=tokens,
                verification=verification,
                arm=arm,
                median_ms=1e3 * med,
                p10_ms=1e3 * float(np.percentile(t, 10)),
                p90_ms=1e3 * float(np.percentile(t, 90)),
                overhead_pct=None if name == "off" else 100 * (med - off) / off,
                samples=len(t),
                pipelined_ms=1e3 * pipe,
                pipelined_overhead_pct=None if name == "off" else 100 * (pipe - off_pipe) / off_pipe,
                attention=arms.attention,
                real_kv=arms.real_kv,
                violations=violations,
                phases_us={k: round(1e6 * statistics.median(v), 1) for k, v in arms.phases[name].items()},
            )
        )
    return rows


def markdown(meta: dict, rows: list[dict]) -> str:
    lines = [
        f"# JAX engine: canary cost per model step ({meta['model']}, {meta['device']})",
        "",
        f"jax {meta['jax']}, order `{meta['order']}`, HEAD {meta.get('head', 'before')} the forward, "
        f"real-KV sources: {meta['real_kv']}, "
        f"budget period {meta['budget_period']}; medians of {meta['samples']} steps per arm.",
        "",
        "Step: the host waits for the model and the canary after each step (median, p10-p90). "
        "Pipelined: runs of steps where the host waits only for the sampled tokens (median of the runs' means).",
        "",
        "| step | verification | arm | step ms | p10-p90 ms | overhead | pipelined ms | overhead | attention "
        "| violations |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    pct = lambda v: "-" if v is None else f"{v:+.2f} %"  # noqa: E731
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['kind']} {r['bs']} x {r['tokens']} | - | - | - | - | - | - | {r['error']} | - | - |")
            continue
        lines.append(
            f"| {r['kind']} {r['bs']} x {r['tokens']} | {r['verification']} | {r['arm']} | "
            f"{r['median_ms']:.3f} | {r['p10_ms']:.3f}-{r['p90_ms']:.3f} | {pct(r['overhead_pct'])} | "
            f"{r['pipelined_ms']:.3f} | {pct(r['pipelined_overhead_pct'])} | {r['attention']} | "
            f"{r['violations']} |"
        )
    lines += [
        "",
        "Host time of each part of a step (median µs; the model's and the canary's waits included):",
        "",
        "| step | verification | arm | parts |",
        "|---|---|---|---|",
    ]
    for r in rows:
        if "phases_us" in r:
            parts = ", ".join(f"{k} {v:g}" for k, v in r["phases_us"].items())
            lines.append(f"| {r['kind']} {r['bs']} x {r['tokens']} | {r['verification']} | {r['arm']} | {parts} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="the tiny model instead of Llama-3.2-1B shapes")
    p.add_argument("--model", choices=sorted(MODELS), default=None)
    p.add_argument("--quick", action="store_true", help="small shapes and few steps (CPU smoke run)")
    p.add_argument("--cpu", action="store_true", help="JAX's CPU backend even where a GPU is the default")
    p.add_argument("--out", default="benchmarks/results/jax_engine", help="output folder")
    p.add_argument("--order", choices=("stream", "block"), default="stream")
    p.add_argument("--attention", choices=("auto", "xla", "cudnn"), default="auto")
    p.add_argument(
        "--real-kv",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="fingerprint layer-0 K/V (rebound per step)",
    )
    p.add_argument("--head", choices=("beside", "before"), default="beside", help="HEAD after or before the forward")
    p.add_argument(
        "--shape",
        action="append",
        default=None,
        metavar="KIND:BS:TOKENS",
        help="measure only these shapes (repeatable), e.g. prefill:8:8192",
    )
    p.add_argument("--budget-period", type=int, default=8)
    p.add_argument("--steps", type=int, default=None, help="timed steps per arm and round")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--setup-tokens", type=int, default=32768, help="tokens per setup prefill step")
    p.add_argument("--only", choices=("decode", "prefill"), default=None, help="one kind of step")
    args = p.parse_args(argv)
    model = MODELS[args.model] if args.model else (TINY if args.tiny else LLAMA_3_2_1B)
    device = jax.devices("cpu")[0] if args.cpu else jax.devices()[0]
    gpu = device.platform == "gpu"
    args.steps = args.steps or (3 if args.quick else 20)
    args.rounds = args.rounds or (2 if args.quick else 5)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(
        model=model.name,
        device=str(device),
        jax=jax.__version__,
        order=args.order,
        head=args.head,
        real_kv=args.real_kv,
        budget_period=args.budget_period,
        samples=args.steps * args.rounds,
        python=sys.version.split()[0],
        machine=platform.machine(),
        quick=args.quick,
    )
    rows = []
    with jax.default_device(device):
        params = init_params(model)
        for kind, bs, tokens in QUICK_SHAPES if args.quick else FULL_SHAPES:
            if args.only not in (None, kind) or (args.shape and f"{kind}:{bs}:{tokens}" not in args.shape):
                continue
            try:
                rows += run_shape(model, params, kind, bs, tokens, args, gpu)
            except Exception as exc:  # noqa: BLE001 - e.g. 8 x 8k not fitting: reported, the rest still runs
                if "RESOURCE_EXHAUSTED" not in str(exc) and "out of memory" not in str(exc).lower():
                    raise
                rows.append(dict(kind=kind, bs=bs, tokens=tokens, error="did not fit in GPU memory"))
            print(markdown_row_summary(rows[-1]), flush=True)
            # Written after every shape: a run stopped by a time limit keeps the rows it measured.
            (out / "jax_engine_bench.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=2))
            (out / "jax_engine_bench.md").write_text(markdown(meta, rows))
    print(f"wrote {out / 'jax_engine_bench.json'} and {out / 'jax_engine_bench.md'}")
    return 0


def markdown_row_summary(row: dict) -> str:
    if "error" in row:
        return f"{row['kind']} {row['bs']} x {row['tokens']}: {row['error']}"
    return f"{row['kind']} {row['bs']} x {row['tokens']}: done"


if __name__ == "__main__":
    raise SystemExit(main())
