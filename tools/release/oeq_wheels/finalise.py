"""Refresh ``manifest.json`` inside repaired fastmace-oeq-ext wheels.

``auditwheel repair`` retags the wheel and may rewrite the libraries; the manifest must
describe the files users install. For each wheel in WHEEL_DIR this recomputes every library's
SHA-256 and symbol versions and the platform tag (via the project's write_manifest.py) and
rewrites the manifest and its RECORD line in place.

    python finalise.py WHEEL_DIR
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
WRITE_MANIFEST = ROOT / "packages" / "fastmace-oeq-ext" / "build_support" / "write_manifest.py"
PACKAGE = "fastmace_oeq_ext"


def record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


def platform_tag(wheel: Path) -> str:
    return wheel.name.removesuffix(".whl").split("-")[-1]


def finalise(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        entries = {info.filename: archive.read(info) for info in archive.infolist()}
    libraries = [name for name in entries if name.endswith("/libtorch_tp_jit.so")]
    with tempfile.TemporaryDirectory() as scratch:
        for name in [*libraries, f"{PACKAGE}/manifest.json"]:
            path = Path(scratch, name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(entries[name])
        package_dir = Path(scratch, PACKAGE)
        subprocess.run(
            [sys.executable, str(WRITE_MANIFEST), str(package_dir),
             "--update", "--platform-tag", platform_tag(wheel)],
            check=True,
        )  # fmt: skip
        manifest = (package_dir / "manifest.json").read_bytes()
    manifest_name = f"{PACKAGE}/manifest.json"
    entries[manifest_name] = manifest
    record_name = next(name for name in entries if name.endswith(".dist-info/RECORD"))
    lines = entries[record_name].decode().splitlines()
    lines = [
        f"{manifest_name},{record_hash(manifest)},{len(manifest)}"
        if line.startswith(f"{manifest_name},")
        else line
        for line in lines
    ]
    entries[record_name] = ("\n".join(lines) + "\n").encode()
    staging = wheel.with_suffix(".whl.part")
    with zipfile.ZipFile(staging, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    staging.replace(wheel)
    print(f"finalise: {wheel.name}: manifest refreshed")


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    wheels = sorted(Path(sys.argv[1]).glob(f"{PACKAGE}-*.whl"))
    if not wheels:
        sys.exit(f"finalise: no {PACKAGE} wheel in {sys.argv[1]}")
    for wheel in wheels:
        finalise(wheel)


if __name__ == "__main__":
    main()
