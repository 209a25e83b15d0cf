"""Tutorial pages on the site: links, download link, folded solutions, outputs, no CDN.

``docs/hooks/docgen_notebooks.py`` is tested on small inputs first (no build), then the
built tutorial pages are read (``test_docs.build_site``, one build per test process).
"""

from __future__ import annotations

import html
import json
import pathlib
import re
import sys
import urllib.parse

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
TUTORIALS = ROOT / "docs" / "tutorials"
sys.path.insert(0, str(ROOT / "docs" / "hooks"))

import docgen_notebooks  # noqa: E402

SITE = "https://kvcanary-numba.readthedocs.io/en/latest/"
PAGES = {
    "tutorials/01-quickstart.ipynb": "tutorials/01-quickstart/",
    "tutorials/02-offsets-plan.ipynb": "tutorials/02-offsets-plan/",
    "concepts/plans.md": "concepts/plans/",
    "concepts/plans/": "concepts/plans/",
    "errors/KVC-P001/": "errors/KVC-P001/",
    "assets/figures/record.svg": "assets/figures/record.svg",
}


def _rewrite(content: str) -> tuple[str, list[str]]:
    warnings: list[str] = []
    out = docgen_notebooks.rewrite_links(content, "tutorials/01-quickstart/", "tutorials", SITE, PAGES, warnings.append)
    return out, warnings


@pytest.mark.parametrize(
    ("link", "on_the_site"),
    [
        ('href="02-offsets-plan.ipynb"', 'href="../02-offsets-plan/"'),
        ('href="../concepts/plans.md#the-1-rule"', 'href="../../concepts/plans/#the-1-rule"'),
        ('src="../assets/figures/record.svg"', 'src="../../assets/figures/record.svg"'),
        (f'href="{SITE}errors/KVC-P001/"', 'href="../../errors/KVC-P001/"'),
        ('href="#exercises"', 'href="#exercises"'),
        ('href="https://github.com/sgl-project/sglang"', 'href="https://github.com/sgl-project/sglang"'),
        ('href="mailto:x@example.org"', 'href="mailto:x@example.org"'),
    ],
)
def test_links_work_on_the_site(link, on_the_site):
    out, warnings = _rewrite(f"<p><a {link}>x</a></p>")
    assert out == f"<p><a {on_the_site}>x</a></p>" and warnings == []


@pytest.mark.parametrize("link", ["03-missing.ipynb", "../concepts/nowhere.md", f"{SITE}errors/KVC-X999/"])
def test_a_link_to_no_page_warns_and_stays(link):
    out, warnings = _rewrite(f'<a href="{link}">x</a>')
    assert out == f'<a href="{link}">x</a>' and len(warnings) == 1 and link in warnings[0]


CELLS = (
    '<div class="jp-Cell jp-MarkdownCell jp-Notebook-cell"><div class="inner"><p>Exercise</p></div></div>'
    '<div class="jp-Cell jp-CodeCell jp-Notebook-cell  celltag_solution">\n'
    '<div class="jp-Cell jp-CodeCell jp-Notebook-cell celltag_solution" id="cell-id=solution-1">'
    '<div class="jp-InputArea"><pre>assert x</pre></div><div class="jp-OutputArea"><pre>ok</pre></div></div>\n'
    "</div>"
    '<div class="jp-Cell jp-MarkdownCell jp-Notebook-cell"><p>Next</p></div>'
)


def test_solution_cells_are_folded_whole():
    out, folded = docgen_notebooks.fold_solutions(CELLS + CELLS)
    assert folded == 2
    assert out.count("<summary>Solution to exercise 1</summary>") == out.count("exercise 2</summary>") == 1
    out = out[: out.index("Next") + 4]
    inside = out[out.index("<details") : out.index("</details>")]
    assert "assert x" in inside and "ok" in inside and "Exercise" not in inside and "Next" not in inside
    assert inside.count("<div") == inside.count("</div>"), "the fold closes exactly the cell's elements"
    assert docgen_notebooks.fold_solutions(CELLS.replace("celltag_solution", "celltag_other")) == (
        CELLS.replace("celltag_solution", "celltag_other"),
        0,
    )


def test_cdn_loaders_are_dropped_and_other_scripts_kept():
    content = (
        '<script src=""> </script><script type="text/x-mathjax-config">init_mathjax()</script>'
        '<script type="module">import("https://cdn.example/mermaid.esm.mjs")</script>'
        "<script>copyButtons()</script>"
    )
    out, removed = docgen_notebooks.strip_cdn_loaders(content)
    assert (out, removed) == ("<script>copyButtons()</script>", 3)


def test_download_link_names_the_file_beside_the_page():
    link = docgen_notebooks.download_link("01-quickstart.ipynb")
    assert 'href="01-quickstart.ipynb"' in link and 'download="01-quickstart.ipynb"' in link


# --- the built pages -------------------------------------------------------------------


def _site() -> pathlib.Path:
    from test_docs import build_site

    return build_site()


def _article(page: pathlib.Path) -> str:
    text = page.read_text(encoding="utf-8")
    return text[text.index("<article") : text.index("</article>")]


NOTEBOOKS = sorted(TUTORIALS.glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_tutorial_page_shows_outputs_solutions_and_a_download(path):
    site = _site()
    page = site / "tutorials" / path.stem / "index.html"
    article = _article(page)
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    solutions = sum("solution" in c.get("metadata", {}).get("tags", ()) for c in cells)
    assert article.count('<details class="kvc-solution">') == solutions >= 2
    assert article.count("jp-OutputArea-output") >= 5, "the committed outputs are on the page"
    assert "In [ ]" not in article
    assert f'href="{path.name}" download=' in article
    assert (site / "tutorials" / path.stem / path.name).read_bytes() == path.read_bytes()
    assert "cdnjs" not in article and not re.search(r"src=\"(https?:)?//", article), "nothing from a CDN"


def _ids(page: pathlib.Path) -> set[str]:
    return set(re.findall(r'\bid="([^"]+)"', page.read_text(encoding="utf-8")))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_tutorial_links_and_pictures_resolve_in_the_site(path):
    """Every relative link of the article names a file of the site, and its anchor exists there."""
    site = _site()
    page = site / "tutorials" / path.stem / "index.html"
    checked = 0
    for attr, url in re.findall(r'\b(href|src)="([^"]*)"', _article(page)):
        url = html.unescape(url)
        parts = urllib.parse.urlsplit(url)
        if parts.scheme or parts.netloc or url.startswith("/") or not url:
            continue
        target = page.parent if not parts.path else (page.parent / urllib.parse.unquote(parts.path)).resolve()
        if target.is_dir():
            target = target / "index.html"
        assert target.is_file(), f"{path.name}: {attr}={url!r} names no file of the site"
        if parts.fragment:
            assert parts.fragment in _ids(target), f"{path.name}: {url!r}: no such anchor"
        checked += 1
    assert checked >= 5


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_table_of_contents_links_land_on_headings(path):
    """The page's table of contents (built from the notebook's Markdown) names ids that exist."""
    page = _site() / "tutorials" / path.stem / "index.html"
    text = page.read_text(encoding="utf-8")
    toc = text[text.index('data-md-component="toc"') :]
    toc = toc[: toc.index("</nav>")]
    anchors = re.findall(r'href="#([^"]+)"', toc)
    assert anchors and not set(anchors) - _ids(page), set(anchors) - _ids(page)
