"""MkDocs hooks: generate the error catalogue, API pages and benchmarks page at build time.

The pages are virtual files (nothing is written into ``docs/``), so the
catalogue always matches ``kvcanary_numba.errors.REGISTRY`` of the checkout
being built. ``on_config`` also fills the navigation for the generated pages
and refuses a ``site_url`` that disagrees with the URLs in error messages.
"""

from __future__ import annotations

import pathlib

import docgen_api
import docgen_bench
import docgen_errors
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE_DIR = ROOT / "kvcanary_numba"
RESULTS_DIR = ROOT / "benchmarks" / "results"
INTRO = '--8<-- "errors-intro.md"'


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
        nav.append({title: [{e.code: docgen_errors.page_path(e.code)} for e in entries]})
    return nav


def _nav_api() -> list:
    nav: list = ["api/index.md"]
    for title, modules in docgen_api.discover(PACKAGE_DIR).items():
        nav.append({title: [{dotted.rsplit(".", 1)[1]: docgen_api.page_path(dotted)} for dotted, _ in modules]})
    return nav


def on_config(config, **kwargs):
    errors = _registry()
    want = errors.DOCS_URL.rstrip("/") + "/"
    if config.site_url != want:
        raise PluginError(f"site_url is {config.site_url!r} but error messages link to {want!r}")
    generated = {"Error catalogue": _nav_errors(errors), "API reference": _nav_api()}
    for item in config.nav or ():
        if isinstance(item, dict):
            for title in item:
                if title in generated:
                    item[title] = generated[title]
    return config


def _add(files: Files, config, src_uri: str, content: str | bytes) -> None:
    existing = files.get_file_from_path(src_uri)
    if existing is not None:
        files.remove(existing)
    files.append(File.generated(config, src_uri, content=content))


def on_files(files: Files, config, **kwargs):
    errors = _registry()
    registry = errors.REGISTRY
    _add(files, config, "errors/index.md", docgen_errors.render_index(registry, errors.OPERATIONS, INTRO))
    for code, entry in registry.items():
        _add(files, config, docgen_errors.page_path(code), docgen_errors.render_entry(entry, registry))
    found = docgen_api.discover(PACKAGE_DIR)
    _add(files, config, "api/index.md", docgen_api.render_index(found))
    for modules in found.values():
        for dotted, _ in modules:
            _add(files, config, docgen_api.page_path(dotted), docgen_api.render_module(dotted))
    text, images = docgen_bench.render(RESULTS_DIR, "assets/benchmarks")
    _add(files, config, "benchmarks.md", text)
    for name, data in images.items():
        _add(files, config, name, data)
    return files


def on_page_content(html: str, page, config, files, **kwargs):
    """API pages: render Sphinx roles as plain code and link error codes to the catalogue."""
    if not page.file.src_uri.startswith("api/"):
        return html
    html = docgen_api.plain_roles(html)
    return docgen_errors.link_codes(html, "../" * page.url.count("/"), _registry().REGISTRY)
