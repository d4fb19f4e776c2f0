"""Check a built fastmace-oeq-ext wheel against the environment it was built in.

Run with the build environment's Python. Checks: the package's files; the manifest's fields
against this environment (torch with its +cuXXX tag, CUDA, OpenEquivariance, pybind11,
CPython) and against the library (SHA-256, highest GLIBC/GLIBCXX versions, platform tag);
readelf's RUNPATH and NEEDED (torch and CUDA libraries, the driver, no libpython); the declared
dependencies and licence; and ``auditwheel show``'s policy. Prints a report; exits 1 on any
failure.

    python check_wheel.py WHEEL [--report FILE]
"""

from __future__ import annotations

import argparse
import email
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

PACKAGE = "fastmace_oeq_ext"
LIBRARY = "libtorch_tp_jit.so"
EXPECTED_FILES = {
    "__init__.py", LIBRARY, "manifest.json", "LICENSE.openequivariance", "BUILD_COMPILER.txt",
}  # fmt: skip
RUNPATH = "$ORIGIN/../torch/lib:$ORIGIN/../nvidia/cu13/lib"
REQUIRED_NEEDED = {
    "libc10.so", "libtorch.so", "libtorch_cpu.so", "libtorch_python.so",
    "libcudart.so.13", "libnvrtc.so.13", "libcublas.so.13", "libcuda.so.1",
}  # fmt: skip


class Report:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.failures = 0

    def check(self, ok: bool, what: str) -> None:
        self.lines.append(f"[{'ok' if ok else 'FAIL'}] {what}")
        self.failures += not ok

    def note(self, what: str) -> None:
        self.lines.append(f"       {what}")


def dynamic_section(library: Path) -> tuple[list[str], list[str], list[str]]:
    """NEEDED, RUNPATH and RPATH entries from ``readelf -d``."""
    listing = subprocess.run(
        ["readelf", "-d", "--wide", str(library)], capture_output=True, text=True, check=True
    ).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", listing)
    runpath = re.findall(r"\(RUNPATH\)\s+Library runpath: \[(.+?)\]", listing)
    rpath = re.findall(r"\(RPATH\)\s+Library rpath: \[(.+?)\]", listing)
    return needed, runpath, rpath


BUILD_SUPPORT = (
    Path(__file__).resolve().parents[3] / "packages" / "fastmace-oeq-ext" / "build_support"
)
MANIFEST_FACTS = ("torch", "cuda", "openequivariance", "pybind11", "python_tag")


def environment_facts() -> dict[str, str]:
    """What the manifest must say about this environment: the build's own description."""
    from build_inputs import describe

    facts = describe()
    return {key: facts[key] for key in MANIFEST_FACTS}


def check(wheel: Path, report: Report) -> None:
    sys.path.insert(0, str(BUILD_SUPPORT))  # build_inputs and write_manifest
    from write_manifest import highest_symbol_versions

    with zipfile.ZipFile(wheel) as archive, tempfile.TemporaryDirectory() as scratch:
        names = archive.namelist()
        package_files = {
            n.split("/", 1)[1] for n in names if n.startswith(f"{PACKAGE}/") and not n.endswith("/")
        }
        report.check(package_files == EXPECTED_FILES, f"package files: {sorted(package_files)}")
        stray = [n for n in names if not n.startswith((f"{PACKAGE}/", "fastmace_oeq_ext-"))]
        report.check(not stray, f"nothing outside the package and dist-info: {stray or 'none'}")
        library = Path(archive.extract(f"{PACKAGE}/{LIBRARY}", scratch))
        manifest = json.loads(archive.read(f"{PACKAGE}/manifest.json"))
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = email.message_from_bytes(archive.read(meta_name))

        for key, value in environment_facts().items():
            report.check(manifest.get(key) == value, f"manifest {key} = {manifest.get(key)}")
        report.check(
            bool(manifest.get("compiler")), f"manifest compiler = {manifest.get('compiler')}"
        )
        actual = hashlib.sha256(library.read_bytes()).hexdigest()
        report.check(
            manifest.get("sha256") == actual, f"manifest sha256 = library's ({actual[:16]}...)"
        )
        versions = highest_symbol_versions(library)
        report.check(
            manifest.get("glibc_max") == versions["GLIBC"]
            and manifest.get("glibcxx_max") == versions["GLIBCXX"],
            f"highest symbol versions: GLIBC_{versions['GLIBC']}, GLIBCXX_{versions['GLIBCXX']}",
        )
        tag = wheel.name.removesuffix(".whl").split("-")[-1]
        report.check(manifest.get("platform_tag") == tag, f"manifest platform_tag = {tag}")

        needed, runpath, rpath = dynamic_section(library)
        report.check(
            runpath == [RUNPATH] and not rpath, f"RUNPATH {runpath}, RPATH {rpath or 'none'}"
        )
        missing = REQUIRED_NEEDED - set(needed)
        report.check(not missing, f"NEEDED: {' '.join(needed)}")
        libpython = [n for n in needed if n.startswith("libpython")]
        report.check(not libpython, f"no libpython among NEEDED ({libpython or 'none'})")

        requires = sorted(meta.get_all("Requires-Dist") or [])
        torch_release = metadata.version("torch").split("+")[0]
        wanted = sorted(["openequivariance==0.7.0", f"torch=={torch_release}"])
        report.check(requires == wanted, f"Requires-Dist: {requires}")
        licence = meta.get("License-Expression")
        report.check(licence == "MIT AND BSD-3-Clause", f"License-Expression: {licence}")

    shown = subprocess.run(
        [sys.executable, "-m", "auditwheel", "show", str(wheel)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    # auditwheel judges the wheel with torch's libraries counted as external, so its first
    # verdict is plain linux; the symbol versions constrain the manylinux policy it meets.
    constrained = re.search(r'constrains the platform tag to\s*"([^"]+)"', shown.stdout)
    consistent = re.search(r'consistent with the following platform tag:\s*"([^"]+)"', shown.stdout)
    policy = constrained or consistent
    report.check(shown.returncode == 0 and policy is not None, "auditwheel show ran")
    report.note(f"manylinux policy met (symbol versions): {policy.group(1) if policy else '?'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("wheel", type=Path)
    parser.add_argument("--report", type=Path, help="also write the report here")
    args = parser.parse_args()
    report = Report()
    check(args.wheel, report)
    text = f"check_wheel: {args.wheel.name}\n" + "\n".join(report.lines) + "\n"
    print(text, end="")
    if args.report:
        args.report.write_text(text, encoding="utf-8")
    sys.exit(1 if report.failures else 0)


if __name__ == "__main__":
    main()
