#!/usr/bin/env bash
# Download the wheels that run the GPU tier under CUDA 12 on a machine that cannot reach a package
# index (the device machines: Python 3.12, x86-64, an image with the CUDA 13 stack and NumPy 2.5).
# Run from the repository root; the wheels land in .whl-cu12/ (git-ignored):
#
#   bash benchmarks/fetch_cu12_wheels.sh
#
# On the device, install them ahead of the image's packages (--no-deps: every one is listed here):
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl-cu12/*.whl
#   export PYTHONPATH=/tmp/site:$PWD
#
# Size (2026-12-06): 329 MiB in 11 wheels, more than one device call carries (64 MiB); two wheels are
# each over it (cupy-cuda12x 130 MiB, nvidia-cuda-nvrtc-cu12 85 MiB). Carry them in parts over
# successive calls to a machine kept warm: `split -b 48m` each file here (the working tree, about
# 9 MiB, travels with every call), carry one part per call,
# append it to the file under /tmp there, and install from /tmp once every part has arrived.
#
# The versions are what `pip install ".[gpu-cu12]"` resolves to for Python 3.12 (pip install
# --dry-run --report); numba and llvmlite come from the image. NumPy 2.4 replaces the image's 2.5,
# on which numba-cuda 0.30.4 does not import. The CUDA 12 toolkit wheels are those the
# numba-cuda[cu12] extra names (runtime, NVRTC, NVCC's NVVM, CCCL headers, nvJitLink).
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=(
    numpy==2.4.6
    numba-cuda==0.30.4
    cuda-bindings==12.9.10
    cuda-core==1.2.2
    cuda-pathfinder==1.9.1
    cupy-cuda12x==14.2.0
    nvidia-cuda-runtime-cu12==12.9.79
    nvidia-cuda-nvrtc-cu12==12.9.86
    nvidia-cuda-nvcc-cu12==12.9.86
    nvidia-cuda-cccl-cu12==12.9.27
    nvidia-nvjitlink-cu12==12.9.86
)
PLATFORMS=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_12 manylinux2010; do
    PLATFORMS+=(--platform "${tag}_x86_64")
done

mkdir -p .whl-cu12
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d .whl-cu12 "${WHEELS[@]}"
ls -l .whl-cu12
echo "total: $(du -ch .whl-cu12/*.whl | tail -n 1 | cut -f1) in $(ls .whl-cu12/*.whl | wc -l) wheels"
