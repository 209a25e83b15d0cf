#!/usr/bin/env bash
# Download the wheels that run the GPU tier under CUDA 12 on a machine that cannot reach a package
# index (the device machines: Python 3.12, x86-64, an image with the CUDA 13 stack and NumPy 2.5).
# Run from the repository root; the wheels land in .whl-cu12/ (git-ignored):
#
#   bash benchmarks/fetch_cu12_wheels.sh
#
# On the device they go into a fresh virtual environment, not onto PYTHONPATH beside the image's
# packages: cuda-pathfinder searches only site.getsitepackages() for NVIDIA libraries, so there the
# image's CUDA 13 NVRTC would win and numba-cuda would run on CUDA 13 (`kvcanary doctor` says so:
# "two CUDA major versions are installed"). gpu_session.sh's `cu12` step builds that environment.
# Size (2026-12-06): 329 MiB in 11 wheels, more than one device call carries (64 MiB); two wheels are
# each over it (cupy-cuda12x 130 MiB, nvidia-cuda-nvrtc-cu12 85 MiB), and the device image has no
# CUDA 12 libraries of its own (its PyTorch and JAX are CUDA 13 builds). So `--parts` also packs
# them into one tar cut into 48 MiB parts, .cu12-parts/part-NN with SHA256SUMS (the working tree,
# about 9 MiB, travels with every call). Carry them over successive calls to a machine kept warm
# (it is given back after 30 s idle: make the calls back to back), each call copying what it
# carried to /tmp/cu12:
#
#   run(carry=[".cu12-parts/part-00", ".cu12-parts/SHA256SUMS"], command="mkdir -p /tmp/cu12 && cp .cu12-parts/* /tmp/cu12/")
#   run(carry=[".cu12-parts/part-01"], command="cp .cu12-parts/part-01 /tmp/cu12/")   # ... every part
#   run(carry=[".whl"], command="bash benchmarks/gpu_session.sh cu12")
#
# The `cu12` step checks the parts against SHA256SUMS, installs the wheels into /tmp/venv-cu12 and
# runs `kvcanary doctor` and the GPU tier in it.
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
if [ "${1:-}" = "--parts" ]; then
    rm -rf .cu12-parts && mkdir -p .cu12-parts
    tar -cf - -C .whl-cu12 . | split -b 48m -d - .cu12-parts/part-
    (cd .cu12-parts && sha256sum part-* >SHA256SUMS)
    echo "$(ls .cu12-parts/part-* | wc -l) parts in .cu12-parts/ (carry each once, see above)"
fi
