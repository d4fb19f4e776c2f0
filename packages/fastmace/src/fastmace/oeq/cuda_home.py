"""A stand-in CUDA home for OpenEquivariance's host extension: links only, and no nvcc.

OpenEquivariance compiles its host code with a C++ compiler and its kernels with NVRTC at run
time; it never needs nvcc. But torch's extension builder looks for a CUDA home (headers,
``lib64`` for the link) and clusters' compute nodes rarely have a toolkit. The stand-in under
``<cache>/oeq/cuda-runtime/<key>/`` links the CUDA 13 wheels torch installed and the driver
library, and its ``bin/nvcc`` logs each call to ``<cache>/oeq/nvcc-attempts.log`` and fails,
so an unexpected nvcc call is visible instead of silently using some other toolkit.

The key covers the linked paths, so environments sharing one cache never share a stand-in.
It is assembled in a staging directory and renamed into place: no lock is needed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

# What torch's extension builder and OEq's link line (-lcudart -lnvrtc -lcublas -lcuda) need.
_WHEEL_LIBRARIES = ("libcudart", "libnvrtc", "libcublas", "libcublasLt")

_NVCC_STAND_IN = """#!/bin/sh
# FastMACE's nvcc stand-in: OpenEquivariance's host build never needs nvcc. Log and fail.
log="${{OEQ_NVCC_ATTEMPTS:-{log}}}"
printf '%s pid %s cwd %s: nvcc %s\\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$$" "$PWD" "$*" >> "$log"
echo "fastmace: nvcc was called, but this CUDA home is FastMACE's stand-in for" \\
     "OpenEquivariance (no nvcc); the call is logged in $log" >&2
exit 1
"""


@dataclass(frozen=True)
class CudaHome:
    """Where the stand-in lives and what it points to."""

    root: Path
    nvcc: Path
    attempts_log: Path

    @property
    def include(self) -> Path:
        return self.root / "include"

    @property
    def lib(self) -> Path:
        return self.root / "lib64"


def _links(include_dirs: list[Path], lib_dir: Path, driver: Path) -> dict[str, Path]:
    """Relative path in the stand-in -> what it links to.

    The headers may come from several wheels in different site directories (the runtime's,
    nvidia-cuda-crt's): ``include/`` links each entry, the first directory winning.
    """
    links: dict[str, Path] = {}
    for directory in include_dirs:
        for entry in sorted(directory.iterdir()):
            links.setdefault(f"include/{entry.name}", entry)
    for stem in _WHEEL_LIBRARIES:
        target = lib_dir / f"{stem}.so.13"
        if target.exists():
            links[f"lib64/{stem}.so"] = target
            links[f"lib64/{stem}.so.13"] = target
    links["lib64/libcuda.so"] = driver
    links["lib64/libcuda.so.1"] = driver
    return links


def _key(links: dict[str, Path]) -> str:
    text = "\n".join(f"{name}={target}" for name, target in sorted(links.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _is_complete(root: Path, links: dict[str, Path]) -> bool:
    return (root / "bin" / "nvcc").is_file() and all(
        (root / name).is_symlink() and os.readlink(root / name) == str(target)
        for name, target in links.items()
    )


def prepare_cuda_home(
    oeq_cache: Path, include_dirs: list[Path], lib_dir: Path, driver: Path
) -> CudaHome:
    """The stand-in for this environment's CUDA wheels and driver, created if missing."""
    links = _links(include_dirs, lib_dir, driver)
    base = oeq_cache / "cuda-runtime"
    root = base / _key(links)
    log = oeq_cache / "nvcc-attempts.log"
    home = CudaHome(root, root / "bin" / "nvcc", log)
    if _is_complete(root, links):
        return home
    base.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=base))
    try:
        for name, target in links.items():
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            (staging / name).symlink_to(target)
        (staging / "bin").mkdir()
        (staging / "bin" / "nvcc").write_text(_NVCC_STAND_IN.format(log=log), encoding="utf-8")
        (staging / "bin" / "nvcc").chmod(0o755)
        if root.exists() and not _is_complete(root, links):
            shutil.rmtree(root, ignore_errors=True)  # an interrupted or outdated stand-in
        try:
            staging.rename(root)
        except OSError:
            if not _is_complete(root, links):  # another process won the rename: use its copy
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return home
