#!/usr/bin/env bash
# One directory of wheels that installs FastMACE with the hybrid backend where there is no
# network (an air-gapped cluster), made where there is:
#
#   tools/release/wheelhouse.sh DIR            # here, with the package index
#   pip install --no-index --find-links DIR "fastmace[oeq]"      # there, offline
#
# DIR receives: our two wheels built from this checkout (fastmace, and fastmace-oeq-ext by
# oeq_wheels/build.sh --local), OpenEquivariance 0.7.0 built once into a wheel (its sdist would
# otherwise download libtorch while it builds, which fails offline), and every other
# requirement of "fastmace[oeq]" and of fastmace-oeq-ext (torch 2.14.1 with its CUDA wheels,
# mace-torch, cuEquivariance, ...) from the index, as wheels. Our two names are never resolved
# from the index, where an unrelated project uses them. At the end a fresh venv installs
# "fastmace[oeq]" from DIR with the index switched off and passes check_install.sh (the
# prebuilt extension chosen, no compiler called, a smoke run): the proof.
#
# Environment: PYTHON (default python3.11: the wheels are for its version), EXTRAS (default
# oeq), EXTRA_TORCH (more torches for fastmace-oeq-ext to hold a library for, e.g.
# "torch==2.11.0"; default none), OEQ_EXT_WHEEL (a fastmace-oeq-ext wheel just built from this
# checkout, copied instead of building one), MAX_JOBS (compile jobs, default 2). Takes about ten minutes and several GB (torch's
# CUDA libraries are most of it).
set -euo pipefail

if [[ $# -ne 1 ]]; then
    echo "usage: $0 DIR" >&2
    exit 2
fi
mkdir -p "$1"
dir="$(cd "$1" && pwd)"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
python="${PYTHON:-python3.11}"
extras="${EXTRAS:-oeq}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
pip_args=(--quiet --disable-pip-version-check)

echo "== our wheels: fastmace and fastmace-oeq-ext, from this checkout"
"$python" -m venv "$work/build"
"$work/build/bin/pip" install "${pip_args[@]}" "torch==2.14.1" "packaging>=23"
"$work/build/bin/pip" wheel "${pip_args[@]}" --no-deps -w "$dir" "$root/packages/fastmace"
if [[ -n "${OEQ_EXT_WHEEL:-}" ]]; then
    # Built from this checkout a moment ago (nox's native_wheel, which checked it): reused.
    echo "fastmace-oeq-ext: reusing $OEQ_EXT_WHEEL"
    cp "$OEQ_EXT_WHEEL" "$dir/"
else
    # Its library for the wheelhouse's torch; EXTRA_TORCH adds others (build.sh).
    BUILD_VENV="$work/build" PYTHON="$python" EXTRA_TORCH="${EXTRA_TORCH:-}" \
        bash "$root/tools/release/oeq_wheels/build.sh" --local "$dir"
fi

echo "== OpenEquivariance 0.7.0, built once against the build venv's torch"
torch_dir="$("$work/build/bin/python" -c 'import importlib.util as u, os; print(os.path.dirname(u.find_spec("torch").origin))')"
"$work/build/bin/pip" wheel "${pip_args[@]}" --no-deps -w "$dir" "openequivariance==0.7.0" \
    -C "cmake.define.FETCHCONTENT_SOURCE_DIR_LIBTORCH=$torch_dir" \
    -C cmake.define.CMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON

echo "== everything else, from the index"
# The requirements the three wheels built above declare (ours with the extras), for this
# interpreter, less those three: pip resolves the rest and their own requirements.
"$work/build/bin/python" - "$dir" "$extras" > "$work/requirements.txt" <<'PY'
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement

directory, extras = Path(sys.argv[1]), [e for e in sys.argv[2].split(",") if e]
built = {"fastmace", "fastmace-oeq-ext", "openequivariance"}
wanted = set()
for pattern in ("fastmace-*.whl", "fastmace_oeq_ext-*.whl", "openequivariance-*.whl"):
    for wheel in directory.glob(pattern):
        with zipfile.ZipFile(wheel) as archive:
            name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
            lines = archive.read(name).decode().splitlines()
        for line in lines:
            if not line.startswith("Requires-Dist:"):
                continue
            requirement = Requirement(line.partition(":")[2].strip())
            marker = requirement.marker
            if marker is not None and not any(
                marker.evaluate({"extra": extra}) for extra in [*extras, ""]
            ):
                continue
            if requirement.name.lower().replace("_", "-") in built:
                continue
            requirement.marker = None
            wanted.add(str(requirement))
print("\n".join(sorted(wanted)))
PY
cat "$work/requirements.txt"
# `pip wheel`, not `pip download`: a requirement published only as an sdist (mace-torch's
# python-hostlist) becomes a wheel here, so nothing needs building where there is no index.
"$work/build/bin/pip" wheel "${pip_args[@]}" --prefer-binary -w "$dir" \
    -r "$work/requirements.txt"

echo "== the proof: a fresh venv, the index switched off"
"$python" -m venv "$work/offline"
PIP_NO_INDEX=1 "$work/offline/bin/pip" install "${pip_args[@]}" --no-index \
    --find-links "$dir" "fastmace[$extras]"
"$work/offline/bin/python" -c "
import importlib.metadata as m, fastmace
print('installed offline: fastmace', fastmace.__version__, '| fastmace-oeq-ext',
      m.version('fastmace-oeq-ext'), '| openequivariance', m.version('openequivariance'),
      '| torch', m.version('torch'))
"
# What a clean install must show (check_install.sh), on the offline install itself: our files,
# the prebuilt extension chosen for this torch, no compiler called, a smoke run.
CHECK_INSTALL_BY_NAME=1 bash "$root/tools/release/check_install.sh" "$work/offline" \
    "$(ls "$dir"/fastmace-*.whl)" "$(ls "$dir"/fastmace_oeq_ext-*.whl)"
echo "== $dir: $(ls "$dir" | wc -l) wheels, $(du -sh "$dir" | cut -f1)"
