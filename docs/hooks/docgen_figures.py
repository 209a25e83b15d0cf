"""The pictures of the concept pages and tutorials, as SVG files under ``docs/assets/figures/``.

Written by hand as SVG (text stays text: sharp at any zoom, searchable, a few KB),
with every number taken from the package: the record's example bytes, the chain's
hashes, the offsets plan's values and the ring's column names are computed, not typed.
The files are committed; ``tests/test_docs_figures.py`` fails when they differ from
what this module draws, so a change to the package or to a picture shows up there.

Regenerate::

    python docs/hooks/docgen_figures.py            # writes docs/assets/figures/*.svg
"""

from __future__ import annotations

import html
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "assets" / "figures"

SANS = "system-ui, -apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif"
MONO = "ui-monospace, SFMono-Regular, Menlo, Consolas, 'Liberation Mono', monospace"
INK, MUTED, LINE = "#212121", "#616161", "#9e9e9e"
#: Field colours (fill, stroke): token, position, prev_hash, real_kv_hash.
FIELD_COLOURS = (
    ("#e3f2fd", "#1e88e5"),
    ("#e8f5e9", "#43a047"),
    ("#fff3e0", "#fb8c00"),
    ("#f3e5f5", "#8e24aa"),
)
ACCENT = "#e64a19"  # the site's deep orange, darker for contrast on white


class Svg:
    """A few SVG primitives; ``str(svg)`` is the document."""

    def __init__(self, width: int, height: int, title: str):
        self.width, self.height, self.title = width, height, title
        self.parts: list[str] = []

    def rect(self, x, y, w, h, fill="#fff", stroke=LINE, rx=3, dash=None, width=1.0):
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        self.parts.append(
            f'<rect x="{x:g}" y="{y:g}" width="{w:g}" height="{h:g}" rx="{rx:g}" fill="{fill}" '
            f'stroke="{stroke}" stroke-width="{width:g}"{extra}/>'
        )

    def text(
        self,
        x,
        y,
        s,
        size=12,
        anchor="start",
        weight="normal",
        mono=False,
        fill=INK,
        italic=False,
    ):
        style = ' font-style="italic"' if italic else ""
        self.parts.append(
            f'<text x="{x:g}" y="{y:g}" font-family="{MONO if mono else SANS}" font-size="{size:g}" '
            f'text-anchor="{anchor}" font-weight="{weight}" fill="{fill}"{style}>'
            f"{html.escape(s)}</text>"
        )

    def line(self, x1, y1, x2, y2, stroke=MUTED, arrow=False, dash=None, width=1.2):
        extra = ' marker-end="url(#arrow)"' if arrow else ""
        extra += f' stroke-dasharray="{dash}"' if dash else ""
        self.parts.append(
            f'<line x1="{x1:g}" y1="{y1:g}" x2="{x2:g}" y2="{y2:g}" stroke="{stroke}" '
            f'stroke-width="{width:g}"{extra}/>'
        )

    def path(self, d, stroke=MUTED, arrow=False, width=1.2):
        extra = ' marker-end="url(#arrow)"' if arrow else ""
        self.parts.append(
            f'<path d="{d}" fill="none" stroke="{stroke}" stroke-width="{width:g}"{extra}/>'
        )

    def __str__(self) -> str:
        head = (
            f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {self.width} {self.height}" '
            f'width="{self.width}" height="{self.height}" role="img" aria-label="{html.escape(self.title)}">\n'
            f"<title>{html.escape(self.title)}</title>\n"
            '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
            f'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{MUTED}"/></marker></defs>\n'
            f'<rect width="{self.width}" height="{self.height}" fill="#ffffff"/>\n'
        )
        return head + "\n".join(self.parts) + "\n</svg>\n"


def _le_bytes(value: int) -> list[str]:
    return [f"{b:02X}" for b in (value & (2**64 - 1)).to_bytes(8, "little")]


# --- the record ------------------------------------------------------------------------


def record_svg() -> str:
    """The 32-byte record: four little-endian int64 fields at 0, 8, 16, 24, with an example."""
    from kvcanary_numba import CANARY_CHAIN_HEAD
    from kvcanary_numba.constants import (
        CANARY_SLOT_BYTES,
        FIELD_POSITION,
        FIELD_PREV_HASH,
        FIELD_REAL_KV_HASH,
        FIELD_TOKEN,
    )

    token, position, prev_hash, real_kv = 101, 0, CANARY_CHAIN_HEAD, 0
    fields = [
        (FIELD_TOKEN, "token", token, ("the token id whose K/V", "the slot holds")),
        (
            FIELD_POSITION,
            "position",
            position,
            ("that token's position", "in its sequence"),
        ),
        (
            FIELD_PREV_HASH,
            "prev_hash",
            prev_hash,
            ("slot hash of the previous", "token's record (the chain)"),
        ),
        (
            FIELD_REAL_KV_HASH,
            "real_kv_hash",
            real_kv,
            ("fingerprint of the slot's", "KV bytes, or 0"),
        ),
    ]
    cell, x0 = 22, 24
    svg = Svg(
        x0 + CANARY_SLOT_BYTES * cell + 92,
        214,
        "The 32-byte canary record of one KV slot",
    )
    for index, name, value, about in fields:
        fill, stroke = FIELD_COLOURS[index]
        x = x0 + index * 8 * cell
        svg.text(x, 18, f"@{index * 8}", size=12, weight="bold", mono=True, fill=stroke)
        svg.rect(x, 26, 8 * cell, 30, fill=fill, stroke=stroke, rx=2)
        svg.text(
            x + 4 * cell, 46, f"{name}: int64", size=13, anchor="middle", weight="bold"
        )
        for i, byte in enumerate(_le_bytes(value)):
            svg.rect(x + i * cell, 60, cell, 24, fill="#ffffff", stroke=stroke, rx=0)
            svg.text(
                x + i * cell + cell / 2, 76, byte, size=10.5, anchor="middle", mono=True
            )
        svg.text(x + 4 * cell, 104, about[0], size=11.5, anchor="middle", fill=MUTED)
        svg.text(x + 4 * cell, 119, about[1], size=11.5, anchor="middle", fill=MUTED)
    end = x0 + CANARY_SLOT_BYTES * cell
    svg.text(
        end, 18, f"{CANARY_SLOT_BYTES}", size=12, weight="bold", mono=True, fill=MUTED
    )
    svg.rect(end, 60, 70, 24, fill="#fafafa", stroke=LINE, rx=0, dash="3 3")
    svg.text(
        end + 35, 76, "… stride", size=10.5, anchor="middle", mono=True, fill=MUTED
    )
    svg.text(end + 35, 104, "never touched", size=11.5, anchor="middle", fill=MUTED)
    svg.text(end + 35, 119, "(stride ≥ 32)", size=11.5, anchor="middle", fill=MUTED)
    svg.line(x0, 140, end, 140, stroke=LINE)
    svg.text(
        x0,
        162,
        f"Example: token {token} at position {position}, the first token of its sequence, "
        "with no real-KV source.",
        size=12,
    )
    svg.text(
        x0,
        180,
        f"prev_hash is the chain head 0x{prev_hash:016X}, stored little-endian: its lowest "
        "byte comes first.",
        size=12,
    )
    svg.text(
        x0,
        198,
        "canary_buf is uint8 [num_slots, stride]; row s shadows KV slot s; slot 0 is padding.",
        size=12,
        fill=MUTED,
    )
    return str(svg)


# --- the chain -------------------------------------------------------------------------


def chain_svg() -> str:
    """Anchor -> head, then three records of one request linked by mix3."""
    from kvcanary_numba import CANARY_CHAIN_ANCHOR, CANARY_CHAIN_HEAD
    from kvcanary_numba.hashing import splitmix64, splitmix64_mix3

    assert splitmix64(CANARY_CHAIN_ANCHOR) == CANARY_CHAIN_HEAD
    records, prev = [], CANARY_CHAIN_HEAD
    for position, (slot, token) in enumerate(((10, 101), (11, 102), (12, 103))):
        records.append((slot, token, position, prev))
        prev = splitmix64_mix3(prev, token, position)
    box_w, gap, x0, top = 214, 48, 36, 112
    svg = Svg(
        x0 + 3 * box_w + 2 * gap + 20,
        336,
        "The chain of one request's records across its slots",
    )
    # The head: S(anchor).
    svg.rect(x0, 14, 250, 44, fill="#fafafa", stroke=LINE)
    svg.text(x0 + 10, 32, "anchor", size=11.5, fill=MUTED)
    svg.text(x0 + 10, 50, f"0x{CANARY_CHAIN_ANCHOR:016X}", size=12.5, mono=True)
    svg.line(x0 + 250, 36, x0 + 316, 36, arrow=True)
    svg.text(
        x0 + 283,
        30,
        "S",
        size=13,
        anchor="middle",
        weight="bold",
        mono=True,
        fill=ACCENT,
    )
    svg.rect(
        x0 + 320, 14, 250, 44, fill=FIELD_COLOURS[2][0], stroke=FIELD_COLOURS[2][1]
    )
    svg.text(x0 + 330, 32, "chain head = S(anchor)", size=11.5, fill=MUTED)
    svg.text(x0 + 330, 50, f"0x{CANARY_CHAIN_HEAD:016X}", size=12.5, mono=True)
    rows = ("token", "position", "prev_hash", "real_kv_hash")
    prev_y = top + 4 + 2 * 26 + 12  # centre of the prev_hash row
    # The first record of a sequence stores the head: enter its prev_hash row from the left.
    svg.path(
        f"M{x0 + 445},58 L{x0 + 445},80 L{x0 - 22},80 L{x0 - 22},{prev_y} L{x0 + 2},{prev_y}",
        arrow=True,
        stroke=FIELD_COLOURS[2][1],
    )
    for i, (slot, token, position, prev_hash) in enumerate(records):
        x = x0 + i * (box_w + gap)
        svg.text(
            x + box_w / 2,
            top - 8,
            f"slot {slot} · position {position}",
            size=12.5,
            anchor="middle",
            weight="bold",
        )
        svg.rect(x, top, box_w, 4 * 26 + 8, fill="#ffffff", stroke=LINE)
        values = (str(token), str(position), f"0x{prev_hash:016X}", "(not chained)")
        for j, (name, value) in enumerate(zip(rows, values)):
            fill, stroke = FIELD_COLOURS[j]
            y = top + 4 + j * 26
            svg.rect(x + 4, y, box_w - 8, 24, fill=fill, stroke=stroke, rx=2)
            svg.text(x + 10, y + 16, name, size=11.5, fill=MUTED)
            svg.text(x + box_w - 10, y + 16, value, size=11.5, anchor="end", mono=True)
        if i + 1 < len(records):
            # mix3 of this record's (prev_hash, token, position) is the next record's prev_hash.
            nx, mid = x + box_w + gap, x + box_w + gap / 2
            svg.path(
                f"M{x + box_w},{top + 43} C{mid},{top + 43} {mid},{prev_y} {nx + 2},{prev_y}",
                arrow=True,
                stroke=ACCENT,
            )
            svg.text(
                mid, top + 34, "mix3", size=11, anchor="middle", mono=True, fill=ACCENT
            )
    svg.text(
        x0,
        top + 140,
        "Writing a token stores, as its record's prev_hash, the slot hash of the record "
        "before it:",
        size=12,
    )
    svg.text(
        x0 + 16,
        top + 160,
        "slot hash = mix3(prev_hash, token, position)",
        size=12.5,
        mono=True,
        fill=ACCENT,
    )
    svg.text(
        x0,
        top + 182,
        "Verify recomputes the predecessor's slot hash from its record and compares it "
        "with the stored prev_hash:",
        size=12,
    )
    svg.text(
        x0,
        top + 200,
        "a changed record breaks the link of the slot after it; a record of another "
        "sequence breaks its own.",
        size=12,
    )
    svg.text(
        x0,
        top + 222,
        "S is the splitmix64 finalizer, mix3(a, b, c) = S(S(S(a) ^ b) ^ c); all "
        "arithmetic wraps at 2^64.",
        size=12,
        fill=MUTED,
    )
    return str(svg)


# --- one step --------------------------------------------------------------------------


def step_timeline_svg() -> str:
    """A step on the GPU stream (plan, HEAD, forward, TAIL, status copy) and the host's hooks."""
    svg = Svg(
        780,
        270,
        "One engine step: plan, HEAD verify and write, the forward pass, TAIL verify and write",
    )
    x0, lane_gpu, lane_host = 96, 44, 150
    svg.text(10, lane_gpu + 22, "GPU stream", size=12, weight="bold")
    svg.text(10, lane_host + 20, "host", size=12, weight="bold")
    blocks = [  # (label, sub-label, width, fill, stroke)
        ("plan", "work lists", 58, "#eceff1", "#607d8b"),
        ("HEAD verify", "head buffer", 86, *FIELD_COLOURS[0]),
        ("HEAD write", "head buffer", 80, *FIELD_COLOURS[0]),
        ("forward pass", "attention writes K/V", 150, "#fffde7", "#f9a825"),
        ("TAIL verify", "tail buffer + KV", 90, *FIELD_COLOURS[3]),
        ("TAIL write", "tail buffer + KV", 90, *FIELD_COLOURS[3]),
        ("status copy", "write index", 84, "#eceff1", "#607d8b"),
    ]
    x, spans = x0, []
    for label, sub, w, fill, stroke in blocks:
        svg.rect(x, lane_gpu, w, 40, fill=fill, stroke=stroke)
        svg.text(
            x + w / 2, lane_gpu + 17, label, size=11.5, anchor="middle", weight="bold"
        )
        svg.text(x + w / 2, lane_gpu + 32, sub, size=10, anchor="middle", fill=MUTED)
        spans.append((x, x + w))
        x += w + 4
    svg.line(x0, lane_gpu + 54, x + 10, lane_gpu + 54, stroke=LINE, arrow=True)
    svg.text(x + 8, lane_gpu + 70, "time", size=10.5, anchor="end", fill=MUTED)
    # What HEAD and TAIL can check.
    svg.text(
        spans[1][0],
        lane_gpu + 74,
        "before the forward: prefix records only,",
        size=10.5,
        fill=MUTED,
    )
    svg.text(
        spans[1][0],
        lane_gpu + 87,
        "new tokens' KV does not exist yet",
        size=10.5,
        fill=MUTED,
    )
    svg.text(
        spans[4][0],
        lane_gpu + 74,
        "after it: also fingerprints of the",
        size=10.5,
        fill=MUTED,
    )
    svg.text(
        spans[4][0],
        lane_gpu + 87,
        "live KV, old and just written",
        size=10.5,
        fill=MUTED,
    )
    hooks = [
        ("pre_forward(batch)", spans[0][0], spans[2][1]),
        ("engine runs the model", spans[3][0], spans[3][1]),
        ("post_forward()", spans[4][0], spans[5][1]),
        ("end_step()", spans[6][0], spans[6][1]),
    ]
    for label, a, b in hooks:
        svg.rect(
            a,
            lane_host,
            b - a,
            30,
            fill="#ffffff",
            stroke=LINE,
            dash="4 3" if "engine" in label else None,
        )
        svg.text(
            (a + b) / 2,
            lane_host + 19,
            label,
            size=11,
            anchor="middle",
            mono="(" in label,
        )
    svg.text(
        x0,
        lane_host + 56,
        "In each phase verify runs before write, so a step never checks what it has "
        "just written itself.",
        size=11.5,
    )
    svg.text(
        x0,
        lane_host + 74,
        "end_step() reads the status copy of the step before (already finished): "
        "a violation is reported",
        size=11.5,
    )
    svg.text(
        x0,
        lane_host + 92,
        "one step after it happened, and the host never waits for the GPU.",
        size=11.5,
    )
    return str(svg)


# --- the offsets plan ------------------------------------------------------------------


def offsets_plan_svg() -> str:
    """extend_seq_lens -> write_offsets (exclusive sums, capacity + 1) -> token ranges."""
    import numpy as np
    from kvcanary_numba import VerifyPlan, WritePlan
    from kvcanary_numba.plan import launch_canary_plan_kernels

    # Tutorial 02's batch: a prefill of 8, a decode, a padding entry, a decode; capacity 6.
    req_pool_indices, extend = np.array([1, 2, 0, 3]), np.array([8, 1, 0, 1])
    capacity, bs = 6, 4
    table = (16 * np.arange(5)[:, None] + np.arange(16)).astype(np.int32)
    plan = WritePlan.allocate(write_req_capacity=capacity)
    launch_canary_plan_kernels(
        verify_plan_out=VerifyPlan.allocate(verify_capacity=64),
        write_plan_out=plan,
        req_pool_indices=req_pool_indices,
        prefix_lens=np.array([0, 4, 0, 10]),
        extend_seq_lens=extend,
        req_to_token=table,
        swa_window_size=0,
        full_to_swa_index_mapping=None,
        verify_capacity=64,
        req_to_verify_expected_tokens=None,
        req_to_verify_expected_tokens_valid_lens=None,
        kv_token_id_vs_position_offset=0,
    )
    offsets = [int(v) for v in plan.write_offsets]
    assert len(offsets) == capacity + 1
    colours = ("#1e88e5", "#43a047", "#9e9e9e", "#8e24aa")
    cell, x0 = 46, 190
    svg = Svg(
        800,
        308,
        "write_offsets: the exclusive sums of the new-token counts, capacity + 1 entries",
    )
    svg.text(10, 40, "extend_seq_lens", size=12, mono=True)
    svg.text(10, 54, "batch entry r", size=10.5, fill=MUTED)
    for r in range(capacity):
        used = r < bs
        fill = "#ffffff" if used else "#f5f5f5"
        svg.rect(
            x0 + r * cell + cell / 2,
            26,
            cell,
            30,
            fill=fill,
            stroke=colours[r] if used else LINE,
            rx=0,
        )
        label = str(int(extend[r])) if used else "–"
        svg.text(
            x0 + r * cell + cell,
            46,
            label,
            size=13,
            anchor="middle",
            mono=True,
            fill=INK if used else LINE,
        )
        svg.text(
            x0 + r * cell + cell, 18, f"r={r}", size=10, anchor="middle", fill=MUTED
        )
    svg.text(
        x0 + bs * cell + cell / 2 + 4,
        70,
        "unused capacity (write_req_capacity = 6)",
        size=10.5,
        fill=MUTED,
    )
    svg.text(10, 110, "write_offsets", size=12, mono=True)
    svg.text(10, 124, "int64 [capacity + 1]", size=10.5, fill=MUTED)
    for i, value in enumerate(offsets):
        svg.rect(
            x0 + i * cell,
            96,
            cell,
            30,
            fill="#fff3e0" if i <= bs else "#f5f5f5",
            stroke="#fb8c00" if i <= bs else LINE,
            rx=0,
        )
        svg.text(
            x0 + i * cell + cell / 2,
            116,
            str(value),
            size=13,
            anchor="middle",
            mono=True,
        )
        svg.text(
            x0 + i * cell + cell / 2,
            140,
            f"[{i}]",
            size=10,
            anchor="middle",
            fill=MUTED,
        )
    for r in range(bs):  # each count adds between boundaries r and r + 1
        svg.path(
            f"M{x0 + r * cell + cell},56 L{x0 + (r + 1) * cell + cell / 2 - 6},94",
            arrow=True,
            stroke=LINE,
        )
    span = x0 + (capacity + 1) * cell
    svg.text(
        span + 8,
        110,
        f"{capacity} + 1 = {capacity + 1} entries",
        size=11.5,
        weight="bold",
        fill=ACCENT,
    )
    svg.text(span + 8, 126, "zeros after bs", size=10.5, fill=MUTED)
    # The token arrays the ranges index, one bracket per request below them.
    total, tw, ty = offsets[bs], 44, 178
    svg.text(10, ty + 6, "input_ids,", size=12, mono=True)
    svg.text(10, ty + 20, "positions,", size=12, mono=True)
    svg.text(10, ty + 34, "out_cache_loc", size=12, mono=True)
    owner = [r for r in range(bs) for _ in range(offsets[r + 1] - offsets[r])]
    for t in range(total):
        svg.rect(
            x0 + t * tw,
            ty,
            tw,
            28,
            fill="#ffffff",
            stroke=colours[owner[t]],
            rx=0,
            width=1.6,
        )
        svg.text(
            x0 + t * tw + tw / 2,
            ty + 19,
            str(t),
            size=11,
            anchor="middle",
            mono=True,
            fill=MUTED,
        )
    for r, level in (
        (0, 0),
        (1, 1),
        (3, 2),
        (2, 3),
    ):  # short ranges on lines of their own
        a, b = offsets[r], offsets[r + 1]
        left, right, y = x0 + a * tw, x0 + b * tw, ty + 40 + 16 * level
        if a == b:  # an empty range: a mark at its boundary
            svg.line(left, ty + 30, left, y, stroke=colours[r], dash="2 2")
        else:
            svg.path(
                f"M{left + 2},{y - 6} L{left + 2},{y} L{right - 2},{y} L{right - 2},{y - 6}",
                stroke=colours[r],
                width=1.4,
            )
        note = f"r={r}: [{a}, {b})" + (" empty (padding)" if a == b else "")
        if r == 0:
            svg.text(
                (left + right) / 2,
                y + 14,
                note,
                size=10.5,
                mono=True,
                fill=colours[r],
                anchor="middle",
            )
        else:
            svg.text(right + 6, y + 4, note, size=10.5, mono=True, fill=colours[r])
    svg.text(
        10,
        296,
        "Request r writes entries [write_offsets[r], write_offsets[r + 1]): n requests need n + 1 "
        "boundaries, even n = 0.",
        size=11.5,
    )
    return str(svg)


# --- the violation ring ----------------------------------------------------------------


def violation_ring_svg() -> str:
    """int64 [capacity, 8] rows, fill-once: the write index keeps counting past the capacity."""
    from kvcanary_numba.constants import VIOLATION_FIELD_NAMES

    capacity, recorded = 4, 6
    col_w, x0, top, row_h = 84, 64, 66, 24
    svg = Svg(
        x0 + 8 * col_w + 24,
        332,
        "The violation ring: int64 [capacity, 8] rows, filled once",
    )
    svg.text(
        x0,
        18,
        f"violation_ring: int64 [capacity, 8], capacity = {capacity}",
        size=12,
        mono=True,
    )
    for c, name in enumerate(
        VIOLATION_FIELD_NAMES
    ):  # staggered: the long names need two columns' room
        x, y = x0 + c * col_w + col_w / 2, top - 8 - 14 * (c % 2)
        svg.text(x, y, f"{c} {name}", size=10, anchor="middle", mono=True, fill=MUTED)
    for r in range(capacity):
        svg.text(
            x0 - 8,
            top + r * row_h + 16,
            f"row {r}",
            size=10.5,
            anchor="end",
            fill=MUTED,
        )
        for c in range(8):
            svg.rect(
                x0 + c * col_w,
                top + r * row_h,
                col_w,
                row_h,
                fill="#fff3e0",
                stroke="#fb8c00",
                rx=0,
            )
        svg.text(
            x0 + 4 * col_w,
            top + r * row_h + 16,
            f"violation #{r} (seq {r})",
            size=11,
            anchor="middle",
        )
    below = top + capacity * row_h + 20
    for k in range(capacity, recorded):
        y = below + (k - capacity) * 22
        svg.rect(x0, y, 8 * col_w, 18, fill="#fafafa", stroke=LINE, rx=0, dash="4 3")
        svg.text(
            x0 + 4 * col_w,
            y + 13,
            f"violation #{k}: seq {k} ≥ capacity, not stored",
            size=11,
            anchor="middle",
            fill=MUTED,
            italic=True,
        )
    y = below + (recorded - capacity) * 22 + 26
    svg.text(x0, y, "violation_write_index: int32 [1]", size=12, mono=True)
    svg.rect(x0 + 250, y - 16, 40, 22, fill="#ffffff", stroke=ACCENT, rx=2)
    svg.text(
        x0 + 270,
        y,
        str(recorded),
        size=13,
        anchor="middle",
        mono=True,
        weight="bold",
        fill=ACCENT,
    )
    svg.text(
        x0 + 304,
        y,
        f"= every violation so far; valid rows = min({recorded}, {capacity}) = "
        f"{min(recorded, capacity)}",
        size=11.5,
    )
    svg.text(
        x0,
        y + 28,
        "A kernel takes seq = atomicAdd(write_index, 1) and stores its row only if "
        "seq < capacity:",
        size=11.5,
    )
    svg.text(
        x0,
        y + 46,
        "the first rows survive a flood (fill-once), and the index still counts "
        "what was lost.",
        size=11.5,
    )
    return str(svg)


FIGURES = {
    "record.svg": record_svg,
    "chain.svg": chain_svg,
    "step-timeline.svg": step_timeline_svg,
    "offsets-plan.svg": offsets_plan_svg,
    "violation-ring.svg": violation_ring_svg,
}


def render() -> dict[str, str]:
    """File name -> SVG text of every figure."""
    return {name: draw() for name, draw in FIGURES.items()}


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, text in render().items():
        (OUT / name).write_text(text, encoding="utf-8")
        print(f"wrote {(OUT / name).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
