"""Code on the site is at most 88 columns wide: no horizontal scrolling at 1280 px.

Pages include snippet sections (pymdownx.snippets, ``dedent_subsections``), so a line is
measured as the page shows it: after the section's common indentation is removed. The
tutorial notebooks' code cells are shown as they are. ``test_docs_browser.py`` checks the
rendered pages in a browser; these checks run without a build and name the line.
"""

from __future__ import annotations

import json
import pathlib
import re
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SNIPPETS = DOCS / "snippets"
MAX_COLUMNS = 88

_INCLUDE = re.compile(r'--8<--\s+"([^"]+)"')
_MARKER = re.compile(r"--8<-- \[(start|end):([\w-]+)\]")


def included() -> list[tuple[str, str]]:
    """(snippet file, section or "") of every code include in the hand-written pages and the hooks.

    Markdown snippets (an intro paragraph) are prose, not code blocks: left out.
    """
    texts = [p.read_text(encoding="utf-8") for p in DOCS.rglob("*.md")]
    texts += [p.read_text(encoding="utf-8") for p in (DOCS / "hooks").glob("*.py")]
    found = {tuple(t.partition(":")[::2]) for text in texts for t in _INCLUDE.findall(text)}
    return sorted(f for f in found if f[0].endswith(".py"))


def shown_lines(file: str, section: str) -> list[str]:
    """The lines a page shows for an include: the section, dedented; marker lines never."""
    lines = (SNIPPETS / file).read_text(encoding="utf-8").splitlines()
    if section:
        start = next(i for i, line in enumerate(lines) if f"[start:{section}]" in line)
        end = next(i for i, line in enumerate(lines) if f"[end:{section}]" in line)
        lines = lines[start + 1 : end]
    lines = [line for line in lines if not _MARKER.search(line)]
    return textwrap.dedent("\n".join(lines)).splitlines()


def test_shown_lines_dedent_a_section_and_drop_markers(tmp_path, monkeypatch):
    monkeypatch.setattr(__import__(__name__), "SNIPPETS", tmp_path)
    (tmp_path / "s.py").write_text("x = 1\n    # --8<-- [start:a]\n    if y:\n        z = 2\n    # --8<-- [end:a]\n")
    assert shown_lines("s.py", "a") == ["if y:", "    z = 2"]
    assert shown_lines("s.py", "") == ["x = 1", "    if y:", "        z = 2"]


@pytest.mark.parametrize(("file", "section"), included(), ids=lambda v: v or "whole")
def test_included_snippet_lines_fit(file, section):
    wide = [f"{len(line)}: {line}" for line in shown_lines(file, section) if len(line) > MAX_COLUMNS]
    assert not wide, f"{file}:{section} shows lines over {MAX_COLUMNS} columns:\n" + "\n".join(wide)


NOTEBOOKS = sorted((DOCS / "tutorials").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_code_cells_fit(path):
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    wide = [
        f"cell {i}, {len(line)}: {line}"
        for i, cell in enumerate(cells)
        if cell["cell_type"] == "code"
        for line in "".join(cell["source"]).splitlines()
        if len(line) > MAX_COLUMNS
    ]
    assert not wide, f"{path.name}: code lines over {MAX_COLUMNS} columns:\n" + "\n".join(wide)
