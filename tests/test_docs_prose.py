"""What the documentation sources say about themselves: the product, not the project's history.

Pages, snippets, hooks and notebooks (outputs included) speak of the product. They date a
measurement by its date, commit and GPU, never by a work session of the project, and they
cite documents a reader can open, never notes that are not in the repository.
"""

from __future__ import annotations

import pathlib
import re

import pytest

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
TEXT = sorted(p for p in DOCS.rglob("*") if p.is_file() and p.suffix in {".md", ".py", ".ipynb", ".svg", ".css", ".js"})


def _ids(path: pathlib.Path) -> str:
    return str(path.relative_to(DOCS))


@pytest.mark.parametrize("path", TEXT, ids=_ids)
def test_no_work_session_is_named(path):
    found = re.findall(r".{0,40}\bsession \d+.{0,40}", path.read_text(encoding="utf-8"), re.IGNORECASE)
    assert not found, found


@pytest.mark.parametrize("path", TEXT, ids=_ids)
def test_no_document_outside_the_repository_is_cited(path):
    found = re.findall(r".{0,40}(?:reference notes|§\s*\d).{0,40}", path.read_text(encoding="utf-8"), re.IGNORECASE)
    assert not found, found


def test_sglang_page_has_the_sections_the_semantics_page_links():
    """semantics.md says "as SGLang" with a link to each operation on sglang.md."""
    semantics = (DOCS / "concepts" / "semantics.md").read_text(encoding="utf-8")
    sglang = (DOCS / "concepts" / "sglang.md").read_text(encoding="utf-8")
    anchors = set(re.findall(r"\]\(sglang\.md#([\w-]+)\)", semantics))
    headings = {
        re.sub(r"[^\w\s-]", "", h).strip().lower().replace(" ", "-")
        for h in re.findall(r"^## (.+)$", sglang, re.MULTILINE)
    }
    assert {"plan", "write", "verify", "hashes-and-the-fingerprint-fold", "the-violation-ring"} <= anchors
    assert anchors <= headings, anchors - headings


def test_result_files_cited_by_the_pages_exist():
    """A measurement cited as ``benchmarks/results/...`` names a file or folder of the repository,
    so a renamed or removed record shows up here, with the pages to update."""
    root = DOCS.parent
    cited = {
        (path.rstrip(".,;:"), _ids(page))
        for page in TEXT
        if page.suffix == ".md"
        for path in re.findall(r"benchmarks/results/[\w./-]+", page.read_text(encoding="utf-8"))
    }
    missing = sorted((path, page) for path, page in cited if not (root / path).exists())
    assert not missing, missing
