"""The CUDA 12 tier's site hook (``benchmarks/cu12_site.py``), in a fresh interpreter: with
``KVCANARY_IMAGE_SITE`` the image's packages import from behind the tier's own and its CUDA 13
builds of PyTorch and JAX do not (``pytest.importorskip`` skips them); without it the hook
changes nothing."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

BENCHMARKS = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"

CHILD = """
import importlib, json, sys
sys.path.insert(0, sys.argv[1])
import cu12_site
seen = {}
for name in ("image_only", "jax", "jax.numpy", "torch", "jaxlib"):
    try:
        importlib.import_module(name)
        seen[name] = "imported"
    except ModuleNotFoundError as error:
        seen[name] = str(error)
print(json.dumps(seen))
"""


def _image(tmp_path):
    image = tmp_path / "image-site"
    for package in ("jax", "jax/numpy", "torch", "jaxlib"):
        (image / package).mkdir(parents=True)
        (image / package / "__init__.py").write_text("")
    (image / "image_only.py").write_text("")
    return image


def _run(env):
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(BENCHMARKS)], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(result.stdout)


def test_the_hook_appends_the_image_site_and_hides_its_cuda_13_frameworks(tmp_path):
    image = _image(tmp_path)
    seen = _run({**os.environ, "KVCANARY_IMAGE_SITE": str(image)})
    assert seen["image_only"] == "imported"
    for name in ("jax", "jax.numpy", "torch", "jaxlib"):
        assert "hidden in the CUDA 12 tier" in seen[name], seen


def test_without_the_variable_the_hook_changes_nothing(tmp_path):
    image = _image(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "KVCANARY_IMAGE_SITE"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(image), env.get("PYTHONPATH", "")]))
    assert set(_run(env).values()) == {"imported"}
