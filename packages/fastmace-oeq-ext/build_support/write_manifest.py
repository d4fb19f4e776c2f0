"""Write ``manifest.json`` and ``BUILD_COMPILER.txt`` next to the built library.

The manifest says exactly what the library was built against, so FastMACE can accept or refuse
it before loading it. CMake's install step runs this on the stripped library; after
``auditwheel repair`` the release tooling runs it again (``--update``) on the library inside
the repaired wheel, so the SHA-256 and platform tag describe the file users install.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
from pathlib import Path

MANIFEST = "manifest.json"
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


def library_facts(library: Path, platform_tag: str) -> dict:
    """The fields that describe the library file itself."""
    versions = highest_symbol_versions(library)
    return {
        "library": library.name,
        "sha256": sha256(library),
        "platform_tag": platform_tag,
        "glibc_max": versions["GLIBC"],
        "glibcxx_max": versions["GLIBCXX"],
    }


def write(package_dir: Path, manifest: dict) -> None:
    path = package_dir / MANIFEST
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("library", type=Path)
    parser.add_argument("--build-facts", type=Path, help="JSON written by build_inputs.py")
    parser.add_argument("--compiler", help="compiler id and version, e.g. 'GNU 12.2.0'")
    parser.add_argument("--platform-tag", default="linux_x86_64")
    parser.add_argument("--update", action="store_true", help="refresh the file fields only")
    args = parser.parse_args()
    package_dir = args.library.parent
    if args.update:
        manifest = json.loads((package_dir / MANIFEST).read_text(encoding="utf-8"))
    else:
        facts = json.loads(args.build_facts.read_text(encoding="utf-8"))
        manifest = {
            key: facts[key]
            for key in ("torch", "cuda", "openequivariance", "pybind11", "python_tag")
        }
        manifest["compiler"] = args.compiler
        manifest["manifest_version"] = 1
        (package_dir / COMPILER_NOTE).write_text(
            f"{args.compiler}\nflags: {' '.join(facts['definitions'])} -O3 -std=c++20 -fPIC\n",
            encoding="utf-8",
        )
    manifest.update(library_facts(args.library, args.platform_tag))
    write(package_dir, manifest)


if __name__ == "__main__":
    main()
