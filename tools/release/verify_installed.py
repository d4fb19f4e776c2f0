"""Verify that fastmace and fastmace-oeq-ext in this environment are the given local wheels.

The package index serves an unrelated project under both names, so a clean install must prove
it installed ours: each distribution's ``direct_url.json`` names the wheel file, its version
matches the file name, and the imported package lives in this environment.

    python verify_installed.py CORE_WHEEL OEQ_WHEEL
"""

from __future__ import annotations

import json
import sys
from importlib import metadata, util
from pathlib import Path
from urllib.parse import unquote, urlparse


def installed_from(distribution: str) -> Path | None:
    text = metadata.distribution(distribution).read_text("direct_url.json")
    if not text:
        return None
    url = json.loads(text).get("url", "")
    return Path(unquote(urlparse(url).path)) if url.startswith("file://") else None


def check(distribution: str, package: str, wheel: Path) -> list[str]:
    problems = []
    source = installed_from(distribution)
    if source is None or source.resolve() != wheel.resolve():
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
    core, oeq = (Path(argument) for argument in sys.argv[1:3])
    problems = check("fastmace", "fastmace", core) + check(
        "fastmace-oeq-ext", "fastmace_oeq_ext", oeq
    )
    if problems:
        sys.exit("verify_installed: " + "; ".join(problems))


if __name__ == "__main__":
    main()
