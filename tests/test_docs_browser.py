"""The built site in a real browser: serve it on localhost, load pages in headless Chromium.

Skipped only when Chromium is missing outside CI; with the ``CI`` environment
variable set (``.ci/run`` installs Debian's chromium) a missing browser fails.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import pathlib
import shutil
import subprocess
import threading
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


def _chromium() -> str:
    path = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium is required in CI (.ci/run installs Debian's chromium)")
        pytest.skip("Chromium not installed (apt-get install chromium)")
    return path


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
