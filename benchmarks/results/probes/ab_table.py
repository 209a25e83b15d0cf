"""Markdown table of ``ab_monitor_step.py`` JSON lines (one row per process, in run order).

    python3 benchmarks/results/probes/ab_table.py FILE.jsonl [FILE.jsonl ...]

Columns: medians in us of host pre_forward + post_forward and of ``end_step`` for the prepared
step and graph replay under both protocols (``bench``: a spin kernel queued, the KV write between
the hooks; ``idle``: nothing else queued), and the step's device time under ``bench``, without and
with what ``end_step`` queues on the engine's stream (older probes recorded only the first). Needs only
the standard library, so it runs where the JSON lands.
"""

from __future__ import annotations

import json
import sys

PATHS = ("prepared", "graph replay")
PROTOCOLS = ("bench", "idle")


def _cell(row: dict, key: str) -> list[str]:
    data = row.get(key)
    if not data:
        return ["-", "-"]
    return [f"{data['host']['median']:.1f}", f"{data['end_step']['median']:.1f}"]


def table(rows: list[dict]) -> str:
    """The markdown table of ``rows`` (decoded JSON lines)."""
    header = ["process"]
    for path in PATHS:
        for protocol in PROTOCOLS:
            header += [f"{path} {protocol}: pre+post", "end_step"]
        header += [f"{path} bench: device", "device through end_step"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        if row.get("failed"):
            lines.append(f"| {row.get('tree', '?')} | failed |" + " |" * (len(header) - 2))
            continue
        cells = [row["tree"]]
        for path in PATHS:
            for protocol in PROTOCOLS:
                cells += _cell(row, f"{path} / {protocol}")
            bench = row.get(f"{path} / bench", {})
            for key in ("device", "device through end_step"):
                cells.append(f"{bench[key]['median']:.1f}" if key in bench else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(paths: list[str]) -> None:
    rows = []
    for path in paths:
        with open(path) as handle:
            rows += [json.loads(line) for line in handle if line.lstrip().startswith("{")]
    print(table(rows))


if __name__ == "__main__":
    main(sys.argv[1:])
