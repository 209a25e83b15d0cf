"""Discover the package's modules and render one mkdocstrings page per module.

Discovery reads the source tree (no import), so the API reference lists exactly
the modules that exist when the site is built; modules land one by one.
"""

from __future__ import annotations

import ast
import pathlib
import re

PACKAGE = "kvcanary_numba"

#: Section title -> subpackage ("" = top level). Launch glue is internal and not listed.
SECTIONS: dict[str, str] = {
    "Public API": "",
    "CanaryMonitor internals": "monitor",
    "NumPy references (executable spec)": "reference",
    "Numba-CUDA kernels": "kernels",
}
#: A Sphinx cross-reference role before a code span, as rendered from a docstring.
_ROLE = re.compile(
    r":(?:class|func|meth|mod|attr|data|exc|obj):<code>(~?)([\w.]+)</code>"
)
#: Subpackages not listed as one page of the public API: sections of their own, and the launch glue.
#: The monitor is both: its package page is the public API, its modules a section.
SUBPACKAGES = frozenset(s for s in SECTIONS.values() if s) - {"monitor"} | {"launch"}
#: Reading order of the public modules; anything else follows alphabetically.
PREFERRED = (
    "plan",
    "plan_offsets",
    "write",
    "verify",
    "scatter",
    "fingerprint",
    "plans",
    "context",
    "monitor",
    "engine",
    "cli",
    "doctor",
    "constants",
    "hashing",
    "errors",
)


def _summary(path: pathlib.Path) -> str:
    """First line of a module's docstring ('' when it has none or does not parse)."""
    try:
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    except (SyntaxError, UnicodeDecodeError):
        return ""
    return (doc or "").strip().splitlines()[0] if doc else ""


def _order(name: str) -> tuple[int, str]:
    return (PREFERRED.index(name) if name in PREFERRED else len(PREFERRED), name)


def discover(package_dir: pathlib.Path) -> dict[str, list[tuple[str, str]]]:
    """Section title -> [(dotted module name, summary)], only non-empty sections.

    Private modules (leading underscore) are skipped; a subpackage counts as a
    module when it has an ``__init__.py`` (``errors``).
    """
    found: dict[str, list[tuple[str, str]]] = {}
    for title, sub in SECTIONS.items():
        folder = package_dir / sub if sub else package_dir
        modules = []
        for path in folder.iterdir() if folder.is_dir() else ():
            if path.name.startswith("_"):
                continue
            if path.suffix == ".py":
                source, name = path, path.stem
            elif (
                path.is_dir()
                and (path / "__init__.py").is_file()
                and not sub
                and path.name not in SUBPACKAGES
            ):
                source, name = path / "__init__.py", path.name
            else:
                continue
            dotted = ".".join(p for p in (PACKAGE, sub, name) if p)
            modules.append((dotted, _summary(source)))
        if modules:
            found[title] = sorted(modules, key=lambda m: _order(m[0].rsplit(".", 1)[1]))
    return found


def page_path(dotted: str) -> str:
    """Docs-relative page of a module: ``kvcanary_numba.kernels.verify`` -> ``api/kernels/verify.md``."""
    return "api/" + dotted.removeprefix(PACKAGE + ".").replace(".", "/") + ".md"


def render_module(dotted: str) -> str:
    return f"# `{dotted}`\n\n::: {dotted}\n"


def render_index(found: dict[str, list[tuple[str, str]]]) -> str:
    parts = [
        "# API reference",
        "",
        "Generated from the numpydoc docstrings of the modules present in this build. Every public "
        "function validates its arguments and raises a `KvCanaryError` with a code from the "
        "[error catalogue](../errors/index.md); the *Raises* section of each docstring names the codes.",
        "",
    ]
    for title, modules in found.items():
        parts += [f"## {title}", "", "| Module | Summary |", "|---|---|"]
        for dotted, summary in modules:
            link = page_path(dotted).removeprefix("api/")
            parts.append(f"| [`{dotted}`]({link}) | {summary.replace('|', '/')} |")
        parts.append("")
    return "\n".join(parts)


def plain_roles(html: str) -> str:
    """Render Sphinx roles (``:class:`~a.B```) that mkdocstrings leaves as text as plain code (``B``)."""
    return _ROLE.sub(
        lambda m: f"<code>{m[2].rsplit('.', 1)[-1] if m[1] else m[2]}</code>", html
    )
