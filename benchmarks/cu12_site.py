"""Site hook of the CUDA 12 tier's virtual environment on a device whose image carries CUDA 13.

The device's Python has numba, pytest and the rest of the test stack, next to CUDA 13 builds of the
NVIDIA libraries, PyTorch and JAX. The CUDA 12 wheels go into a fresh virtual environment whose
site-packages come first; this module, imported from a ``.pth`` file there, then appends the image's
site-packages (``KVCANARY_IMAGE_SITE``) so its test stack imports. cuda-pathfinder looks for NVIDIA
libraries only in ``site.getsitepackages()``, which stays the environment's own: NVRTC, NVVM and the
runtime resolve to the CUDA 12 wheels. PyTorch and JAX are hidden (their imports raise
``ModuleNotFoundError``, so their tests skip): importing them would load the image's CUDA 13 NVRTC into
the process, and pathfinder prefers a library that is already loaded.
"""

import os
import site
import sys

HIDDEN = ("torch", "jax", "jaxlib")


class _HideCuda13Builds:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"{name} is hidden in the CUDA 12 tier (the image's build is CUDA 13)", name=name)
        return None


if os.environ.get("KVCANARY_IMAGE_SITE"):
    site.addsitedir(os.environ["KVCANARY_IMAGE_SITE"])
    sys.meta_path.insert(0, _HideCuda13Builds())
