"""Write ``manifest.json`` and ``BUILD_COMPILER.txt`` into the built package directory.

The manifest says exactly what each library was built against, so FastMACE can pick the one
for the running torch, or refuse them all, before loading anything. Version 2 lists one entry
per torch minor version (``torch-X.Y/libtorch_tp_jit.so``) with its own torch, ABI, SHA-256
and symbol versions. CMake's install step runs this on the stripped libraries; after
``auditwheel repair`` the release tooling runs it again (``--update``) on the libraries inside
the repaired wheel, so the SHA-256s and platform tag describe the files users install.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
from pathlib import Path

MANIFEST = "manifest.json"
MANIFEST_VERSION = 2
LIBRARY = "libtorch_tp_jit.so"
TORCH_FIELDS = ("torch", "torch_minor", "cuda", "cxx11_abi")
COMPILER_NOTE = "BUILD_COMPILER.txt"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _version_key(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def highest_symbol_versions(library: Path) -> dict[str, str | None]:
    """The highest GLIBC_ and GLIBCXX_ symbol versions the library needs (from readelf)."""
    listing = subprocess.run(
        ["readelf", "--version-info", "--wide", str(library)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    highest: dict[str, str | None] = {}
    for prefix in ("GLIBC", "GLIBCXX"):
        found = re.findall(rf"\b{prefix}_(\d+(?:\.\d+)+)\b", listing)
        highest[prefix] = max(found, key=_version_key) if found else None
    return highest


def library_facts(library: Path) -> dict:
    """The fields that describe one library file itself."""
    versions = highest_symbol_versions(library)
    return {
        "sha256": sha256(library),
        "glibc_max": versions["GLIBC"],
        "glibcxx_max": versions["GLIBCXX"],
    }


def write(package_dir: Path, manifest: dict) -> None:
    path = package_dir / MANIFEST
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def new_manifest(package_dir: Path, facts: dict, compiler: str) -> dict:
    """The manifest of a fresh build: one entry per torch in the build facts."""
    manifest = {key: facts[key] for key in ("openequivariance", "pybind11", "python_tag")}
    manifest.update(compiler=compiler, manifest_version=MANIFEST_VERSION, libraries=[])
    for torch in facts["torches"]:
        entry = {key: torch[key] for key in TORCH_FIELDS}
        entry["library"] = f"{torch['directory']}/{LIBRARY}"
        manifest["libraries"].append(entry)
    (package_dir / COMPILER_NOTE).write_text(
        f"{compiler}\nflags: {' '.join(facts['definitions'])} -O3 -std=c++20 -fPIC\n",
        encoding="utf-8",
    )
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("package_dir", type=Path, help="the installed fastmace_oeq_ext directory")
    parser.add_argument("--build-facts", type=Path, help="JSON written by build_inputs.py")
    parser.add_argument("--compiler", help="compiler id and version, e.g. 'GNU 12.2.0'")
    parser.add_argument("--platform-tag", default="linux_x86_64")
    parser.add_argument("--update", action="store_true", help="refresh the file fields only")
    args = parser.parse_args()
    if args.update:
        manifest = json.loads((args.package_dir / MANIFEST).read_text(encoding="utf-8"))
    else:
        facts = json.loads(args.build_facts.read_text(encoding="utf-8"))
        manifest = new_manifest(args.package_dir, facts, args.compiler)
    manifest["platform_tag"] = args.platform_tag
    for entry in manifest["libraries"]:
        entry.update(library_facts(args.package_dir / entry["library"]))
    write(args.package_dir, manifest)


if __name__ == "__main__":
    main()
