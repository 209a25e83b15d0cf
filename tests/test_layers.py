"""The package's layers, as imports: every module imports only from its own layer or below, and
nothing imports in a cycle (module-level and function-level imports alike).

Bottom to top (docs/concepts/architecture.md):

1. base: errors, constants, hashing and the validation helpers every operation shares;
2. ``kernels/`` (``@cuda.jit`` only) and ``reference/`` (the NumPy specification);
3. core: the operations (``verify.py``, ``write.py``, ...), their bundles (``context.py``,
   ``plans.py``) and their launch glue (``launch/``);
4. ``fast/``: the fast wing, which wraps the core and is never imported by it;
5. product: the monitor, the toy engine, the CLI;
6. the facade (``__init__.py``).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "kvcanary_numba"

BASE = {"errors", "constants", "hashing", "_jit", "_runtime", "_interop", "_overlap", "_validate"}
CORE = {
    "context",
    "plans",
    "verify",
    "write",
    "plan",
    "plan_offsets",
    "scatter",
    "fingerprint",
    "move",
    "records",
    "digest",
    "handoff",
    "launch",
}
PRODUCT = {"monitor", "engine", "cli", "doctor", "__main__"}
LAYERS = {"base": 1, "kernels": 2, "reference": 2, "core": 3, "fast": 4, "product": 5, "facade": 6}
#: What the kernels may import besides themselves: the device code's whole world.
KERNEL_IMPORTS = {"numba", "numpy", "llvmlite", "kvcanary_numba.constants", "kvcanary_numba.hashing"}


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "facade"
    top = parts[1]
    if top in BASE:
        return "base"
    if top in ("kernels", "reference", "fast"):
        return top
    if top in CORE:
        return "core"
    if top in PRODUCT:
        return "product"
    raise AssertionError(f"{module}: no layer (add it to tests/test_layers.py)")


def imports_of(module: str) -> list[tuple[str, int]]:
    """(imported module, line) of every import in ``module``, resolved to package modules where they are ones."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                out.append((candidate if candidate in MODULES else target, node.lineno))
    return out


def package_imports(module: str) -> list[tuple[str, int]]:
    out = []
    for target, line in imports_of(module):
        while target and target not in MODULES:
            target = target.rpartition(".")[0]
        if target and target != module and target != "kvcanary_numba":
            out.append((target, line))
    return out


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down_the_layers(module):
    mine = LAYERS[layer_of(module)]
    wrong = [
        f"line {line}: {target} ({layer_of(target)})"
        for target, line in package_imports(module)
        if LAYERS[layer_of(target)] > mine
    ]
    assert not wrong, f"{module} ({layer_of(module)}) imports from above: {wrong}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if layer_of(m) == "kernels"))
def test_kernels_import_only_device_code(module):
    allowed = KERNEL_IMPORTS | {m for m in MODULES if layer_of(m) == "kernels"} | {"__future__"}
    wrong = [
        f"line {line}: {target}"
        for target, line in imports_of(module)
        if target not in allowed and target.split(".")[0] not in {"numba", "numpy", "llvmlite"}
    ]
    assert not wrong, f"{module} imports outside the kernels' world: {wrong}"


def test_no_import_cycles():
    graph = {m: {t for t, _ in package_imports(m)} for m in MODULES}
    index, low, stack, on_stack, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert cycles == []


def test_no_dispatch_by_module_name():
    # Every operation dispatches with an explicit ``if``; a module looked up by a string is invisible
    # to readers, IDEs and this test.
    found = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = ast.unparse(node.func)
                if name in ("importlib.import_module", "__import__", "import_module"):
                    found.append(f"{module}:{node.lineno} {name}")
    assert found == []


def test_the_layer_test_catches_an_upward_import(tmp_path, monkeypatch):
    # The rules above, applied to a core module that imports the fast wing: the test must fail.
    fake = tmp_path / "verify.py"
    fake.write_text("from .fast import calls\n")
    monkeypatch.setitem(MODULES, "kvcanary_numba.verify", fake)
    with pytest.raises(AssertionError, match="imports from above"):
        test_imports_point_down_the_layers("kvcanary_numba.verify")


def test_no_module_is_over_400_lines():
    # A module a reader opens fits one sitting; a longer one splits along what it does.
    long = {name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > 400}
    assert not long, long
