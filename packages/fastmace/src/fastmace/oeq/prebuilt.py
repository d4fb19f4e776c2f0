"""The prebuilt OpenEquivariance host extension (``fastmace-oeq-ext``): is it usable here?

The wheel ships one ``libtorch_tp_jit.so`` per torch minor version
(``fastmace_oeq_ext/torch-X.Y/``) and a ``manifest.json`` (version 2) saying what each was
built against. A compiled extension works only with the torch minor version, CUDA major
version and C++ ABI it was built for, and with the exact OpenEquivariance and CPython; loading
a mismatched one fails with an undefined symbol, or worse, works wrongly. So we pick the entry
for the installed torch and check it before anything is loaded, reading files only: nothing
is imported here.
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
MANIFEST_VERSION = 2
REQUIRED_FIELDS = (
    "openequivariance", "pybind11", "python_tag", "platform_tag", "compiler", "libraries",
)  # fmt: skip
LIBRARY_FIELDS = ("torch", "torch_minor", "cuda", "cxx11_abi", "library", "sha256", "glibc_max")


@dataclass(frozen=True)
class InstalledVersions:
    """What the prebuilt extension must match, read without importing torch."""

    torch: str | None
    """torch's full version with its local tag, e.g. ``2.14.1+cu130`` (from torch/version.py)."""
    openequivariance: str | None
    python_tag: str
    platform: str
    torch_cuda: str | None = None
    """The CUDA version torch was built with (``13.0``), None for a CPU-only torch."""
    torch_cxx11_abi: bool | None = None
    """Whether torch uses the C++11 ABI; None when that cannot be read."""

    @property
    def torch_minor(self) -> str | None:
        """``2.14`` for ``2.14.1+cu130``."""
        return ".".join(self.torch.split("+")[0].split(".")[:2]) if self.torch else None


@dataclass(frozen=True)
class PrebuiltExtension:
    """A prebuilt library that matches this environment."""

    library: Path
    version: str
    manifest: dict
    entry: dict
    """The manifest's entry for this library (torch, CUDA, ABI, SHA-256, ...)."""

    @property
    def built_for_torch(self) -> str:
        return self.entry["torch"]


@dataclass(frozen=True)
class PrebuiltStatus:
    """The usable extension, or None and the precise reason it is not usable."""

    extension: PrebuiltExtension | None
    reason: str


def _torch_dir() -> Path | None:
    spec = importlib_util.find_spec("torch")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


def _version_constants(torch_dir: Path) -> dict[str, str | None]:
    """The constant assignments of torch/version.py (``__version__``, ``cuda``, ...)."""
    try:
        tree = ast.parse((torch_dir / "version.py").read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return {}
    constants: dict[str, str | None] = {}
    for node in tree.body:
        targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
        value = getattr(node, "value", None)
        if isinstance(value, ast.Constant) and (
            value.value is None or isinstance(value.value, str)
        ):
            for target in targets:
                if isinstance(target, ast.Name):
                    constants[target.id] = value.value
    return constants


def torch_full_version() -> str | None:
    """torch's ``__version__`` (with its ``+cuXXX`` tag), parsed from torch/version.py."""
    torch_dir = _torch_dir()
    return _version_constants(torch_dir).get("__version__") if torch_dir else None


def torch_uses_cxx11_abi(torch_dir: Path) -> bool | None:
    """Whether libc10 names ``std::__cxx11`` (the C++11 ABI); None if it cannot be read."""
    try:
        return b"__cxx11" in (torch_dir / "lib" / "libc10.so").read_bytes()
    except OSError:
        return None


def installed_versions() -> InstalledVersions:
    """torch, OpenEquivariance, CPython and platform of this environment."""
    try:
        oeq = metadata.version("openequivariance")
    except metadata.PackageNotFoundError:
        oeq = None
    python_tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    torch_dir = _torch_dir()
    constants = _version_constants(torch_dir) if torch_dir else {}
    return InstalledVersions(
        torch=constants.get("__version__"),
        openequivariance=oeq,
        python_tag=python_tag,
        platform=f"{sys.platform}_{platform.machine()}",
        torch_cuda=constants.get("cuda"),
        torch_cxx11_abi=torch_uses_cxx11_abi(torch_dir) if torch_dir else None,
    )


def _package_dir() -> Path | None:
    spec = importlib_util.find_spec(PACKAGE)  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _common_mismatches(manifest: dict, installed: InstalledVersions) -> list[str]:
    """What rules out every library of the wheel: OpenEquivariance, CPython, platform."""
    problems = []
    for key, name, have in (
        ("openequivariance", "OpenEquivariance", installed.openequivariance),
        ("python_tag", "CPython", installed.python_tag),
    ):
        if manifest[key] != have:
            now = f"{name} {have} is installed" if have else f"{name} is not installed"
            problems.append(f"it was built for {name} {manifest[key]}, but {now}")
    if installed.platform != "linux_x86_64":
        problems.append(f"it runs on Linux x86_64 only, and this is {installed.platform}")
    return problems


def _entry_mismatches(entry: dict, installed: InstalledVersions) -> list[str]:
    """What rules out the library built for the installed torch's minor version."""
    problems = []
    built_cuda, have_cuda = entry["cuda"], installed.torch_cuda
    if have_cuda is None or built_cuda.split(".")[0] != have_cuda.split(".")[0]:
        uses = f"uses CUDA {have_cuda}" if have_cuda else "is built without CUDA"
        problems.append(
            f"its torch {entry['torch_minor']} library is built for CUDA {built_cuda}, but "
            f"torch {installed.torch} {uses}"
        )
    if installed.torch_cxx11_abi is None:
        problems.append(f"torch {installed.torch}'s C++ ABI cannot be read from its libc10.so")
    elif entry["cxx11_abi"] != installed.torch_cxx11_abi:
        abi = "the C++11 ABI" if entry["cxx11_abi"] else "the pre-C++11 ABI"
        problems.append(
            f"its torch {entry['torch_minor']} library uses {abi}, and torch "
            f"{installed.torch} does not"
        )
    return problems


def _pick_entry(manifest: dict, installed: InstalledVersions) -> tuple[dict | None, str]:
    """The entry for the installed torch, or None and why none fits."""
    entries = manifest["libraries"]
    built = ", ".join(entry["torch_minor"] for entry in entries) or "no torch"
    if installed.torch is None:
        return None, f"torch is not installed (the wheel holds libraries for torch {built})"
    matching = [entry for entry in entries if entry["torch_minor"] == installed.torch_minor]
    if not matching:
        newest = entries[-1]["torch_minor"] if entries else None
        fix = (
            f"install a torch it was built for (pip install 'torch=={newest}.*'), or "
            if newest
            else ""
        )
        return None, (
            f"it holds libraries for torch {built}, and torch {installed.torch} is installed: "
            f"{fix}let FastMACE build the extension with the host toolchain"
        )
    problems = _entry_mismatches(matching[0], installed)
    return (None, "; ".join(problems)) if problems else (matching[0], "")


def _read_manifest(path: Path) -> tuple[dict | None, str]:
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        return None, f"its manifest {path} is unreadable: {error}"
    if manifest.get("manifest_version") != MANIFEST_VERSION:
        return None, (
            f"its manifest {path} has version {manifest.get('manifest_version')}, and this "
            f"FastMACE reads version {MANIFEST_VERSION} (one library per torch minor): install "
            f"the {DISTRIBUTION} built from this FastMACE's repository"
        )
    missing = [key for key in REQUIRED_FIELDS if key not in manifest]
    for index, entry in enumerate(manifest.get("libraries", [])):
        missing += [f"libraries[{index}].{key}" for key in LIBRARY_FIELDS if key not in entry]
    if missing:
        return None, f"its manifest {path} lacks {', '.join(missing)}"
    return manifest, ""


def prebuilt_extension(installed: InstalledVersions | None = None) -> PrebuiltStatus:
    """The prebuilt library for the installed torch, if the manifest says it fits exactly."""
    directory = _package_dir()
    if directory is None:
        return PrebuiltStatus(None, f"{DISTRIBUTION} is not installed")
    manifest, reason = _read_manifest(directory / MANIFEST)
    if manifest is None:
        return PrebuiltStatus(None, reason)
    installed = installed or installed_versions()
    problems = _common_mismatches(manifest, installed)
    if problems:
        return PrebuiltStatus(None, "; ".join(problems))
    entry, reason = _pick_entry(manifest, installed)
    if entry is None:
        return PrebuiltStatus(None, reason)
    library = directory / entry["library"]
    if not library.is_file():
        return PrebuiltStatus(None, f"its library {library} is missing")
    actual = sha256_file(library)
    if actual != entry["sha256"]:
        return PrebuiltStatus(
            None,
            f"its library {library} has SHA-256 {actual}, not the manifest's {entry['sha256']}",
        )
    try:
        version = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        version = "unknown"
    return PrebuiltStatus(
        PrebuiltExtension(library, version, manifest, entry),
        f"{DISTRIBUTION} {version} matches (its library for torch {entry['torch']})",
    )
