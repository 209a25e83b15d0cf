"""The error catalogue's examples run exactly as printed: taken from the built pages, pasted into a
fresh interpreter that has nothing but the package (``tests/catalogue_examples.py``), each snippet
in a clean namespace. Before raises its entry's code, After runs. ``kvcanary explain`` prints the
same snippets, and each is self-contained (a static check that needs no build).
"""

from __future__ import annotations

import ast
import builtins
import html
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import textwrap

import pytest
from catalogue_examples import is_shell
from test_docs import build_site

from kvcanary_numba.cli import format_entry
from kvcanary_numba.errors import REGISTRY

ROOT = pathlib.Path(__file__).resolve().parent.parent
CODES = sorted(REGISTRY)
_BOX = re.compile(r'<div class="kvc-wrap kvc-(before|after)">(.*?)</code>', re.DOTALL)
_TAG = re.compile(r"<[^>]+>")


def page_examples(page: str) -> dict[str, str]:
    """``{"before": text, "after": text}`` of a built error page: the code as a reader copies it."""
    found = {}
    for role, box in _BOX.findall(page):
        code = box[box.index("<code>") + len("<code>") :]
        found[role] = html.unescape(_TAG.sub("", code)).rstrip("\n")
    return found


def test_page_examples_reads_highlighted_code_back():
    page = (
        '<div class="kvc-wrap kvc-before">\n<div class="highlight"><pre><span></span><code>'
        '<a id="l1" href="#l1"></a><span class="n">x</span> <span class="o">=</span> '
        '<span class="s2">&quot;a&lt;b&quot;</span>\n</code></pre></div>\n</div>'
    )
    assert page_examples(page) == {"before": 'x = "a<b"'}


_SHOWN: dict[str, dict[str, str]] = {}
_OUTCOMES: dict[str, list[str]] = {}


def shown() -> dict[str, dict[str, str]]:
    """Code -> the examples its built page shows (the site is built once per test process)."""
    if not _SHOWN:
        site = build_site()
        for code in CODES:
            _SHOWN[code] = page_examples((site / "errors" / code / "index.html").read_text(encoding="utf-8"))
    return _SHOWN


def outcomes() -> dict[str, list[str]]:
    """Every page's Before and After, run in one fresh interpreter with the package alone on its path."""
    if not _OUTCOMES:
        snippets = {code: [pair["before"], pair["after"]] for code, pair in shown().items()}
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(PYTHONPATH=str(ROOT), NUMBA_ENABLE_CUDASIM="0")  # this checkout's package; a CPU
        proc = subprocess.run(
            [sys.executable, str(ROOT / "tests" / "catalogue_examples.py")],
            input=json.dumps(snippets),
            capture_output=True,
            text=True,
            timeout=900,
            env=env,
            cwd=tempfile.mkdtemp(prefix="kvc-examples-"),
        )
        assert proc.returncode == 0, proc.stderr[-5000:]
        _OUTCOMES.update(json.loads(proc.stdout.splitlines()[-1]))
    return _OUTCOMES


@pytest.mark.parametrize("code", CODES)
def test_page_shows_the_registrys_examples(code):
    entry = REGISTRY[code]
    assert shown()[code] == {"before": entry.before, "after": entry.after}


@pytest.mark.parametrize("code", CODES)
def test_example_before_raises_its_code_and_after_runs_as_printed(code):
    before, after = outcomes()[code]
    assert before == code, f"{code}: 'Before' should raise {code}, got {before}"
    assert after == "ran", f"{code}: 'After' should run, got {after}"


# --- without a build: explain prints them, and each stands alone ------------------------------


def _explained(text: str, title: str) -> str:
    """The indented block under ``title`` in ``kvcanary explain``'s output, dedented."""
    lines = text.splitlines()
    start = lines.index(title) + 1
    block = []
    for line in lines[start:]:
        if line and not line.startswith("    "):
            break
        block.append(line)
    return textwrap.dedent("\n".join(block)).strip("\n")


@pytest.mark.parametrize("code", CODES)
def test_explain_prints_the_same_examples(code):
    entry, text = REGISTRY[code], format_entry(REGISTRY[code])
    assert _explained(text, "Before") == entry.before
    assert _explained(text, "After") == entry.after


def free_names(snippet: str) -> set[str]:
    """Names a Python snippet reads but never binds (neither assigned, imported nor builtin)."""
    tree = ast.parse(snippet)
    bound, loaded = set(dir(builtins)), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return loaded - bound


def test_free_names_finds_what_a_paste_would_miss():
    assert free_names("import numpy as np\nx = np.zeros(3)\nf(x, xp.int64)") == {"f", "xp"}


@pytest.mark.parametrize("code", CODES)
def test_examples_have_their_own_imports_and_arrays(code):
    entry = REGISTRY[code]
    for part, snippet in (("before", entry.before), ("after", entry.after)):
        assert max(map(len, snippet.splitlines())) <= 88, f"{code} {part}: a line over 88 columns"
        if is_shell(snippet):
            assert all(line.startswith(("kvcanary ", "#")) for line in snippet.splitlines() if line.strip())
            continue
        assert not free_names(snippet), f"{code} {part} uses names it never defines: {free_names(snippet)}"
