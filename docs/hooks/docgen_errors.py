"""Render the error catalogue (index + one page per code) from the package registry.

Pure functions from registry entries to Markdown, so tests can check the pages
without building the site. ``kvc_hooks.py`` turns the results into virtual
files at ``errors/<CODE>.md`` (URL ``errors/<CODE>/``, what
``kvcanary_numba.errors.docs_url`` links to).
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Mapping

#: Characters Markdown would turn into markup or HTML when they appear in prose.
_MARKUP = re.compile(r"([\\*_\[\]<>|])")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_ERROR_CODE = re.compile(r"\bKVC-[A-Z]\d{3}\b")
_HTML_TAG = re.compile(r"(<[^>]+>)")

MODEL_CODE = "KVC-P001"


def page_path(code: str) -> str:
    """Docs-relative source path of the page of ``code``."""
    return f"errors/{code}.md"


def escape(text: str) -> str:
    """Escape Markdown markup in prose, keeping `code spans` the author wrote."""
    out, last = [], 0
    for match in _CODE_SPAN.finditer(text):
        out.append(_MARKUP.sub(r"\\\1", text[last : match.start()]))
        out.append(match.group(0))
        last = match.end()
    out.append(_MARKUP.sub(r"\\\1", text[last:]))
    return "".join(out)


def code_span(text: str) -> str:
    """``text`` as an inline code span, whatever backticks it contains."""
    fence = "`"
    while fence in text:
        fence += "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def code_block(text: str, language: str = "python", role: str = "") -> str:
    """A fenced block inside a ``kvc-wrap`` box: long lines wrap instead of scrolling (kvcanary.css).

    ``role`` (``"before"``, ``"after"``) becomes a class ``kvc-<role>`` of the box, by which
    tests find an example on the built page.
    """
    fence = "```"
    while fence in text:
        fence += "`"
    classes = f"kvc-wrap kvc-{role}" if role else "kvc-wrap"
    return f'<div class="{classes}" markdown>\n\n{fence}{language}\n{text.rstrip()}\n{fence}\n\n</div>'


def example_language(snippet: str) -> str:
    """``bash`` for a ``kvcanary`` command line, else ``python``."""
    return "bash" if snippet.lstrip().startswith("kvcanary ") else "python"


def sglang_heading(message: str, index: int) -> str:
    """One SGLang message as a small heading of its own (raw HTML: kept out of the page's table of contents).

    The search index makes every heading a section whose title weighs far more
    than body text, so a pasted log line ranks the page that covers it first.
    """
    return f'<h3 class="kvc-sglang" id="sglang-message-{index}"><code>{html.escape(message, quote=False)}</code></h3>\n'


def _exception_text(entry) -> str:
    if entry.exception == "type":
        return "`KvCanaryTypeError` (a `KvCanaryError`, `ValueError` and `TypeError`)"
    return "`KvCanaryError` (a `ValueError`)"


def _related_item(code: str, registry: Mapping) -> str:
    other = registry.get(code)
    if other is None:  # not registered (yet): no link, so the strict build stays green
        return f"- {code_span(code)} (not in the catalogue)"
    return f"- [{code}]({code}.md) — {escape(other.title)}"


def render_entry(entry, registry: Mapping) -> str:
    """Markdown page of one registry entry."""
    parts = [
        f"# {entry.code}: {escape(entry.title)}",
        "",
        f"| Code | {code_span(entry.code)} |",
        "|---|---|",
        f"| Operation | {escape(entry.operation)} |",
        f"| Raises | {_exception_text(entry)} |",
        f"| SGLang | {'no such check: extension of kvcanary_numba' if entry.extension else 'same check as SGLang'} |",
        "",
        "## Message",
        "",
        code_block(entry.message, "text"),
        "",
        f"The fields in braces are filled in by the raise site. Every message ends with "
        f"{code_span(entry.ending)}: the same entry offline, and the page you are reading.",
        "",
        "## What it means",
        "",
        escape(entry.meaning),
        "",
        "## When it happens",
        "",
        *(f"- {escape(t)}" for t in entry.triggers),
        "",
        "## How to fix it",
        "",
        *(f"- {escape(s)}" for s in entry.solutions),
        "",
        "## Example fix",
        "",
        "Both snippets run as printed, pasted into a fresh Python (or shell) on a CPU with only this "
        "package installed: each has its own imports and arrays (NumPy here; CuPy arrays on a GPU). "
        f"A test runs them from this page. `kvcanary explain {entry.code}` prints the same two.",
        "",
        f"Before (raises {entry.code}):",
        "",
        code_block(entry.before, example_language(entry.before), "before"),
        "",
        "After (runs):",
        "",
        code_block(entry.after, example_language(entry.after), "after"),
        "",
        "## Defensive pattern",
        "",
        code_block(entry.defensive),
        "",
        "## Prevention",
        "",
        escape(entry.prevention),
        "",
        "## Related errors",
        "",
        *([_related_item(c, registry) for c in entry.related] or ["None."]),
        "",
        "## SGLang counterpart",
        "",
    ]
    if entry.sglang:
        parts += ["SGLang's kv-canary rejects the same input with:", ""]
        parts += [sglang_heading(m, i) for i, m in enumerate(entry.sglang, 1)]
    elif entry.extension:
        parts.append(
            "None: SGLang has no such check; this is an extension of kvcanary_numba."
        )
    else:
        parts.append(
            "SGLang performs the same check without a message of its own (a generic tensor check)."
        )
    parts += ["", f"Extension: **{'yes' if entry.extension else 'no'}**.", ""]
    return "\n".join(parts)


def _table(entries) -> list[str]:
    rows = ["| Code | Title | Message |", "|---|---|---|"]
    for e in entries:
        rows.append(
            f"| [{e.code}]({e.code}.md) | {escape(e.title)} | {code_span(e.message)} |"
        )
    return rows


def group_by_operation(registry: Mapping, operations: Mapping) -> dict[str, list]:
    """Operation letter -> entries of that operation, in code order; empty groups dropped."""
    groups: dict[str, list] = {letter: [] for letter in operations}
    for code in sorted(registry):
        groups.setdefault(code[4], []).append(registry[code])
    return {letter: entries for letter, entries in groups.items() if entries}


def filter_data(registry: Mapping) -> dict:
    """What the index page's filter box matches a pasted message with (``error-filter.js``):
    per code the patterns of its messages, ours and SGLang's (each with its literal length: the most
    specific matching pattern wins), and its distinctive words, made by
    :mod:`kvcanary_numba.errors.matching` (what ``kvcanary explain`` runs), and the common words."""
    from kvcanary_numba.errors import matching

    codes = {}
    for code in sorted(registry):
        entry = registry[code]
        known = matching.words(entry.title)
        for template in matching.templates(entry):
            known |= matching.words(template)
        patterns = [
            [matching.pattern_source(t), matching.literal_length(t)]
            for t in matching.templates(entry)
        ]
        codes[code] = {"patterns": patterns, "words": sorted(known)}
    return {"codes": codes, "common": sorted(matching.COMMON_WORDS)}


def _json_script(element_id: str, data) -> str:
    """``data`` as a JSON ``<script>`` of the page (``</`` escaped, so the text cannot close it)."""
    text = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    return f'<script type="application/json" id="{element_id}">{text}</script>'


def render_index(registry: Mapping, operations: Mapping, intro: str) -> str:
    """The catalogue index: ``intro`` Markdown, a filter box, one table per operation."""
    parts = [
        "# Error catalogue",
        "",
        intro.strip(),
        "",
        f"The catalogue holds **{len(registry)}** codes. Type part of a code or of a message, or paste a "
        "whole error message (ours or SGLang's, values included), to filter the tables; "
        '`kvcanary explain "<message>"` does the same offline. The site search above also finds '
        "codes and message text.",
        "",
        '<input id="kvc-error-filter" class="md-input" type="search" '
        'placeholder="Filter by code or message, or paste an error message" aria-label="Filter errors">',
        '<p id="kvc-error-filter-hint" class="kvc-filter-hint" role="status"></p>',
        "",
        _json_script("kvc-error-patterns", filter_data(registry)),
        "",
    ]
    for letter, entries in group_by_operation(registry, operations).items():
        title = operations.get(letter, f"Other ({letter})")
        parts += [f"## {escape(title)}", "", *_table(entries), ""]
    return "\n".join(parts)


def link_codes(html: str, to_root: str, registry: Mapping) -> str:
    """Link each registered ``KVC-X000`` in the text of rendered ``html`` to its catalogue page.

    ``to_root`` is the relative URL of the site root from the page (``"../../"``).
    Codes already inside a link, and unregistered codes, are left alone.
    """
    parts, in_link = _HTML_TAG.split(html), 0
    for i, part in enumerate(parts):
        if part.startswith("<"):
            if re.match(r"<a[\s>]", part):
                in_link += 1
            elif part.startswith("</a"):
                in_link -= 1
        elif not in_link and "KVC-" in part:
            parts[i] = _ERROR_CODE.sub(
                lambda m: (
                    f'<a href="{to_root}errors/{m[0]}/">{m[0]}</a>'
                    if m[0] in registry
                    else m[0]
                ),
                part,
            )
    return "".join(parts)
