"""The tutorial notebooks: committed without outputs, shaped alike, and executed (nbmake).

Each notebook runs top to bottom in a fresh Jupyter kernel of this interpreter,
on the CPU path (its environment inherits ``NUMBA_ENABLE_CUDASIM`` from
conftest, so kernels run in the simulator unless a GPU is present). A failing
cell fails the test with the cell's traceback.
"""

from __future__ import annotations

import pathlib

import pytest

# The dev extra; without it the notebook tests skip with the reason (never a collection error).
nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (pip install -e '.[dev]')")
NotebookRun = pytest.importorskip("nbmake.nb_run", reason="nbmake is not installed (pip install -e '.[dev]')").NotebookRun

TUTORIALS = pathlib.Path(__file__).resolve().parent.parent / "docs" / "tutorials"
NOTEBOOKS = sorted(TUTORIALS.glob("*.ipynb"))
TIMEOUT_S = 600


def _ids(path: pathlib.Path) -> str:
    return path.stem


def test_there_are_six_tutorials():
    assert [p.stem[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04", "05", "06"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_notebook_is_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: cell {index} has outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_notebook_has_the_tutorial_shape(path):
    """Motivation, the code, a check against a reference, a measurement (in that order)."""
    nb = nbformat.read(path, as_version=4)
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    marks = [text.find(mark) for mark in ("**Motivation.**", "## The code", "## Check against", "## Measurement")]
    assert all(m >= 0 for m in marks) and marks == sorted(marks), f"{path.name}: sections missing or out of order"


def test_kernel_tutorial_enables_the_simulator_before_numba():
    nb = nbformat.read(TUTORIALS / "04-numba-verify-kernel.ipynb", as_version=4)
    first = next(c.source for c in nb.cells if c.cell_type == "code")
    assert first.index("NUMBA_ENABLE_CUDASIM") < first.index("from numba")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_notebook_executes(path):
    result = NotebookRun(path, TIMEOUT_S).execute()
    if result.error is not None:
        pytest.fail(f"{path.name}, cell {result.error.failing_cell_index}: {result.error.summary}\n{result.error.trace}")
