#!/usr/bin/env bash
# Clean-install check: FastMACE with the prebuilt OEq extension needs no compiler.
#
#   clean_install.sh WHEEL_DIR [PYTHON]
#
# WHEEL_DIR holds our fastmace-oeq-ext wheel from tools/release/oeq_wheels/build.sh (and
# optionally a fastmace wheel; otherwise one is built from this checkout). In a fresh venv it
# installs torch and OpenEquivariance, then our two distributions from those local files only
# then check_install.sh: the installed files are ours; g++, c++, ninja and nvcc are shadowed
# by sentinels that log and fail; with FASTMACE_OEQ_PREBUILT=1, `fastmace doctor` and a smoke
# run (the demo model; on a GPU also the hybrid backend, checked against the e3nn model) must
# find the prebuilt extension selected (and, on a GPU, loaded) and the sentinel log empty.
#
# CLEAN_INSTALL_TORCH (default torch==2.14.1): the torch the fresh venv gets first, as a user's
# would have; the wheel's library for that torch's minor version must be the one chosen.
#
# CLEAN_INSTALL_OFFLINE=1: no package index (the GPU test machine): the venv sees PYTHON's
# packages and OEQ_SPEC (default openequivariance==0.7.0) may name OEq's source tree.
set -euo pipefail

if [[ $# -lt 1 ]]; then
    echo "usage: $0 WHEEL_DIR [PYTHON]" >&2
    exit 2
fi
wheel_dir="$(cd "$1" && pwd)"
python="${2:-python3.11}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
offline="${CLEAN_INSTALL_OFFLINE:-0}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
venv="$work/venv"
pip_args=(--quiet --disable-pip-version-check)

oeq_wheel="$(ls "$wheel_dir"/fastmace_oeq_ext-*.whl 2>/dev/null | head -n1 || true)"
if [[ -z "$oeq_wheel" ]]; then
    echo "clean_install: no fastmace_oeq_ext wheel in $wheel_dir" >&2
    exit 2
fi
core_wheel="$(ls "$wheel_dir"/fastmace-*.whl 2>/dev/null | head -n1 || true)"

torch_source="${CLEAN_INSTALL_TORCH:-torch==2.14.1}"
[[ "$offline" == 1 ]] && torch_source="the torch of $python's environment"
echo "== fresh venv ($python, offline=$offline, $torch_source)"
if [[ "$offline" == 1 ]]; then
    # The venv sees the invoking Python's packages (which may themselves be a venv's).
    "$python" -m venv "$venv"
    purelib="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    "$python" -c 'import site; print("\n".join(site.getsitepackages()))' \
        > "$purelib/_outer_environment.pth"
else
    "$python" -m venv "$venv"
    "$venv/bin/pip" install "${pip_args[@]}" "${CLEAN_INSTALL_TORCH:-torch==2.14.1}"
fi
torch_dir="$("$venv/bin/python" -c 'import importlib.util as u, os; print(os.path.dirname(u.find_spec("torch").origin))')"
oeq_spec="${OEQ_SPEC:-openequivariance==0.7.0}"
oeq_args=()
[[ -d "$oeq_spec" ]] && oeq_args+=(--no-build-isolation --no-deps)
# OEq's sdist would download libtorch: point its CMake at the installed torch.
"$venv/bin/pip" install "${pip_args[@]}" "${oeq_args[@]}" "$oeq_spec" \
    -C "cmake.define.FETCHCONTENT_SOURCE_DIR_LIBTORCH=$torch_dir" \
    -C cmake.define.CMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON

echo "== our two distributions, from local files only"
if [[ -z "$core_wheel" ]]; then
    "$venv/bin/pip" wheel "${pip_args[@]}" --no-deps -w "$work/dist" "$root/packages/fastmace"
    core_wheel="$(ls "$work"/dist/fastmace-*.whl)"
fi
"$venv/bin/pip" install "${pip_args[@]}" --no-index --no-deps "$oeq_wheel"
if [[ "$offline" == 1 ]]; then
    "$venv/bin/pip" install "${pip_args[@]}" --no-index --no-deps "$core_wheel"
else
    # The extra's fastmace-oeq-ext is already satisfied by the local wheel; the rest comes
    # from the index. --find-links keeps a re-resolution on our file.
    "$venv/bin/pip" install "${pip_args[@]}" --find-links "$wheel_dir" "${core_wheel}[oeq]"
fi
CHECK_INSTALL_KEEP_HOME="$offline" bash "$root/tools/release/check_install.sh" \
    "$venv" "$core_wheel" "$oeq_wheel"
echo "== clean install passed: prebuilt extension selected, no compiler called"
