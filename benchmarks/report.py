"""The performance targets (benchmarks/NOTES.md, "Targets") checked against a run's records, the markdown table, the PNG plots.

Targets are reported, never asserted: a missed target is a finding of the run.
"""

from __future__ import annotations

import json
import pathlib

__all__ = ["SCHEMA_VERSION", "evaluate_targets", "markdown", "plots", "write_results"]

SCHEMA_VERSION = 1
SIZE_KEYS = ("entries", "tokens", "bs", "size", "n")


#: The whole plan (both launches) of the plan sweep, as opposed to its "offsets only" rows.
PLAN_VARIANT = "decode prefix=128"


def _find(records, op, **where) -> list[dict]:
    return [r for r in records if r.get("op") == op and all(r.get(k) == v for k, v in where.items())]


def _median(records, op, **where):
    found = _find(records, op, **where)
    return found[0].get("median_us") if found else None


def _target(name: str, value, threshold, better: str, unit: str, note: str = "") -> dict:
    if value is None:
        met = None
    else:
        met = value >= threshold if better == "higher" else value <= threshold
    return {
        "target": name,
        "value": value,
        "threshold": threshold,
        "better": better,
        "unit": unit,
        "met": met,
        "note": note,
    }


def evaluate_targets(records: list[dict]) -> list[dict]:
    """The performance targets with this run's values (``met`` is None when not measured)."""
    out = []

    def worst_fraction(variants):
        fractions = [
            r.get("copy_fraction")
            for r in records
            if r.get("op") == "verify" and r.get("variant") in variants and r.get("entries", 0) >= 1 << 22
        ]
        fractions = [f for f in fractions if f is not None]
        return min(fractions) if fractions else None

    out.append(
        _target(
            "verify >= 4M entries, NONE and ALL, contiguous slots: fraction of copy bandwidth (worst)",
            worst_fraction(("NONE contiguous", "ALL contiguous")),
            0.80,
            "higher",
            "fraction",
        )
    )
    out.append(
        _target(
            "verify >= 4M entries, NONE and ALL, random slots: fraction of copy bandwidth (worst)",
            worst_fraction(("NONE", "ALL")),
            0.80,
            "higher",
            "fraction",
            "informational: DRAM serves each random 32 B record as a 64 B access (ncu), so no kernel "
            "reaches this; the next row compares with a kernel that only loads",
        )
    )
    ceilings = [
        r.get("load_ceiling_fraction")
        for r in records
        if r.get("op") == "verify" and r.get("variant") in ("NONE", "ALL") and r.get("entries", 0) >= 1 << 22
    ]
    ceilings = [c for c in ceilings if c is not None]
    out.append(
        _target(
            "verify >= 4M entries, NONE and ALL, random slots, against pure loads: pure-load kernel time / verify time (worst)",
            min(ceilings) if ceilings else None,
            0.90,
            "higher",
            "fraction",
            "informational: the same reads with no hashing (benchmarks/ceiling.py) bound any verify",
        )
    )
    ours = _median(records, "write", variant="ALL r=8", tokens_per_request=32768)
    base = _median(records, "write", variant="baseline thread/request ALL r=8", tokens_per_request=32768)
    out.append(
        _target(
            "write 8 x 32k ALL: speed-up over one thread per request",
            round(base / ours, 2) if ours and base else None,
            4.0,
            "higher",
            "x",
        )
    )
    plan_4096 = _median(records, "plan", bs=4096, variant=PLAN_VARIANT)
    out.append(_target("plan bs=4096: device time", plan_4096, 30.0, "lower", "us"))
    big = _find(records, "plan", bs=65536, variant=PLAN_VARIANT)
    out.append(
        _target(
            "plan bs=65536 works (entries and enable read back)",
            (1.0 if big[0].get("ok") else 0.0) if big else None,
            1.0,
            "higher",
            "ok",
        )
    )
    op = "step plan+verify+write host"
    out.append(
        _target(
            "step host time, eager with prepared launches (the monitor's GPU path)",
            _median(records, op, variant="prepared"),
            60.0,
            "lower",
            "us",
        )
    )
    out.append(
        _target(
            "step host time, eager through the validated public API",
            _median(records, op, variant="eager (public API)"),
            60.0,
            "lower",
            "us",
            "informational: every call re-validates and re-wraps its arguments",
        )
    )
    out.append(
        _target(
            "step host time, replayed from a CUDA graph",
            _median(records, op, variant="graph replay"),
            15.0,
            "lower",
            "us",
        )
    )
    for path, threshold in (("prepared", 60.0), ("graph replay", 15.0)):
        out.append(
            _target(
                f"monitor decode step host time, {path}",
                _median(records, "monitor step host", variant=f"decode {path}"),
                threshold,
                "lower",
                "us",
                "informational: a FULL pool with K and V is 6 launches (2 plan, 2 HEAD, 2 TAIL; 10 before "
                "the K and V launches of a phase were fused)",
            )
        )
    speedups = [r.get("speedup") for r in records if r.get("op") == "cpu verify" and r.get("speedup")]
    out.append(
        _target(
            "CPU verify: NumPy path over the per-entry Python loop (worst mode)",
            min(speedups) if speedups else None,
            100.0,
            "higher",
            "x",
        )
    )
    from benchmarks import bench_chain  # its own targets (the chain floor and the monitor step)

    return out + bench_chain.targets(records, _target)


def _size(record: dict):
    return next((record[k] for k in SIZE_KEYS if k in record), "")


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def markdown(meta: dict, records: list[dict], targets: list[dict]) -> str:
    lines = [f"# kvcanary benchmark: {meta.get('name', '')}", ""]
    lines += ["| run | |", "|---|---|", *(f"| {k} | {_fmt(v)} |" for k, v in meta.items() if k != "errors"), ""]
    lines += ["## Targets", "", "| target | value | threshold | met |", "|---|---|---|---|"]
    for t in targets:
        met = {True: "yes", False: "**no**", None: "not measured"}[t["met"]]
        note = f" ({t['note']})" if t["note"] else ""
        lines.append(f"| {t['target']}{note} | {_fmt(t['value'])} {t['unit']} | {t['threshold']} | {met} |")
    for error in meta.get("errors", []):
        lines += ["", f"**Section `{error['section']}` failed:** `{error['error']}`"]
    ops: list[str] = []
    for r in records:
        ops += [r["op"]] if r.get("op") not in ops else []
    for op in ops:
        rows = [r for r in records if r.get("op") == op]
        extra = [
            k
            for k in ("gbps", "copy_fraction", "speedup", "launches", "rows", "selected", "vs_full")
            if any(k in r for r in rows)
        ]
        lines += [
            "",
            f"## {op}",
            "",
            "| variant | size | median µs | p90 µs | " + " | ".join(extra) + " |",
            "|---|---|---|---|" + "---|" * len(extra),
        ]
        for r in rows:
            cells = [r.get("variant", ""), _size(r), r.get("median_us"), r.get("p90_us"), *(r.get(k) for k in extra)]
            cells = [_fmt(c) for c in cells]
            if r.get("host_bound"):  # even the longest spin ran out: the events may have timed the host
                cells[2] += " (host-bound)"
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


_LINE_STYLES = ("-", "--", ":", "-.")  # as the docs' plots (docs/hooks/docgen_bench.py)


def plots(records: list[dict], out: pathlib.Path, stem: str) -> list[str]:
    """One log-log PNG per operation (median time vs size, a line per variant); [] without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    ops = sorted({r["op"] for r in records if r.get("op")})
    for op in ops:
        lines: dict[str, list] = {}
        for r in records:
            size = _size(r)
            if r.get("op") == op and isinstance(size, (int, float)) and size > 0 and r.get("median_us"):
                lines.setdefault(str(r.get("variant", "")), []).append((size, r["median_us"]))
        if not any(len(points) > 1 for points in lines.values()):
            continue
        fig, ax = plt.subplots(figsize=(7, 4))
        kept: dict[tuple, str] = {}  # a burst-model record re-reads another's timing: one line for both
        for variant, points in sorted(lines.items()):
            kept.setdefault(tuple(sorted(points)), variant)
        for index, (points, variant) in enumerate(kept.items()):
            xs, ys = zip(*points)
            # The colour cycle has 10 entries: later lines change their dash instead.
            ax.plot(xs, ys, marker="o", label=variant, linestyle=_LINE_STYLES[index // 10 % len(_LINE_STYLES)])
        ax.set(xscale="log", yscale="log", xlabel="size", ylabel="median time (µs)", title=op)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="x-small")
        path = out / f"{stem}-{''.join(c if c.isalnum() else '-' for c in op)}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(path.name)
    return written


def write_results(out: pathlib.Path, name: str, meta: dict, records: list[dict]) -> dict:
    """Write ``<name>.json``, ``<name>.md`` and the plots into ``out``; returns the JSON document."""
    out.mkdir(parents=True, exist_ok=True)
    targets = evaluate_targets(records)
    meta = {**meta, "plots": plots(records, out, name)}
    doc = {"schema": SCHEMA_VERSION, "meta": meta, "targets": targets, "results": records}
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1, default=str), encoding="utf-8")
    (out / f"{name}.md").write_text(markdown(meta, records, targets), encoding="utf-8")
    return doc
