"""Fetch torch releases for their headers and libraries only, to build against them.

For each requirement (``torch==2.11.0``) this downloads the torch wheel for the running
CPython on manylinux x86_64, without dependencies, and unpacks only what compiling and linking
an extension needs: ``include/``, the libraries the extension links, and ``version.py``.
Each lands in ``INTO/<version>/torch``; the directories are printed joined by ``os.pathsep``,
ready for ``FASTMACE_OEQ_TORCH_TREES``. Nothing is installed and nothing is imported.

    python fetch_torch.py --into DIR torch==2.11.0 [torch==2.12.0 ...]

Extra pip options (an extra index for the +cu130 builds, --find-links, --no-index) come from
pip's own environment variables (PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS, PIP_NO_INDEX).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# The libraries libtorch_tp_jit links (build_inputs.TORCH_LIBRARIES), with their lib/ prefix.
LINKED = ("c10", "c10_cuda", "torch_cpu", "torch_cuda", "torch", "torch_python")
WANTED_FILES = {"torch/version.py", *(f"torch/lib/lib{name}.so" for name in LINKED)}


def wanted(member: str) -> bool:
    return member.startswith("torch/include/") or member in WANTED_FILES


def download(requirement: str, directory: Path) -> Path:
    python_version = f"{sys.version_info.major}.{sys.version_info.minor}"
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
        "--no-deps", "--only-binary=:all:", "--implementation", "cp",
        "--python-version", python_version, "--platform", "manylinux_2_28_x86_64",
        "--dest", str(directory), requirement,
    ]  # fmt: skip
    subprocess.run(command, check=True)
    wheels = sorted(directory.glob("torch-*.whl"))
    if len(wheels) != 1:
        sys.exit(f"fetch_torch: expected one torch wheel for {requirement}, found {wheels}")
    return wheels[0]


def unpack(wheel: Path, into: Path) -> Path:
    """The wanted members of the wheel under ``into/<version>/torch``; returns that path."""
    version = wheel.name.split("-")[1].split("+")[0]  # the directory names no local tag
    target = into / version
    if target.exists():
        shutil.rmtree(target)
    with zipfile.ZipFile(wheel) as archive:
        members = [name for name in archive.namelist() if wanted(name)]
        missing = sorted(WANTED_FILES - set(members))
        if missing:
            sys.exit(f"fetch_torch: {wheel.name} lacks {', '.join(missing)}")
        archive.extractall(target, members)
    return target / "torch"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--into", type=Path, required=True)
    parser.add_argument("requirements", nargs="+", help="e.g. torch==2.11.0")
    args = parser.parse_args()
    args.into.mkdir(parents=True, exist_ok=True)
    trees = []
    for requirement in args.requirements:
        with tempfile.TemporaryDirectory() as scratch:
            wheel = download(requirement, Path(scratch))
            print(f"fetch_torch: {wheel.name}", file=sys.stderr)
            trees.append(str(unpack(wheel, args.into)))
    print(os.pathsep.join(trees))


if __name__ == "__main__":
    main()
