"""Tutorial pages: a download link, links that work on the site, folded solutions.

mkdocs-jupyter turns a notebook into HTML itself, so MkDocs never sees the links in
it: a link that works in Jupyter (``02-offsets-plan.ipynb``, ``../concepts/plans.md``)
would be broken on the site, where a notebook is the page ``tutorials/<name>/``, and a
broken one would not be reported. :func:`rewrite_links` does for notebook pages what
MkDocs does for Markdown ones: links to source files become links to their pages, and
a link to a page that does not exist is reported (a warning, which fails a strict
build). Links to generated pages (error catalogue, API reference, benchmarks) are
written in the notebooks as absolute links under ``site_url``, the only form that
works in Jupyter too; on the site they become relative, so the site works offline.

The notebook file itself is copied next to its page by mkdocs-jupyter
(``include_source``); :func:`download_link` puts a link to it at the top of the page.
Code cells tagged ``solution`` are folded into ``<details>`` by :func:`fold_solutions`, and
:func:`strip_cdn_loaders` drops the script loaders nbconvert adds for libraries on a CDN.
"""

from __future__ import annotations

import html
import posixpath
import re
import urllib.parse

SOLUTION_TAG = "solution"

_ATTR = re.compile(r'(?P<attr>\b(?:href|src))="(?P<url>[^"]*)"')
_DIV = re.compile(r"<div\b|</div>")

DOWNLOAD_ICON = (
    '<svg viewBox="0 0 24 24" aria-hidden="true"><path d="M11 3h2v10.2l3.6-3.6 1.4 1.4-6 6-6-6 '
    '1.4-1.4 3.6 3.6V3zM4 19h16v2H4z"/></svg>'
)


def download_link(filename: str) -> str:
    """The link to the page's notebook (a file beside the page, so the link is relative)."""
    name = html.escape(filename)
    return (
        f'<p class="kvc-download"><a class="md-button" href="{name}" download="{name}" '
        f'title="Download this notebook to run it in Jupyter">{DOWNLOAD_ICON} '
        f"Download <code>{name}</code></a></p>\n"
    )


def target_url(
    url: str, src_dir: str, site_url: str, pages: dict[str, str]
) -> str | None:
    """The site URL (from the site root) a notebook link means, or ``None`` if it names no page.

    ``pages`` maps source paths (``tutorials/01-quickstart.ipynb``, ``assets/x.svg``)
    and page URLs (``errors/KVC-P001/``) to site URLs.
    """
    path, hash_, anchor = url.partition("#")
    if path.startswith(site_url):
        site_path = path[len(site_url) :]
        found = pages.get(site_path) or pages.get(site_path.rstrip("/") + "/")
    else:
        found = pages.get(
            posixpath.normpath(posixpath.join(src_dir, urllib.parse.unquote(path)))
        )
    return None if found is None else found + hash_ + anchor


def is_rewritable(url: str, site_url: str) -> bool:
    """Relative links (not ``#anchor`` alone, no scheme) and absolute links into the site."""
    if url.startswith(site_url):
        return True
    parts = urllib.parse.urlsplit(url)
    return not (
        parts.scheme or parts.netloc or url.startswith(("#", "/")) or not parts.path
    )


def rewrite_links(
    content: str,
    page_url: str,
    src_dir: str,
    site_url: str,
    pages: dict[str, str],
    warn,
) -> str:
    """``content`` with every rewritable link relative to the page at ``page_url``.

    ``warn(message)`` is called for a link that names no page (left as it is).
    """
    from mkdocs.utils import get_relative_url

    def replace(match: re.Match) -> str:
        url = html.unescape(match["url"])
        if not is_rewritable(url, site_url):
            return match[0]
        found = target_url(url, src_dir, site_url, pages)
        if found is None:
            warn(f"link {url!r} points at no page or file of the site")
            return match[0]
        path, hash_, anchor = found.partition("#")
        return f'{match["attr"]}="{html.escape(get_relative_url(path, page_url) + hash_ + anchor)}"'

    return _ATTR.sub(replace, content)


_SCRIPT = re.compile(r"<script\b([^>]*)>(.*?)</script>", re.DOTALL | re.IGNORECASE)


def strip_cdn_loaders(content: str) -> tuple[str, int]:
    """``content`` without nbconvert's MathJax and Mermaid loaders; (new content, scripts removed).

    Both would fetch their library from a CDN (Mermaid only if a cell had a diagram,
    MathJax from an empty URL here); the notebooks use neither, and the site works offline.
    """
    removed = 0

    def drop(match: re.Match) -> str:
        nonlocal removed
        attrs, body = match[1], match[2].lower()
        if re.search(r'\bsrc=""', attrs) or "mathjax" in body or "mermaid" in body:
            removed += 1
            return ""
        return match[0]

    return _SCRIPT.sub(drop, content), removed


def element_end(content: str, start: int) -> int:
    """Index just past the ``</div>`` that closes the ``<div`` at ``start``."""
    depth = 0
    for match in _DIV.finditer(content, start):
        depth += 1 if match[0] == "<div" else -1
        if depth == 0:
            return match.end()
    raise ValueError(f"unclosed <div> at {start}")


def fold_solutions(
    content: str, summary: str = "Solution to exercise {n}"
) -> tuple[str, int]:
    """Code cells tagged ``solution`` wrapped in ``<details>``; (new content, cells folded).

    The n-th folded cell's summary is ``summary.format(n=n)``: a notebook's solutions
    follow its exercises in order, one cell each (``tests/test_notebooks.py``).

    nbconvert marks a tagged cell's outer ``<div>`` with the class ``celltag_<tag>``
    (the inner one repeats it, and is skipped as part of the outer).
    """
    marker = re.compile(rf'<div class="jp-Cell [^"]*\bcelltag_{SOLUTION_TAG}\b[^"]*"')
    out, pos, folded = [], 0, 0
    while (match := marker.search(content, pos)) is not None:
        end = element_end(content, match.start())
        label = html.escape(summary.format(n=folded + 1))
        out += [
            content[pos : match.start()],
            f'<details class="kvc-solution"><summary>{label}</summary>\n',
            content[match.start() : end],
            "\n</details>",
        ]
        pos, folded = end, folded + 1
    out.append(content[pos:])
    return "".join(out), folded
