"""The built site in a real browser: serve it on localhost, load pages in headless Chromium.

Page loads use ``chromium --dump-dom``; the layout and search checks drive the
browser through chromedriver (W3C WebDriver over HTTP, no client library) at a
1280 px wide window. Skipped only when Chromium / chromedriver are missing
outside CI; with the ``CI`` environment variable set (``.ci/run`` installs
Debian's chromium and chromium-driver) a missing browser fails.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request

import pytest
from test_docs import build_site

from kvcanary_numba.errors import REGISTRY

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def _tool(name: str, package: str) -> str:
    path = shutil.which(name) or (f"/usr/bin/{name}" if os.path.exists(f"/usr/bin/{name}") else None)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is required in CI (.ci/run installs Debian's {package})")
        pytest.skip(f"{name} not installed (apt-get install {package})")
    return path


def _chromium() -> str:
    return _tool("chromium", "chromium")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        pass


@pytest.fixture(scope="module")
def site_url():
    chromium = _chromium()
    handler = functools.partial(_QuietHandler, directory=str(build_site()))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield chromium, f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def dump_dom(chromium: str, url: str, profile: pathlib.Path) -> str:
    """The DOM after the page loaded and its scripts ran."""
    proc = subprocess.run(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, f"chromium failed on {url}:\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_error_index_renders_every_code(site_url, tmp_path):
    chromium, base = site_url
    dom = dump_dom(chromium, base + "errors/", tmp_path)
    assert "<h1" in dom and "Error catalogue" in dom
    for code in REGISTRY:
        assert f'href="{code}/"' in dom, code
    # The filter box's script ran (it marks the box), so the page's JavaScript works.
    assert 'id="kvc-error-filter"' in dom and 'data-installed="1"' in dom


def test_model_error_page_renders(site_url, tmp_path):
    chromium, base = site_url
    dom = dump_dom(chromium, base + "errors/KVC-P001/", tmp_path)
    assert "write_offsets is empty" in dom
    assert "Example fix" in dom and "WritePlan.allocate" in dom


def test_tutorial_renders(site_url, tmp_path):
    chromium, base = site_url
    dom = dump_dom(chromium, base + "tutorials/01-quickstart/", tmp_path)
    assert "Quickstart: catch a planted corruption" in dom
    assert "launch_canary_verify_kernel" in dom  # the notebook's code cells are on the page
    assert "jp-Notebook" in dom or "jupyter-wrapper" in dom


def test_search_index_holds_every_code(site_url):
    _, base = site_url
    with urllib.request.urlopen(base + "search/search_index.json", timeout=30) as response:
        docs = json.load(response)["docs"]
    by_location = {d["location"]: d for d in docs}
    for code, entry in REGISTRY.items():
        page = by_location.get(f"errors/{code}/")
        assert page is not None, f"{code} has no search entry"
        assert code in page["title"], code
    # Message text is searchable too: the index page lists every template.
    index_text = " ".join(d["text"] for d in docs if d["location"].startswith("errors/#"))
    assert "length must be positive" in index_text


# --- layout and search, driven through chromedriver --------------------------------

#: Pasted SGLang log lines, with values -> the template the catalogue records for each.
PASTED_SGLANG = {
    "kv-canary: write_offsets_len must be positive, got 0": "kv-canary: write_offsets_len must be positive, got {n}",
    "kv-canary: launch_canary_plan_kernels supports at most bs=4096 reqs per launch, got bs=5000. "
    "Bump _PLAN_BS_BLOCK_SIZE if real workloads need this.": "kv-canary: launch_canary_plan_kernels supports at most bs=4096 reqs per launch, got bs={bs}. "
    "Bump _PLAN_BS_BLOCK_SIZE if real workloads need this.",
    "kv-canary: scatter_req_token_ids offsets length 4 != bs+1 (5)": "kv-canary: scatter_req_token_ids offsets length {len} != bs+1 ({bs+1})",
}


#: Elements of the article that scroll sideways (a code block too wide for the column), as text.
OVERFLOW_JS = """
const out = [];
const root = document.documentElement;
if (root.scrollWidth > root.clientWidth) out.push(`page ${root.scrollWidth} > ${root.clientWidth}`);
for (const el of document.querySelectorAll(".md-content *")) {
  const style = getComputedStyle(el).overflowX;
  if ((style === "auto" || style === "scroll") && el.scrollWidth > el.clientWidth + 1)
    out.push(`${el.tagName} ${el.scrollWidth} > ${el.clientWidth}: ${el.textContent.slice(0, 80)}`);
}
return out;
"""

RESULTS_JS = """
return Array.from(document.querySelectorAll(".md-search-result__item > .md-search-result__link"))
  .map(a => new URL(a.href).pathname);
"""


class WebDriver:
    """The few W3C WebDriver commands these tests need, spoken to chromedriver over HTTP."""

    def __init__(self, chromium: str, chromedriver: str, profile: pathlib.Path):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.base = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [chromedriver, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                self._call("GET", "/status")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        args = [*CHROMIUM_FLAGS, "--window-size=1280,900", f"--user-data-dir={profile}"]
        caps = {"alwaysMatch": {"goog:chromeOptions": {"binary": chromium, "args": args}}}
        self.session = "/session/" + self._call("POST", "/session", {"capabilities": caps})["sessionId"]

    def _call(self, method: str, path: str, body: dict | None = None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.load(response)["value"]

    def get(self, url: str) -> None:
        self._call("POST", self.session + "/url", {"url": url})

    def js(self, script: str, *args):
        return self._call("POST", self.session + "/execute/sync", {"script": script, "args": list(args)})

    def type_into(self, selector: str, text: str) -> None:
        element = self._call("POST", self.session + "/element", {"using": "css selector", "value": selector})
        self._call("POST", f"{self.session}/element/{next(iter(element.values()))}/value", {"text": text})

    def close(self) -> None:
        try:
            self._call("DELETE", self.session)
        finally:
            self.proc.terminate()
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def browser(site_url):
    chromium, base = site_url
    driver = WebDriver(chromium, _tool("chromedriver", "chromium-driver"), pathlib.Path(tempfile.mkdtemp()))
    try:
        yield driver, base
    finally:
        driver.close()


def test_error_pages_do_not_scroll_sideways_at_1280_px(browser):
    driver, base = browser
    assert driver.js("return window.innerWidth") == 1280
    wide = {}
    for code in sorted(REGISTRY):
        driver.get(f"{base}errors/{code}/")
        if found := driver.js(OVERFLOW_JS):
            wide[code] = found
    assert not wide, wide


def _hand_written_pages() -> list[str]:
    """Site paths of the concept pages, the tutorials and the home page."""
    root = pathlib.Path(__file__).resolve().parent.parent / "docs"
    pages = [""] + [
        f"concepts/{p.stem}/" if p.stem != "index" else "concepts/" for p in sorted((root / "concepts").glob("*.md"))
    ]
    return pages + ["tutorials/"] + [f"tutorials/{p.stem}/" for p in sorted((root / "tutorials").glob("*.ipynb"))]


#: For each <img> of the article: its source and whether it loaded.
IMAGES_JS = """
return Array.from(document.querySelectorAll(".md-content img"))
  .map(img => [img.getAttribute("src"), img.complete && img.naturalWidth > 0]);
"""


def test_concept_and_tutorial_pages_fit_1280_px_and_show_their_pictures(browser):
    """Code blocks (at most 88 columns), notebook cells and outputs fit the column; every picture
    is a file of the site (no CDN) and loads. One visit per page for both checks."""
    driver, base = browser
    wide, broken, pictures = {}, [], 0
    for page in _hand_written_pages():
        driver.get(base + page)
        if found := driver.js(OVERFLOW_JS):
            wide[page] = found
        for src, loaded in driver.js(IMAGES_JS):
            if src.startswith(("http:", "https:", "//")) or not loaded:
                broken.append((page, src, loaded))
            pictures += 1
    assert not wide, wide
    assert not broken and pictures >= 8, (broken, pictures)


def test_tutorial_download_link_and_folded_solutions(browser):
    driver, base = browser
    driver.get(base + "tutorials/02-offsets-plan/")
    href = driver.js("return document.querySelector('.kvc-download a').href")
    with urllib.request.urlopen(href, timeout=30) as response:
        notebook = json.load(response)
    assert notebook["cells"][0]["source"][0].startswith("# The offsets plan")
    assert any(c.get("outputs") for c in notebook["cells"] if c["cell_type"] == "code"), "with its outputs"
    state = driver.js(
        "return Array.from(document.querySelectorAll('details.kvc-solution'))"
        ".map(d => [d.open, d.querySelector('.jp-OutputArea') !== null])"
    )
    assert state and all(not is_open and has_output for is_open, has_output in state), state
    shown_tags = driver.js(
        "return Array.from(document.querySelectorAll('.celltoolbar'))"
        ".filter(e => getComputedStyle(e).display !== 'none').length"
    )
    assert shown_tags == 0, "cell tags are for the tests, not shown to readers"


def _search(driver: WebDriver, base: str, query: str) -> list[str]:
    """Paths of the result links once they stop changing (the box searches while it is typed into)."""
    driver.get(base + "errors/")
    driver.js(
        "const t = document.querySelector('[data-md-toggle=search]'); t.checked = true;"
        "t.dispatchEvent(new Event('change'));"
    )
    driver.type_into("input.md-search__input", query)
    last, stable, deadline = None, 0, time.monotonic() + 60
    while time.monotonic() < deadline:
        found = driver.js(RESULTS_JS)
        value = driver.js("return document.querySelector('input.md-search__input').value")
        stable = stable + 1 if found == last and found else 0
        if stable >= 4:
            return found
        last = found
        time.sleep(0.25)
    pytest.fail(f"search for {query!r} did not settle (box {value!r}): {last}")


@pytest.mark.parametrize(("message", "template"), sorted(PASTED_SGLANG.items()))
def test_search_finds_the_page_of_a_pasted_sglang_message(browser, message, template):
    driver, base = browser
    pages = {f"/errors/{code}/" for code, entry in REGISTRY.items() if template in entry.sglang}
    assert pages, f"no catalogue entry records {template!r}"
    found = _search(driver, base, message)
    assert found[0] in pages, (sorted(pages), found[:5])


def _ours(code: str, **fields) -> str:
    from kvcanary_numba.errors import error

    return str(error(code, **fields))


#: Pasted messages of ours, whole (with the ending that names the code) -> their code.
PASTED_OURS = {
    _ours("KVC-P001", function="launch_canary_plan_kernels", argument="write_plan_out.write_offsets", got=0): (
        "KVC-P001"
    ),
    _ours(
        "KVC-C002",
        function="launch_canary_write_kernel",
        argument="positions",
        expected="int64 or int32",
        got="float64",
    ): ("KVC-C002"),
}


@pytest.mark.parametrize(("message", "code"), sorted(PASTED_OURS.items()))
def test_search_finds_the_page_of_a_pasted_message_of_ours(browser, message, code):
    driver, base = browser
    found = _search(driver, base, message)
    assert found[0] == f"/errors/{code}/", found[:5]


#: Rows shown and the hint of the catalogue's filter box: (codes, hint text).
FILTER_JS = """
const box = document.getElementById("kvc-error-filter");
box.value = arguments[0];
box.dispatchEvent(new Event("input"));
const shown = Array.from(document.querySelectorAll(".md-typeset table tbody tr"))
  .filter(row => row.style.display !== "none")
  .map(row => row.querySelector("a").textContent.trim());
return [shown, document.getElementById("kvc-error-filter-hint").textContent];
"""


@pytest.mark.parametrize(
    ("text", "codes", "hint"),
    [
        ("kv-canary: write_offsets_len must be positive, got 0", ["KVC-P001"], "Codes whose message this is:"),
        ("kv-canary: scatter_req_token_ids offsets length 4 != bs+1 (5)", ["KVC-C004", "KVC-S001"], "Codes whose"),
        (next(m for m, c in PASTED_OURS.items() if c == "KVC-P001"), ["KVC-P001"], ""),
        ("write_offsets", None, ""),  # a word of a template: the rows holding it, as typed
        ("the write offsets are too short", 3, "No code's message matches; the three sharing"),
    ],
)
def test_the_catalogue_filter_finds_the_rows_of_a_pasted_message(browser, text, codes, hint):
    driver, base = browser
    driver.get(base + "errors/")
    shown, said = driver.js(FILTER_JS, text)
    if codes is None:
        assert shown and all(
            "write_offsets" in REGISTRY[c].message or "write_offsets" in REGISTRY[c].title for c in shown
        )
    elif isinstance(codes, int):
        assert len(shown) == codes and "KVC-P001" in shown
    else:
        assert sorted(shown) == codes
    assert said.startswith(hint)
