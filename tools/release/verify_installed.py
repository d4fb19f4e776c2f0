"""Verify that fastmace and fastmace-oeq-ext in this environment are the given local wheels.

The package index serves an unrelated project under both names, so a clean install must prove
it installed ours: each distribution's ``direct_url.json`` names the wheel file, its version
matches the file name, and the imported package lives in this environment. An install by name
from a directory of wheels (``pip install --no-index --find-links DIR "fastmace[oeq]"``, the
wheelhouse's) records no ``direct_url.json``: with ``--by-name`` every file the wheel's RECORD
lists outside its ``.dist-info`` must be installed with the same hash instead.

    python verify_installed.py [--by-name] CORE_WHEEL OEQ_WHEEL
"""

from __future__ import annotations

import json
import sys
import zipfile
from importlib import metadata, util
from pathlib import Path
from urllib.parse import unquote, urlparse


def installed_from(distribution: str) -> Path | None:
    text = metadata.distribution(distribution).read_text("direct_url.json")
    if not text:
        return None
    url = json.loads(text).get("url", "")
    return Path(unquote(urlparse(url).path)) if url.startswith("file://") else None


def _package_files(record: str) -> set[tuple[str, str]]:
    """(path, hash) of each file a RECORD lists outside the ``.dist-info`` directory (whose
    files pip writes itself)."""
    rows = (line.split(",") for line in record.splitlines() if line.strip())
    return {(row[0], row[1]) for row in rows if ".dist-info/" not in row[0]}


def same_files(distribution: str, wheel: Path) -> bool:
    """Whether the installed files of ``distribution`` are the wheel's, hash for hash."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/RECORD"))
        expected = _package_files(archive.read(name).decode())
    installed = _package_files(metadata.distribution(distribution).read_text("RECORD") or "")
    return bool(expected) and expected <= installed


def check(distribution: str, package: str, wheel: Path, by_name: bool = False) -> list[str]:
    problems = []
    source = installed_from(distribution)
    if by_name and source is None:
        if not same_files(distribution, wheel):
            problems.append(f"{distribution}'s installed files are not those of {wheel}")
        source = wheel  # its files, hash for hash
    elif source is None or source.resolve() != wheel.resolve():
        problems.append(f"{distribution} was installed from {source}, not {wheel}")
    version = metadata.version(distribution)
    if wheel.name.split("-")[1] != version:
        problems.append(f"{distribution} {version} does not match {wheel.name}")
    spec = util.find_spec(package)
    location = Path(spec.origin).resolve() if spec and spec.origin else None
    if location is None or not location.is_relative_to(Path(sys.prefix).resolve()):
        problems.append(f"{package} is imported from {location}, outside {sys.prefix}")
    print(f"verify_installed: {distribution} {version} from {source}")
    return problems


def main() -> None:
    arguments = sys.argv[1:]
    by_name = arguments[:1] == ["--by-name"]
    core, oeq = (Path(argument) for argument in arguments[by_name:][:2])
    problems = check("fastmace", "fastmace", core, by_name) + check(
        "fastmace-oeq-ext", "fastmace_oeq_ext", oeq, by_name
    )
    if problems:
        sys.exit("verify_installed: " + "; ".join(problems))


if __name__ == "__main__":
    main()
