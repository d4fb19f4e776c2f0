"""Build a torch extension once per build identity, into a cache that needs no lock.

A process that finds ``<cache>/oeq/extensions/<key>/<name>.so`` copies it into its private
directory (the per-process ``TORCH_EXTENSIONS_DIR``) and loads that copy (``reused``).
Otherwise it builds with torch's own builder in its private directory, copies the library into
a staging directory beside the cache entry and renames it into place (``built``). When several
processes build at once, each gets a working library; the first rename wins and the others
record ``raced`` and drop their copies. A rename is atomic on local disks and on NFS, so the
cache may live on NFS and no process ever waits on a lock file (a killed build leaves only a
``.staging-*`` directory, never a lock).

The key is a hash of everything that changes the compiled code: Python and its environment,
torch, the sources' contents, the flags, the compiler and the build variables; never the
shapes or models that later use the extension.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from importlib import util as importlib_util
from pathlib import Path
from types import ModuleType

from fastmace.oeq.prebuilt import torch_full_version

BUILT, REUSED, RACED = "built", "reused", "raced"
IDENTITY_FILE = "identity.json"
# Variables that change what torch's builder compiles or links.
BUILD_VARIABLES = ("CXX", "CFLAGS", "CXXFLAGS", "LDFLAGS", "CPATH", "TORCH_CUDA_ARCH_LIST")


@dataclass(frozen=True)
class BuildResult:
    """The loaded module, how it was obtained and the library it came from."""

    module: ModuleType
    outcome: str
    library: Path
    key: str


def _sha256_of(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def compiler_version(compiler: str) -> str:
    """The first line of ``compiler --version``: two compilers at one path differ here."""
    try:
        output = subprocess.run(
            [compiler, "--version"], capture_output=True, text=True, timeout=30, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"unknown ({error})"
    return output.splitlines()[0] if output else "unknown"


def build_identity(
    name: str,
    sources: Sequence[str],
    options: Mapping[str, object],
    compiler: str,
    environ: Mapping[str, str],
) -> dict[str, object]:
    """Everything that changes the compiled library, as plain data."""
    return {
        "name": name,
        "python": sys.version,
        "environment": sys.prefix,
        "torch": torch_full_version(),
        "openequivariance": _version("openequivariance"),
        "cuda_runtime_wheel": _version("nvidia-cuda-runtime"),
        "sources": {source: _sha256_of(source) for source in sources},
        "options": {key: options[key] for key in sorted(options)},
        "compiler": {"path": compiler, "version": compiler_version(compiler)},
        "variables": {key: environ.get(key) for key in BUILD_VARIABLES},
    }


def identity_key(identity: Mapping[str, object]) -> str:
    text = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def import_library(name: str, library: Path) -> ModuleType:
    """Import the extension module ``name`` from ``library`` (a pybind11 module)."""
    spec = importlib_util.spec_from_file_location(name, library)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {library} as the module {name}")
    module = importlib_util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def publish(library: Path, identity: Mapping[str, object], entry: Path) -> str:
    """Move a copy of ``library`` into ``entry`` atomically; ``built`` or ``raced``."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=entry.parent))
    try:
        shutil.copy2(library, staging / library.name)
        (staging / IDENTITY_FILE).write_text(
            json.dumps(identity, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8"
        )
        try:
            staging.rename(entry)
        except OSError:
            if (entry / library.name).is_file():
                return RACED  # another process published the same build first
            raise
        return BUILT
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def build_once(
    real_load: Callable[..., ModuleType],
    name: str,
    sources: Sequence[str],
    options: dict[str, object],
    *,
    extensions_dir: Path,
    private_dir: Path,
    compiler: str,
    environ: Mapping[str, str] | None = None,
) -> BuildResult:
    """Load ``name`` from the cache, or build it with ``real_load`` and publish it.

    ``real_load`` is torch's ``cpp_extension.load``; ``options`` are its keyword arguments
    other than the build directory, which is always ``private_dir/name``.
    """
    env = os.environ if environ is None else environ
    identity = build_identity(name, sources, options, compiler, env)
    key = identity_key(identity)
    entry = extensions_dir / key
    cached = entry / f"{name}.so"
    build_directory = private_dir / name
    build_directory.mkdir(parents=True, exist_ok=True)
    if cached.is_file():
        # Seed the private directory with the published build and load the copy, so the
        # process never depends on the shared cache (which may be on NFS) after this point.
        seeded = build_directory / cached.name
        shutil.copy2(cached, seeded)
        return BuildResult(import_library(name, seeded), REUSED, cached, key)
    module = real_load(name, list(sources), build_directory=str(build_directory), **options)
    outcome = publish(Path(module.__file__), identity, entry)
    return BuildResult(module, outcome, cached, key)
