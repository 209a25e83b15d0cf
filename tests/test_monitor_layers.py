"""The monitor sits above the fast wing: nothing in ``kvcanary_numba/fast`` imports the monitor, the
engine or the CLI, and the monitor's classes are composed, not stacked on mixins."""

from __future__ import annotations

import ast
import pathlib

import kvcanary_numba
from kvcanary_numba.monitor import CanaryMonitor

PACKAGE = pathlib.Path(kvcanary_numba.__file__).parent
ABOVE_FAST = ("kvcanary_numba.monitor", "kvcanary_numba.engine", "kvcanary_numba.cli")


def _imports(path: pathlib.Path) -> list[str]:
    """Absolute names of the modules ``path`` imports (relative imports resolved)."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            stem = ".".join(filter(None, (base, node.module)))
            names += [stem] + [f"{stem}.{alias.name}" for alias in node.names]
    return names


def test_the_fast_wing_never_imports_the_monitor_engine_or_cli():
    found = [
        (str(path.relative_to(PACKAGE)), name)
        for path in sorted((PACKAGE / "fast").rglob("*.py"))
        for name in _imports(path)
        if name.startswith(ABOVE_FAST)
    ]
    assert found == []


def test_the_monitor_has_no_base_class_but_object():
    assert CanaryMonitor.__bases__ == (object,)
