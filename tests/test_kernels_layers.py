"""The core kernels (``kvcanary_numba/kernels/``) import nothing above them.

They may import Numba, NumPy and llvmlite, the package's ``constants`` and ``hashing``,
and each other: never the fast wing (``kvcanary_numba/fast/``), the monitor, the launch
glue or anything else of the package. Read with ``ast``, so imports inside functions
count too and nothing is imported.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import kvcanary_numba

KERNELS_DIR = pathlib.Path(kvcanary_numba.__file__).parent / "kernels"
#: Top-level packages an absolute import may name.
ALLOWED_PACKAGES = {"__future__", "llvmlite", "numba", "numpy"}
#: Modules of ``kvcanary_numba`` a relative import from ``kernels/`` may name (``..x``).
ALLOWED_PARENT_MODULES = {"constants", "hashing"}


def imports(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, what) of every import of the module at ``path``; relative ones as written, e.g. ``..constants``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            if node.level and not node.module:  # ``from . import x`` / ``from .. import x``
                found += [(node.lineno, base + alias.name) for alias in node.names]
            else:
                found.append((node.lineno, base))
    return found


def allowed(name: str) -> bool:
    if not name.startswith("."):
        return name.split(".")[0] in ALLOWED_PACKAGES
    if name.startswith("..."):  # above the package
        return False
    if name.startswith(".."):
        return name[2:].split(".")[0] in ALLOWED_PARENT_MODULES
    return True  # ``.x``: another kernels module, or the package's own ``__init__``


MODULES = sorted(KERNELS_DIR.glob("*.py"))


def test_the_rule_reads_what_it_should():
    assert {"verify.py", "write.py", "write_chunk.py", "fingerprint.py"} <= {p.name for p in MODULES}
    assert allowed("numba.cuda") and allowed("..constants") and allowed(".hashing") and allowed(".")
    for name in ("..fast.kernels.share", "..monitor", "..launch._launch", "..", "...x", "kvcanary_numba.fast",
                 "cupy", "ctypes"):
        assert not allowed(name), name


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_core_kernels_import_only_from_below(path):
    bad = [f"{path.name}:{line}: {name}" for line, name in imports(path) if not allowed(name)]
    assert not bad, "kernels/ imports something above it:\n" + "\n".join(bad)
