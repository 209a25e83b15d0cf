"""The documentation site: strict build, one catalogue page per code, tested code blocks.

``build_site()`` builds the site once per test process (``mkdocs build --strict``)
and is shared with ``test_docs_browser.py``. The generators in ``docs/hooks/`` are
also tested directly, without a build, in ``test_docs_generators.py``.
"""

from __future__ import annotations

import atexit
import html
import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

from kvcanary_numba.errors import DOCS_URL, REGISTRY, docs_url

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SNIPPETS = DOCS / "snippets"
sys.path.insert(0, str(DOCS / "hooks"))

import docgen_api  # noqa: E402

_BUILD: dict[str, object] = {}


#: Modules the site build imports (the ``docs`` extra): without one, build tests skip.
DOCS_MODULES = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python", "mkdocs_jupyter", "matplotlib")


def _missing_docs_module() -> str | None:
    for name in DOCS_MODULES:
        try:
            if importlib.util.find_spec(name) is None:
                return name
        except ModuleNotFoundError:  # a parent package is missing
            return name
    return None


def build_site() -> pathlib.Path:
    """Build the site with ``mkdocs build --strict`` once per process; fail with its log.

    Skips the calling test when the ``docs`` extra is not installed.
    """
    missing = _missing_docs_module()
    if missing is not None:
        pytest.skip(f"{missing} is not installed (pip install -e '.[docs]'): the site cannot be built")
    if not _BUILD:
        out = pathlib.Path(tempfile.mkdtemp(prefix="kvcanary-site-"))
        atexit.register(shutil.rmtree, out, ignore_errors=True)
        proc = subprocess.run(
            [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=900,
            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        )
        _BUILD.update(site=out, rc=proc.returncode, log=proc.stdout + proc.stderr)
    if _BUILD["rc"] != 0:
        pytest.fail(f"mkdocs build --strict failed:\n{_BUILD['log'][-8000:]}")
    return _BUILD["site"]  # type: ignore[return-value]


def page_text(site: pathlib.Path, url_path: str) -> str:
    return (site / url_path / "index.html").read_text(encoding="utf-8")


# --- the build -------------------------------------------------------------------------


def test_site_builds_strict():
    site = build_site()
    assert (site / "index.html").is_file()
    assert (site / "search" / "search_index.json").is_file()


def test_site_url_is_the_registry_docs_url():
    match = re.search(r"^site_url:\s*(\S+)\s*$", (ROOT / "mkdocs.yml").read_text(), re.MULTILINE)
    assert match, "mkdocs.yml has no site_url"
    site_url = match.group(1)
    assert site_url == DOCS_URL.rstrip("/") + "/"
    for code in REGISTRY:
        assert docs_url(code) == f"{site_url}errors/{code}/"


def test_site_url_check_accepts_serve_address_and_refuses_a_wrong_url():
    sys.path.insert(0, str(DOCS / "hooks"))
    import kvc_hooks
    from mkdocs.exceptions import PluginError

    kvc_hooks.check_site_url(DOCS_URL + "/", DOCS_URL, "build")
    kvc_hooks.check_site_url("http://127.0.0.1:8000/en/latest/", DOCS_URL, "serve")  # what serve sets
    with pytest.raises(PluginError):
        kvc_hooks.check_site_url("http://127.0.0.1:8000/en/latest/", DOCS_URL, "build")
    with pytest.raises(PluginError):
        kvc_hooks.check_site_url("http://127.0.0.1:8000/", DOCS_URL, "serve")


def test_mkdocs_serve_serves_the_error_pages(tmp_path):
    """``mkdocs serve`` (the README's first docs command) starts and serves a catalogue page."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/en/latest/errors/KVC-P001/"
    with open(tmp_path / "serve.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mkdocs", "serve", "--no-livereload", "-a", f"127.0.0.1:{port}"],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        )
        try:
            body = _wait_for_page(proc, url, tmp_path / "serve.log")
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    assert "write_offsets is empty" in body


def _wait_for_page(proc, url: str, log: pathlib.Path) -> str:
    import time
    import urllib.request

    deadline = time.monotonic() + 600
    while True:
        assert proc.poll() is None, "mkdocs serve exited:\n" + log.read_text()[-5000:]
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return response.read().decode()
        except OSError:
            assert time.monotonic() < deadline, "mkdocs serve did not come up:\n" + log.read_text()[-5000:]
            time.sleep(1)


@pytest.mark.parametrize("code", sorted(REGISTRY))
def test_every_code_has_a_page(code):
    entry = REGISTRY[code]
    text = html.unescape(re.sub(r"<[^>]+>", "", page_text(build_site(), f"errors/{code}")))
    assert f"{code}: {entry.title}" in text
    assert entry.message in text
    for heading in (
        "What it means",
        "When it happens",
        "How to fix it",
        "Example fix",
        "Defensive pattern",
        "Prevention",
        "Related errors",
        "SGLang counterpart",
    ):
        assert heading in text, f"{code}: section {heading!r} missing"
    for sglang in entry.sglang:
        assert sglang in text


def test_every_sglang_message_is_a_search_section_of_its_page():
    """Each recorded SGLang message is the title of a search-index section of its code's page."""
    docs = json.loads((build_site() / "search" / "search_index.json").read_text())["docs"]
    titles = {(d["location"].split("#")[0], html.unescape(re.sub(r"<[^>]+>", "", d["title"]))) for d in docs}
    missing = [
        (code, m) for code, entry in REGISTRY.items() for m in entry.sglang if (f"errors/{code}/", m) not in titles
    ]
    assert not missing, missing


def test_every_message_ending_is_on_its_page():
    for code, entry in REGISTRY.items():
        text = html.unescape(re.sub(r"<[^>]+>", "", page_text(build_site(), f"errors/{code}")))
        assert entry.ending in text and f"kvcanary explain {code}" in text, code


def test_error_index_lists_every_code_under_its_operation():
    text = page_text(build_site(), "errors")
    sections = re.split(r"<h2 ", text)
    for code, entry in REGISTRY.items():
        section = next((s for s in sections if html.escape(entry.operation, quote=False) in s.split("</h2>")[0]), None)
        assert section is not None, f"no index section for {entry.operation!r}"
        assert f'href="{code}/"' in section, f"{code} not linked in its operation's table"
    assert 'id="kvc-error-filter"' in text
    assert "KVC-P001" in sections[0], "the model entry is featured in the intro"


def test_api_reference_has_a_page_per_module():
    site = build_site()
    found = docgen_api.discover(ROOT / "kvcanary_numba")
    public = {dotted for dotted, _ in found["Public API"]}
    for name in ("plan", "write", "verify", "scatter", "fingerprint", "plans", "context", "errors"):
        assert f"kvcanary_numba.{name}" in public
    for modules in found.values():
        for dotted, _ in modules:
            page = site / docgen_api.page_path(dotted).removesuffix(".md") / "index.html"
            assert page.is_file(), dotted
    text = page_text(site, "api/verify")
    assert "launch_canary_verify_kernel" in text
    assert 'href="../../errors/KVC-V001/"' in text  # codes in Raises sections link to the catalogue


def test_public_parameters_are_documented_one_by_one():
    """No grouped ``a, b : type`` entry in the public functions' docstrings (the API page would copy it)."""
    grouped = re.compile(r"^    \w+(?:, \w+)+ : ", re.MULTILINE)
    found = [
        f"{name}.py: {m.group(0).strip()}"
        for name in ("plan", "write", "verify", "scatter", "fingerprint")
        for m in grouped.finditer((ROOT / "kvcanary_numba" / f"{name}.py").read_text(encoding="utf-8"))
    ]
    assert not found, found


def test_api_pages_link_every_registered_code():
    site = build_site()
    unlinked = []
    for page in (site / "api").rglob("index.html"):
        text = re.sub(r"<a\b[^>]*>.*?</a>", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
        text = re.sub(r"<(script|title)\b.*?</\1>|<[^>]+>", "", text, flags=re.DOTALL)  # text only
        unlinked += [f"{page.relative_to(site)}: {c}" for c in re.findall(r"KVC-[A-Z]\d{3}", text) if c in REGISTRY]
    assert not unlinked, unlinked[:20]


def test_benchmarks_page_is_built():
    text = page_text(build_site(), "benchmarks")
    assert "Benchmarks" in text
    if not list((ROOT / "benchmarks" / "results").glob("*.json")):
        assert "No results yet" in text


# --- snippets and code blocks ----------------------------------------------------------

SNIPPET_FILES = sorted(SNIPPETS.glob("*.py"))
_INCLUDE = re.compile(r'--8<--\s+"([^"]+)"')
_FENCE = re.compile(r"^(`{3,})([^\n`]*)\n(.*?)^\1\s*$", re.MULTILINE | re.DOTALL)


def _markdown_sources() -> dict[str, str]:
    """Hand-written Markdown, plus the Markdown the hooks generate around includes."""
    sources = {str(p.relative_to(DOCS)): p.read_text(encoding="utf-8") for p in DOCS.rglob("*.md")}
    sources["hooks"] = "\n".join(p.read_text(encoding="utf-8") for p in (DOCS / "hooks").glob("*.py"))
    return sources


@pytest.mark.parametrize("path", SNIPPET_FILES, ids=lambda p: p.name)
def test_snippet_runs(path):
    proc = subprocess.run([sys.executable, path.name], cwd=SNIPPETS, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{path.name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"


def _section(file: str, section: str) -> list[str]:
    body = (SNIPPETS / file).read_text(encoding="utf-8").splitlines()
    start = body.index(f"# --8<-- [start:{section}]")
    return body[start + 1 : body.index(f"# --8<-- [end:{section}]")]


def test_readme_quickstart_is_the_tested_snippet_in_at_most_15_lines():
    """The README shows the quickstart itself (``test_snippet_runs`` and test_cli.py run it)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = [body for _fence, language, body in _FENCE.findall(readme) if language.strip() == "python"]
    shown = _section("quickstart.py", "quickstart")
    assert blocks == ["\n".join(shown) + "\n"], "the README's Python block is docs/snippets/quickstart.py's section"
    assert len(shown) <= 15 and max(map(len, shown)) <= 88, (len(shown), max(map(len, shown)))
    assert "launch_canary_plan_kernels" in blocks[0] and "slot 0" in blocks[0]


def test_every_include_resolves_to_a_file_and_section():
    for name, text in _markdown_sources().items():
        for target in _INCLUDE.findall(text):
            file, _, section = target.partition(":")
            path = SNIPPETS / file
            assert path.is_file(), f"{name}: includes missing {file}"
            if section:
                body = path.read_text(encoding="utf-8")
                assert f"--8<-- [start:{section}]" in body and f"--8<-- [end:{section}]" in body, (
                    f"{name}: section {section!r} not marked in {file}"
                )


def test_every_snippet_is_included_somewhere():
    included = {t.partition(":")[0] for text in _markdown_sources().values() for t in _INCLUDE.findall(text)}
    imported = {"tiny_engine.py"}  # imported by faults.py as well as included
    for path in SNIPPETS.iterdir():
        if path.suffix in (".py", ".md"):
            assert path.name in included or path.name in imported, f"{path.name} is not used by any page"


#: The one shell command a page shows: tests/test_notebooks.py checks it against pyproject's extra.
TUTORIALS_INSTALL = 'python -m pip install "kvcanary_numba[tutorials]"'


def test_every_code_block_comes_from_a_snippet():
    for name, text in _markdown_sources().items():
        if name == "hooks":
            continue
        for _fence, language, body in _FENCE.findall(text):
            if language.strip() == "bash" and body.strip() == TUTORIALS_INSTALL:
                continue
            assert _INCLUDE.fullmatch(body.strip()), (
                f"{name}: code block not pulled from a tested snippet file:\n{body[:300]}"
            )
