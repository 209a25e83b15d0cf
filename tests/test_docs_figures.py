"""The pictures under docs/assets/figures: drawn by docs/hooks/docgen_figures.py from package values.

The SVG files are committed; these tests fail when a file is not what the generator
draws now (regenerate: ``python docs/hooks/docgen_figures.py``), when a picture shows
a value the package does not compute, or when a page still loads a diagram from a CDN.
"""

from __future__ import annotations

import json
import pathlib
import re
import sys
import xml.etree.ElementTree as ET

import pytest

from kvcanary_numba import CANARY_CHAIN_HEAD
from kvcanary_numba.constants import VIOLATION_FIELD_NAMES
from kvcanary_numba.hashing import splitmix64_mix3

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
FIGURES = DOCS / "assets" / "figures"
sys.path.insert(0, str(DOCS / "hooks"))

import docgen_figures  # noqa: E402

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def drawn() -> dict[str, str]:
    return docgen_figures.render()


def texts(svg: str, **attributes: str) -> list[str]:
    """The text nodes of a picture (with these attribute values), in document order."""
    nodes = ET.fromstring(svg).iter(f"{SVG}text")
    return [n.text or "" for n in nodes if all(n.get(k.replace("_", "-")) == v for k, v in attributes.items())]


def test_committed_figures_are_what_the_generator_draws(drawn):
    assert sorted(drawn) == sorted(p.name for p in FIGURES.glob("*.svg"))
    stale = [name for name, svg in drawn.items() if (FIGURES / name).read_text(encoding="utf-8") != svg]
    assert not stale, f"regenerate with `python docs/hooks/docgen_figures.py`: {stale}"


@pytest.mark.parametrize("name", sorted(docgen_figures.FIGURES))
def test_figure_is_a_self_contained_svg(drawn, name):
    root = ET.fromstring(drawn[name])
    assert root.tag == f"{SVG}svg" and root.get("viewBox") and root.find(f"{SVG}title").text
    assert not re.search(r"(?:href|src)=\"(?!#)", drawn[name]), "no external resource"
    assert "http" not in drawn[name].replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_record_shows_field_offsets_and_the_little_endian_example(drawn):
    shown = texts(drawn["record.svg"])
    assert [t for t in shown if t.startswith("@")] == ["@0", "@8", "@16", "@24"]
    head_bytes = [f"{b:02X}" for b in CANARY_CHAIN_HEAD.to_bytes(8, "little")]
    byte_cells = texts(drawn["record.svg"], y="76")[:-1]  # the row of byte cells, then "… stride"
    assert byte_cells == ["65"] + ["00"] * 15 + head_bytes + ["00"] * 8  # token 101, position 0, head, 0
    assert any(t.startswith(name) for t in shown for name in ("token", "position", "prev_hash", "real_kv_hash"))


def test_chain_shows_the_head_and_the_links_the_package_computes(drawn):
    shown = " ".join(texts(drawn["chain.svg"]))
    h0 = splitmix64_mix3(CANARY_CHAIN_HEAD, 101, 0)
    h1 = splitmix64_mix3(h0, 102, 1)
    for value in (0xC0FFEE1234567890, CANARY_CHAIN_HEAD, h0, h1):
        assert f"0x{value:016X}" in shown
    assert "mix3(prev_hash, token, position)" in shown


def test_offsets_plan_shows_capacity_plus_one_exclusive_sums(drawn):
    assert texts(drawn["offsets-plan.svg"], y="116") == ["0", "8", "9", "9", "10", "0", "0"]
    assert "6 + 1 = 7 entries" in texts(drawn["offsets-plan.svg"])


def test_violation_ring_names_every_column(drawn):
    shown = texts(drawn["violation-ring.svg"])
    assert [t.split(" ", 1)[1] for t in shown if re.match(r"\d \w", t)] == list(VIOLATION_FIELD_NAMES)
    assert "violation_write_index: int32 [1]" in shown


def test_every_figure_is_shown_and_no_page_draws_with_mermaid():
    pages = {p: p.read_text(encoding="utf-8") for p in DOCS.rglob("*.md")}
    notebooks = {
        p: "".join("".join(c["source"]) for c in json.loads(p.read_text(encoding="utf-8"))["cells"])
        for p in (DOCS / "tutorials").glob("*.ipynb")
    }
    for name in docgen_figures.FIGURES:
        in_pages = [p for p, text in pages.items() if f"../assets/figures/{name}" in text]
        in_notebooks = [p for p, text in notebooks.items() if f"../assets/figures/{name}" in text]
        assert in_pages or in_notebooks, f"{name} is not used"
    assert not any("```mermaid" in text for text in pages.values())
    assert "mermaid" not in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
