"""Packaging rules in pyproject.toml: one version source, NumPy caps only where numba-cuda needs them."""

from __future__ import annotations

import pathlib
import re
import tomllib

import kvcanary_numba

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _requirement(spec: str) -> tuple[str, str]:
    """``"numba-cuda[cu13]==0.30.4"`` -> ``("numba-cuda", "==0.30.4")``."""
    match = re.fullmatch(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?\s*(.*)", spec)
    assert match, spec
    return match.group(1).lower().replace("_", "-"), match.group(2).replace(" ", "")


def _upper_bounds(requirements, name: str) -> set[str]:
    bounds = set()
    for spec in requirements:
        dist, constraint = _requirement(spec)
        if dist == name:
            bounds |= {part[1:] for part in constraint.split(",") if part.startswith("<") and not part.startswith("<=")}
    return bounds


def test_the_version_has_one_source():
    assert "version" not in PROJECT["project"] and "version" in PROJECT["project"]["dynamic"]
    assert PROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "kvcanary_numba.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+(\.dev\d+|rc\d+)?", kvcanary_numba.__version__)


def test_the_base_install_accepts_numpy_25_and_needs_no_numba_cuda():
    base = PROJECT["project"]["dependencies"]
    assert _upper_bounds(base, "numpy") == {"2.6"}
    assert "numba-cuda" not in {_requirement(spec)[0] for spec in base}
    numba = dict(_requirement(spec) for spec in base)["numba"]
    assert ">=0.67" in numba.split(",")  # the first Numba that supports NumPy 2.5


def test_every_extra_with_numba_cuda_caps_numpy_below_25():
    extras = PROJECT["project"]["optional-dependencies"]
    with_kernels = {name for name, reqs in extras.items() if "numba-cuda" in {_requirement(r)[0] for r in reqs}}
    assert with_kernels == {"gpu", "gpu-cu12", "dev", "tutorials"}
    for name in with_kernels:
        assert _upper_bounds(extras[name], "numpy") == {"2.5"}, name


def test_each_gpu_extra_keeps_one_cuda_major_version():
    extras = PROJECT["project"]["optional-dependencies"]
    for name, cuda in (("gpu", "13"), ("gpu-cu12", "12")):
        specs = dict(_requirement(spec) for spec in extras[name])
        assert f"cupy-cuda{cuda}x" in specs and specs["numba-cuda"] == "==0.30.4", name
        assert any(spec.replace(" ", "").startswith(f"numba-cuda[cu{cuda}]") for spec in extras[name]), name
