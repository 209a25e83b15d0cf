"""The tutorial notebooks: committed with their outputs, shaped alike, and executed.

The site shows the outputs committed in the notebooks (the build executes nothing).
Each notebook runs here top to bottom in a fresh Jupyter kernel of this interpreter
(``run_notebooks.execute``; its environment inherits ``NUMBA_ENABLE_CUDASIM`` from
conftest, so tutorial 04's kernels run in the simulator unless a GPU is present), and
its fresh outputs must equal the committed ones as ``run_notebooks.comparable`` reads
them: a stale output fails with the differing lines. Exercise solutions are ordinary
code cells tagged ``solution``, so they run (and assert) with the rest.
"""

from __future__ import annotations

import ast
import pathlib
import re
import sys
import tomllib

import pytest

# The dev extra; without it the notebook tests skip with the reason (never a collection error).
nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (pip install -e '.[dev]')")
pytest.importorskip("nbclient", reason="nbclient is not installed (pip install -e '.[dev]')")

import run_notebooks  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
TUTORIALS = ROOT / "docs" / "tutorials"
NOTEBOOKS = run_notebooks.notebooks()
INSTALL = 'python -m pip install "kvcanary_numba[tutorials]"'
#: Outputs that would differ between machines (or say where the notebook ran).
MACHINE_SPECIFIC = re.compile(r"/tmp/|/home/|/root/|/work/|/Users/|site-packages|ipykernel_\d+|\\\\")


def _ids(path: pathlib.Path) -> str:
    return path.stem


def read(path: pathlib.Path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    return nb


def code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def markdown(nb) -> str:
    return "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


def test_there_are_seven_tutorials():
    assert [p.stem[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04", "05", "06", "07"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_notebook_has_the_tutorial_shape(path):
    """Motivation, the code, a check against a reference, a measurement, exercises (in that order)."""
    nb = read(path)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    text = markdown(nb)
    marks = [
        text.find(mark)
        for mark in ("**Motivation.**", "## The code", "## Check against", "## Measurement", "## Exercises")
    ]
    assert all(m >= 0 for m in marks) and marks == sorted(marks), f"{path.name}: sections missing or out of order"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_first_cell_gives_the_install_command(path):
    first = read(path).cells[0].source
    assert f"```bash\n{INSTALL}\n```" in first, f"{path.name}: cell 0 lacks the install command in a fenced block"


def test_tutorials_index_gives_the_same_install_command():
    text = (TUTORIALS / "index.md").read_text(encoding="utf-8")
    assert f"```bash\n{INSTALL}\n```" in text


def _extra(name: str) -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return project["optional-dependencies"][name]


def _distribution(requirement: str) -> str:
    return re.split(r"[\[<>=!~ ;]", requirement, maxsplit=1)[0].lower()


def test_tutorials_extra_brings_what_the_notebooks_need():
    extra = {_distribution(r) for r in _extra("tutorials")}
    # numba-cuda for tutorial 04's kernels, JAX for tutorial 07, matplotlib for the plots, a
    # kernel and nbclient to run them (tests/run_notebooks.py), Jupyter to open them.
    assert {"numba-cuda", "jax", "matplotlib", "ipykernel", "nbclient", "jupyterlab"} <= extra
    numba_cuda = next(r for r in _extra("tutorials") if _distribution(r) == "numba-cuda")
    assert numba_cuda == next(r for r in _extra("gpu") if _distribution(r) == "numba-cuda")


def _imports(source: str) -> list[tuple[str, bool]]:
    """(top-level module, imported inside an ``if`` or a function) of every import in a cell."""
    tree = ast.parse(source)
    guarded = {
        id(node)
        for branch in ast.walk(tree)
        if isinstance(branch, (ast.If, ast.FunctionDef))
        for node in ast.walk(branch)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name.split(".")[0], id(node) in guarded) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.append((node.module.split(".")[0], id(node) in guarded))
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_notebook_imports_only_what_the_install_command_brings(path):
    """The package and its base dependencies, the tutorials extra, the standard library.

    CuPy (the ``gpu`` extra) only inside an ``if`` or a function the cells call when a GPU is there.
    """
    installed = {"kvcanary_numba", "numpy", "numba", "numba_cuda", "matplotlib", "jax"}
    for cell in code_cells(read(path)):
        for module, guarded in _imports(cell.source):
            if module == "cupy":
                assert guarded, f"{path.name}: cupy imported unconditionally"
            else:
                assert module in installed or module in sys.stdlib_module_names, (path.name, module)


def test_kernel_tutorial_enables_the_simulator_and_checks_numba_cuda_before_numba():
    nb = read(TUTORIALS / "04-numba-verify-kernel.ipynb")
    first = code_cells(nb)[0].source
    numba_import = first.index("from numba")
    assert first.index("NUMBA_ENABLE_CUDASIM") < numba_import
    assert first.index('find_spec("numba_cuda")') < numba_import and INSTALL.split(" ", 4)[-1] in first
    assert "numba-cuda" in nb.cells[0].source, "cell 0 must say beforehand that tutorial 04 needs numba-cuda"


# --- exercises -------------------------------------------------------------------------


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_exercises_have_folded_solutions_that_check_themselves(path):
    nb = read(path)
    heading = next(i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and "## Exercises" in c.source)
    numbered = re.findall(r"^(\d)\. ", nb.cells[heading].source, re.MULTILINE)
    solutions = [(i, c) for i, c in enumerate(nb.cells) if run_notebooks.SOLUTION in run_notebooks.tags(c)]
    assert numbered in (["1", "2"], ["1", "2", "3"]), f"{path.name}: two or three numbered exercises"
    assert len(solutions) == len(numbered), f"{path.name}: one solution cell per exercise"
    for index, cell in solutions:
        assert index > heading and cell.cell_type == "code"
        assert cell.metadata.get("jupyter", {}).get("source_hidden") is True, "folded in Jupyter too"
        assert "assert " in cell.source, f"{path.name}: cell {index}: a solution checks its own answer"


# --- committed outputs -----------------------------------------------------------------


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_committed_outputs_are_complete_and_machine_independent(path):
    nb = read(path)
    assert dict(nb.metadata) == {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    for number, cell in enumerate(code_cells(nb), start=1):
        assert cell.execution_count == number, f"{path.name}: run top to bottom once (--update)"
        assert "execution" not in cell.metadata, f"{path.name}: timing metadata churns"
        for out in cell.outputs:
            assert out["output_type"] != "error", f"{path.name}: a cell failed"
            text = run_notebooks._text(out.get("text", "")) + run_notebooks._text(
                out.get("data", {}).get("text/plain", "")
            )
            assert not MACHINE_SPECIFIC.search(text), f"{path.name}: machine-specific output: {text[:300]}"
    measured = [c for c in code_cells(nb) if run_notebooks.MEASUREMENT in run_notebooks.tags(c)]
    assert measured, f"{path.name}: the measurement cell is tagged"
    for cell in measured:
        printed = "".join(run_notebooks._text(o.get("text", "")) for o in cell.outputs)
        assert "measured on " in printed, f"{path.name}: timings say which machine took them"


def _fake(outputs_by_cell: list[tuple[list[str], list]]):
    nb = nbformat.v4.new_notebook()
    for tags, outputs in outputs_by_cell:
        cell = nbformat.v4.new_code_cell("pass", metadata={"tags": tags})
        cell.outputs = [nbformat.from_dict(o) for o in outputs]
        nb.cells.append(cell)
    return nb


def _stream(text: str) -> dict:
    return {"output_type": "stream", "name": "stdout", "text": text}


def _image(data: str, mime: str = "image/png") -> dict:
    return {"output_type": "display_data", "metadata": {}, "data": {mime: data, "text/plain": "<Figure>"}}


def test_comparison_ignores_how_streams_interleave():
    """A log line on stderr may arrive before or after the cell's print: the same output."""
    out, log = _stream("warned\nrow\n"), {"output_type": "stream", "name": "stderr", "text": "log line\n"}
    split = [_stream("warned\n"), log, _stream("row\n")]
    assert run_notebooks.differences(_fake([([], [out, log])]), _fake([([], split)])) == []
    assert run_notebooks.differences(_fake([([], [out, log])]), _fake([([], [out])]))


def test_comparison_ignores_only_timings_machine_and_image_bytes():
    timed = ["measured on Xeon A, 2 logical CPUs\nverify: 1.25 ms\n"]
    other = ["measured on EPYC B, 64 logical CPUs\nverify: 0.40 ms\n"]
    committed = _fake([(["measurement"], [_stream(timed[0])]), ([], [_stream("rows: 2\n"), _image("AAA")])])
    same = _fake([(["measurement"], [_stream(other[0])]), ([], [_stream("rows: 2\n"), _image("BBB")])])
    assert run_notebooks.differences(committed, same) == []
    for changed in (
        _fake([(["measurement"], [_stream("verify took 0.40 ms\n")]), ([], [_stream("rows: 2\n"), _image("AAA")])]),
        _fake([(["measurement"], [_stream(timed[0])]), ([], [_stream("rows: 3\n"), _image("AAA")])]),
        _fake([(["measurement"], [_stream(timed[0])]), ([], [_stream("rows: 2\n"), _image("AAA", "image/svg+xml")])]),
        _fake([(["measurement"], [_stream(timed[0])]), ([], [_stream("rows: 2\n")])]),
    ):
        assert run_notebooks.differences(committed, changed), "a real change must be reported"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_notebook_executes_and_its_outputs_are_the_committed_ones(path):
    from nbclient.exceptions import CellExecutionError

    try:
        executed = run_notebooks.execute(path)
    except CellExecutionError as exc:
        pytest.fail(f"{path.name}: {exc}")
    if run_notebooks.gpu_present():
        return  # committed outputs are the CPU path's; a GPU prints other lines
    found = run_notebooks.differences(read(path), executed)
    assert not found, (
        f"{path.name}: committed outputs are stale; run `python tests/run_notebooks.py --update "
        f"{path.stem[:2]}` and commit\n" + "\n".join(found[:60])
    )
