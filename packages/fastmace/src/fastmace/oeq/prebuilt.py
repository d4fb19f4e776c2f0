"""The prebuilt OpenEquivariance host extension (``fastmace-oeq-ext``): is it usable here?

The wheel ships ``fastmace_oeq_ext/libtorch_tp_jit.so`` and a ``manifest.json`` saying what it
was built against. A compiled extension works only with the exact torch (including its
``+cuXXX`` tag), OpenEquivariance and CPython it was built for; loading a mismatched one fails
with an undefined symbol, or worse, works wrongly. So we compare the manifest with what is
installed before anything is loaded, reading files only: nothing is imported here.
"""

from __future__ import annotations

import ast
import json
import platform
import sys
from dataclasses import dataclass
from importlib import metadata
from importlib import util as importlib_util
from pathlib import Path

from fastmace.runtime.digest import sha256_file

PACKAGE = "fastmace_oeq_ext"
DISTRIBUTION = "fastmace-oeq-ext"
MANIFEST = "manifest.json"
REQUIRED_FIELDS = (
    "torch", "cuda", "openequivariance", "pybind11", "python_tag", "platform_tag", "library",
    "sha256", "compiler", "glibc_max",
)  # fmt: skip


@dataclass(frozen=True)
class InstalledVersions:
    """What the prebuilt extension must match, read without importing torch."""

    torch: str | None
    """torch's full version with its local tag, e.g. ``2.14.1+cu130`` (from torch/version.py)."""
    openequivariance: str | None
    python_tag: str
    platform: str


@dataclass(frozen=True)
class PrebuiltExtension:
    """A prebuilt extension that matches this environment."""

    library: Path
    version: str
    manifest: dict


@dataclass(frozen=True)
class PrebuiltStatus:
    """The usable extension, or None and the precise reason it is not usable."""

    extension: PrebuiltExtension | None
    reason: str


def torch_full_version() -> str | None:
    """torch's ``__version__`` (with its ``+cuXXX`` tag), parsed from torch/version.py."""
    spec = importlib_util.find_spec("torch")
    if spec is None or spec.origin is None:
        return None
    source = Path(spec.origin).with_name("version.py")
    try:
        tree = ast.parse(source.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return None
    for node in tree.body:
        targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
        for target in targets:
            if isinstance(target, ast.Name) and target.id == "__version__":
                value = node.value
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    return value.value
    return None


def installed_versions() -> InstalledVersions:
    """torch, OpenEquivariance, CPython and platform of this environment."""
    try:
        oeq = metadata.version("openequivariance")
    except metadata.PackageNotFoundError:
        oeq = None
    python_tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    return InstalledVersions(
        torch_full_version(), oeq, python_tag, f"{sys.platform}_{platform.machine()}"
    )


def _package_dir() -> Path | None:
    spec = importlib_util.find_spec(PACKAGE)  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _mismatches(manifest: dict, installed: InstalledVersions) -> list[str]:
    problems = []
    for key, name, have in (
        ("torch", "torch", installed.torch),
        ("openequivariance", "OpenEquivariance", installed.openequivariance),
        ("python_tag", "CPython", installed.python_tag),
    ):
        if manifest[key] != have:
            now = f"{name} {have} is installed" if have else f"{name} is not installed"
            problems.append(f"it was built for {name} {manifest[key]}, but {now}")
    if installed.platform != "linux_x86_64":
        problems.append(f"it runs on Linux x86_64 only, and this is {installed.platform}")
    return problems


def prebuilt_extension(installed: InstalledVersions | None = None) -> PrebuiltStatus:
    """The prebuilt extension if its manifest matches this environment exactly."""
    directory = _package_dir()
    if directory is None:
        return PrebuiltStatus(None, f"{DISTRIBUTION} is not installed")
    manifest_path = directory / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        return PrebuiltStatus(None, f"its manifest {manifest_path} is unreadable: {error}")
    missing = [key for key in REQUIRED_FIELDS if key not in manifest]
    if missing:
        return PrebuiltStatus(None, f"its manifest {manifest_path} lacks {', '.join(missing)}")
    problems = _mismatches(manifest, installed or installed_versions())
    if problems:
        return PrebuiltStatus(None, "; ".join(problems))
    library = directory / manifest["library"]
    if not library.is_file():
        return PrebuiltStatus(None, f"its library {library} is missing")
    actual = sha256_file(library)
    if actual != manifest["sha256"]:
        return PrebuiltStatus(
            None,
            f"its library {library} has SHA-256 {actual}, not the manifest's {manifest['sha256']}",
        )
    try:
        version = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        version = "unknown"
    return PrebuiltStatus(
        PrebuiltExtension(library, version, manifest), f"{DISTRIBUTION} {version} matches"
    )
