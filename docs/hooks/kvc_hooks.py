"""MkDocs hooks: generate the error catalogue, API pages and benchmarks page at build time.

They also finish the tutorial pages mkdocs-jupyter renders (``docgen_notebooks``):
a download link, the notebooks' links made to work on the site, folded solutions.

The pages are virtual files (nothing is written into ``docs/``), so the
catalogue always matches ``kvcanary_numba.errors.REGISTRY`` of the checkout
being built. ``on_config`` also fills the navigation for the generated pages
and refuses a ``site_url`` that disagrees with the URLs in error messages
(``mkdocs serve`` replaces the host with its own address: there only the path
must agree).
"""

from __future__ import annotations

import logging
import pathlib
import posixpath
import urllib.parse

import docgen_api
import docgen_bench
import docgen_errors
import docgen_notebooks
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files, InclusionLevel

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE_DIR = ROOT / "kvcanary_numba"
RESULTS_DIR = ROOT / "benchmarks" / "results"
INTRO = '--8<-- "errors-intro.md"'
#: Rendered benchmark plots, kept between builds (keyed by what they draw; git-ignored).
PLOT_CACHE = ROOT / ".cache" / "docs-plots"

log = logging.getLogger("mkdocs.hooks.kvc_hooks")


def _registry():
    """The errors package (imported lazily so a broken package fails the build, not the hook import)."""
    import kvcanary_numba.errors as errors

    return errors


def _short(operation: str) -> str:
    return operation.split(" (")[0]


def _nav_errors(errors) -> list:
    groups = docgen_errors.group_by_operation(errors.REGISTRY, errors.OPERATIONS)
    nav: list = ["errors/index.md"]
    for letter, entries in groups.items():
        title = _short(errors.OPERATIONS.get(letter, letter))
        nav.append(
            {title: [{e.code: docgen_errors.page_path(e.code)} for e in entries]}
        )
    return nav


def _nav_api() -> list:
    nav: list = ["api/index.md"]
    for title, modules in docgen_api.discover(PACKAGE_DIR).items():
        nav.append(
            {
                title: [
                    {dotted.rsplit(".", 1)[1]: docgen_api.page_path(dotted)}
                    for dotted, _ in modules
                ]
            }
        )
    return nav


_COMMAND: dict[str, str] = {}


def on_startup(command: str, **kwargs):
    _COMMAND["name"] = command


def check_site_url(site_url: str, docs_url: str, command: str) -> None:
    """Raise ``PluginError`` unless ``site_url`` is where error messages link to.

    Under ``mkdocs serve`` the site lives at ``http://<dev_addr><path of site_url>``,
    so only the path is compared there.
    """
    want = docs_url.rstrip("/") + "/"
    if command == "serve":
        got, want = (
            urllib.parse.urlsplit(site_url or "").path,
            urllib.parse.urlsplit(want).path,
        )
    else:
        got = site_url
    if got != want:
        raise PluginError(
            f"site_url is {site_url!r} but error messages link to {want!r}"
        )


def on_config(config, **kwargs):
    errors = _registry()
    check_site_url(config.site_url, errors.DOCS_URL, _COMMAND.get("name", "build"))
    generated = {"Error catalogue": _nav_errors(errors), "API reference": _nav_api()}
    for item in config.nav or ():
        if isinstance(item, dict):
            for title in item:
                if title in generated:
                    item[title] = generated[title]
    return config


def _add(
    files: Files, config, src_uri: str, content: str | bytes, *, in_nav: bool = True
) -> None:
    existing = files.get_file_from_path(src_uri)
    if existing is not None:
        files.remove(existing)
    inclusion = InclusionLevel.UNDEFINED if in_nav else InclusionLevel.NOT_IN_NAV
    files.append(File.generated(config, src_uri, content=content, inclusion=inclusion))


def on_files(files: Files, config, **kwargs):
    errors = _registry()
    registry = errors.REGISTRY
    _add(
        files,
        config,
        "errors/index.md",
        docgen_errors.render_index(registry, errors.OPERATIONS, INTRO),
    )
    for code, entry in registry.items():
        _add(
            files,
            config,
            docgen_errors.page_path(code),
            docgen_errors.render_entry(entry, registry),
        )
    found = docgen_api.discover(PACKAGE_DIR)
    _add(files, config, "api/index.md", docgen_api.render_index(found))
    for modules in found.values():
        for dotted, _ in modules:
            _add(
                files,
                config,
                docgen_api.page_path(dotted),
                docgen_api.render_module(dotted),
            )
    pages, images = docgen_bench.render(RESULTS_DIR, "assets/benchmarks", PLOT_CACHE)
    for (
        src_uri,
        text,
    ) in (
        pages.items()
    ):  # run pages are linked from benchmarks.md, not listed in the nav
        _add(files, config, src_uri, text, in_nav=src_uri == "benchmarks.md")
    for name, data in images.items():
        _add(files, config, name, data)
    return files


def _site_urls(files) -> dict[str, str]:
    """Source path -> site URL of every file, and page URL -> page URL (for links under site_url)."""
    urls = {}
    for f in files:
        urls[f.src_uri] = f.url
        if f.is_documentation_page():
            urls[f.url] = f.url
    return urls


def _finish_notebook(html: str, page, config, files) -> str:
    src = page.file.src_uri

    def warn(message: str) -> None:
        log.warning(f"{src}: {message}")  # a warning fails the strict build

    html = docgen_notebooks.rewrite_links(
        html, page.url, posixpath.dirname(src), config.site_url, _site_urls(files), warn
    )
    html, _ = docgen_notebooks.fold_solutions(html)
    html, _ = docgen_notebooks.strip_cdn_loaders(html)
    return docgen_notebooks.download_link(posixpath.basename(src)) + html


def on_page_content(html: str, page, config, files, **kwargs):
    """API pages: render Sphinx roles as plain code. Tutorial pages: see ``docgen_notebooks``."""
    if page.file.src_uri.endswith(".ipynb"):
        return _finish_notebook(html, page, config, files)
    if not page.file.src_uri.startswith("api/"):
        return html
    return docgen_api.plain_roles(html)


def on_post_page(output: str, page, config, **kwargs):
    """API pages: link error codes to the catalogue.

    Done on the finished page: at ``on_page_content`` time mkdocstrings'
    cross-references are still placeholders, and codes after one were missed.
    """
    if not page.file.src_uri.startswith("api/"):
        return output
    return docgen_errors.link_codes(
        output, "../" * page.url.count("/"), _registry().REGISTRY
    )
