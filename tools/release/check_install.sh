#!/usr/bin/env bash
# What a clean install of FastMACE with the prebuilt OEq extension must show, checked in an
# environment where both are installed already:
#
#   check_install.sh VENV CORE_WHEEL OEQ_WHEEL
#
# The installed files are those of CORE_WHEEL and OEQ_WHEEL (verify_installed.py); g++, c++,
# ninja and nvcc are shadowed by sentinels that log and fail; with FASTMACE_OEQ_PREBUILT=1,
# `fastmace doctor` must report the prebuilt library for the venv's torch and a smoke run
# (smoke_run.py) must pass; the sentinel log must stay empty. gcc (C) stays on PATH: Triton
# compiles a C launcher stub, a separate need. Used by clean_install.sh (a fresh venv per
# torch) and by wheelhouse.sh (the venv installed offline from the wheelhouse).
#
# CHECK_INSTALL_BY_NAME=1: the two were installed by name from a directory of wheels (no
# direct_url.json), so their installed files are compared with the wheels' instead.
# CHECK_INSTALL_KEEP_HOME=1 keeps HOME (clean_install.sh's offline mode, which sees the
# invoking Python's packages); otherwise HOME is a fresh directory.
set -euo pipefail

if [[ $# -ne 3 ]]; then
    echo "usage: $0 VENV CORE_WHEEL OEQ_WHEEL" >&2
    exit 2
fi
venv="$1"
core_wheel="$2"
oeq_wheel="$3"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# An install by name from a wheel directory (the wheelhouse's) is verified file by file.
by_name=()
[[ "${CHECK_INSTALL_BY_NAME:-0}" == 1 ]] && by_name=(--by-name)
"$venv/bin/python" "$root/tools/release/verify_installed.py" "${by_name[@]}" "$core_wheel" "$oeq_wheel"

echo "== sentinels for g++, c++, ninja, nvcc"
mkdir "$work/sentinels"
log="$work/sentinels.log"
: > "$log"
for tool in g++ c++ ninja nvcc; do
    printf '#!/bin/sh\necho "%s $*" >> "%s"\necho "check_install: %s was called" >&2\nexit 1\n' \
        "$tool" "$log" "$tool" > "$work/sentinels/$tool"
    chmod +x "$work/sentinels/$tool"
done
export PATH="$work/sentinels:$venv/bin:$PATH"
unset CXX CC CUDA_HOME CUDA_PATH
export FASTMACE_OEQ_PREBUILT=1 FASTMACE_CACHE="$work/cache"
[[ "${CHECK_INSTALL_KEEP_HOME:-0}" == 1 ]] || { mkdir "$work/home"; export HOME="$work/home"; }

echo "== fastmace doctor"
set +e
"$venv/bin/fastmace" doctor --no-hash | tee "$work/doctor.txt"
set -e
torch_minor="$("$venv/bin/python" -c 'import torch; print(".".join(torch.__version__.split(".")[:2]))')"
grep -q "host extension: prebuilt (fastmace-oeq-ext .*, built for torch $torch_minor\." \
    "$work/doctor.txt" || {
    echo "check_install: doctor did not select the prebuilt library for torch $torch_minor" >&2
    exit 1
}

echo "== smoke run"
"$venv/bin/python" "$root/tools/release/smoke_run.py"

if [[ -s "$log" ]]; then
    echo "check_install: the toolchain was called:" >&2
    cat "$log" >&2
    exit 1
fi
echo "== install checked: prebuilt extension selected, no compiler called"
