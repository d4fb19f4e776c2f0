"""Finding what an OpenEquivariance host build needs: compiler, ninja, CUDA runtime, driver.

Each finder looks without loading or importing anything, so ``fastmace doctor`` can use them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from importlib import util as importlib_util
from pathlib import Path

from fastmace.runtime import environment

DRIVER_LIBRARY = "libcuda.so.1"
# The dynamic loader's default directories, searched after its cache.
_LOADER_DEFAULT_DIRS = ("/lib64", "/usr/lib64", "/lib", "/usr/lib")
_LDCONFIG_CANDIDATES = ("ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig")


def nvidia_wheel_lib_dirs(cuda_major: int = 13) -> list[Path]:
    """Every ``nvidia/cu<major>/lib``: the namespace package may span several site directories
    (a venv over another environment, header-only wheels installed elsewhere)."""
    candidates = [Path(location, f"cu{cuda_major}", "lib") for location in _nvidia_locations()]
    return [candidate for candidate in candidates if candidate.is_dir()]


def _nvidia_locations() -> list[str]:
    spec = importlib_util.find_spec("nvidia")  # a namespace package: finding it runs no code
    if spec is None or spec.submodule_search_locations is None:
        return []
    return list(spec.submodule_search_locations)


def cuda_wheel_library(stem: str, cuda_major: int = 13) -> Path | None:
    """A library of torch's CUDA wheels, e.g. ``libcudart`` -> ``.../libcudart.so.13``."""
    for lib_dir in nvidia_wheel_lib_dirs(cuda_major):
        candidate = lib_dir / f"{stem}.so.{cuda_major}"
        if candidate.exists():
            return candidate
    return None


def nvidia_wheel_lib_dir(cuda_major: int = 13) -> Path | None:
    """The ``nvidia/cu<major>/lib`` that holds the CUDA runtime (libcudart)."""
    runtime = cuda_wheel_library("libcudart", cuda_major)
    return runtime.parent if runtime is not None else None


def cuda_wheel_include_dirs(cuda_major: int = 13) -> list[Path]:
    """Every ``nvidia/cu<major>/include`` (the runtime's headers, nvidia-cuda-crt's, ...),
    the runtime's own first so that its copy of a header wins."""
    found = [Path(location, f"cu{cuda_major}", "include") for location in _nvidia_locations()]
    runtime = nvidia_wheel_lib_dir(cuda_major)
    home = runtime.parent if runtime is not None else None
    return sorted((d for d in found if d.is_dir()), key=lambda d: d.parent != home)


def cuda_wheel_header(relative: str, cuda_major: int = 13) -> Path | None:
    """A header of the CUDA wheels, e.g. ``crt/host_config.h`` (from nvidia-cuda-crt)."""
    for directory in cuda_wheel_include_dirs(cuda_major):
        if (directory / relative).is_file():
            return directory / relative
    return None


def ldconfig_cache(library: str) -> list[Path]:
    """Paths the loader's cache (``ldconfig -p``) lists for ``library``, 64-bit first."""
    for command in _LDCONFIG_CANDIDATES:
        executable = shutil.which(command)
        if executable is None:
            continue
        try:
            listing = subprocess.run(
                [executable, "-p"], capture_output=True, text=True, timeout=20, check=False
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        return parse_ldconfig_listing(listing, library)
    return []


def parse_ldconfig_listing(listing: str, library: str) -> list[Path]:
    """Parse ``ldconfig -p`` output: ``\\tlibcuda.so.1 (libc6,x86-64) => /path/libcuda.so.1``."""
    found: list[tuple[bool, Path]] = []
    for line in listing.splitlines():
        name, _, rest = line.strip().partition(" (")
        if name != library or "=>" not in rest:
            continue
        flags, _, path = rest.partition("=>")
        found.append(("64" not in flags, Path(path.strip())))
    return [path for _, path in sorted(found, key=lambda item: item[0])]


def find_driver_library(environ: Mapping[str, str] | None = None) -> tuple[Path | None, str]:
    """libcuda.so.1 the way the dynamic loader finds it, and where it came from.

    Order: OEQ_CUDA_DRIVER_LIBRARY, LD_LIBRARY_PATH, the loader's cache (``ldconfig -p``; on
    clusters and in containers the driver often lives in a directory only the cache lists),
    then the loader's default directories.
    """
    env = os.environ if environ is None else environ
    override = environment.cuda_driver_library(env)
    if override is not None:
        return (
            (override, "OEQ_CUDA_DRIVER_LIBRARY")
            if override.exists()
            else (None, (f"OEQ_CUDA_DRIVER_LIBRARY={override} does not exist"))
        )
    for directory in filter(None, env.get("LD_LIBRARY_PATH", "").split(":")):
        candidate = Path(directory, DRIVER_LIBRARY)
        if candidate.exists():
            return candidate, "LD_LIBRARY_PATH"
    for candidate in ldconfig_cache(DRIVER_LIBRARY):
        if candidate.exists():
            return candidate, "the loader's cache (ldconfig -p)"
    for directory in _LOADER_DEFAULT_DIRS:
        candidate = Path(directory, DRIVER_LIBRARY)
        if candidate.exists():
            return candidate, "the loader's default directories"
    return None, "not in OEQ_CUDA_DRIVER_LIBRARY, LD_LIBRARY_PATH, ldconfig -p or /lib*, /usr/lib*"


def find_ninja() -> str | None:
    """The ninja executable torch's extension builder would run."""
    return shutil.which("ninja")


def find_cxx(environ: Mapping[str, str] | None = None) -> str | None:
    """The C++ compiler torch's extension builder would run (``$CXX``, else ``c++``/``g++``)."""
    env = os.environ if environ is None else environ
    for candidate in (env.get("CXX"), "c++", "g++"):
        if candidate and (found := shutil.which(candidate)):
            return found
    return None
