"""``python -m examples.jax_engine``: a clean run, then one run per planted fault, and what the canary saw.

Runs on JAX's default device (``--cpu`` forces the CPU backend). The canary fingerprints
layer 0's live K and V (rebound to the pool's current buffers every step); ``--no-real-kv``
turns that off, and with it the ``kv_flip`` fault, which only those fingerprints can see.
"""

from __future__ import annotations

import argparse
import logging
import time

import jax

from .config import MODELS, TINY, TINY_ENGINE
from .engine import JaxEngine
from .faults import FAULT_CLASSES, REAL_KV_FAULTS


def run(fault, *, steps: int, model, device, real_kv: bool) -> str:
    engine = JaxEngine(model, TINY_ENGINE, faults={fault: steps // 4} if fault else None, device=device)
    canary = engine.attach_canary(real_kv=real_kv, health_interval=0)
    start = time.perf_counter()
    engine.run(steps)
    took = time.perf_counter() - start
    found = canary.violations
    if fault is None:
        verdict = "CLEAN" if not found else f"FALSE POSITIVES ({len(found)})"
        return f"{'clean run':<14} {verdict:<10} {steps} steps in {took:.1f} s, {engine.sched.finished} requests done"
    if not engine.faults:
        return f"{fault:<14} NOT FIRED  (its preconditions never held in {steps} steps)"
    (record,) = engine.faults
    catches = engine.catches()[fault]
    verdict = "CAUGHT" if catches else "MISSED"
    line = f"{fault:<14} {verdict:<10} planted at step {record.step} into slots {list(record.slots)}"
    if catches:
        first = catches[0]
        line += (
            f"\n{'':<25} first report: step {first.step}, {first.tag}, slot {first.slot_idx}, {'+'.join(first.reasons)}"
        )
    return line + f"\n{'':<25} ({FAULT_CLASSES[fault][0]})"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--cpu", action="store_true", help="JAX's CPU backend even where a GPU is the default")
    p.add_argument("--model", choices=sorted(MODELS), default=TINY.name)
    p.add_argument("--faults", nargs="*", default=sorted(FAULT_CLASSES))
    p.add_argument("--real-kv", action=argparse.BooleanOptionalAction, default=True, help="fingerprint layer-0 K/V")
    args = p.parse_args(argv)
    logging.getLogger("kvcanary_numba").setLevel(logging.ERROR)  # this report replaces the per-row warnings
    device = jax.devices("cpu")[0] if args.cpu else jax.devices()[0]
    print(f"JAX engine ({args.model}) on {device}; real-KV fingerprints: {'on' if args.real_kv else 'off'}\n")
    for fault in [None, *args.faults]:
        if fault in REAL_KV_FAULTS and not args.real_kv:
            print(f"{fault:<14} SKIPPED    (only real-KV fingerprints see it: --real-kv)")
            continue
        print(run(fault, steps=args.steps, model=MODELS[args.model], device=device, real_kv=args.real_kv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
