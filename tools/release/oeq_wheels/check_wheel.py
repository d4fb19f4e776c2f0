"""Check a built fastmace-oeq-ext wheel against the environment it was built in.

Run with the build environment's Python (and the same FASTMACE_OEQ_TORCH_TREES). Checks: the
package's files, one library per torch built against; the manifest's fields against the build
(OpenEquivariance, pybind11, CPython, and per library its torch with the +cuXXX tag, CUDA and
C++ ABI) and against each library (SHA-256, highest GLIBC/GLIBCXX versions, platform tag);
readelf's RUNPATH and NEEDED for each (torch and CUDA libraries, the driver, no libpython); the
declared dependencies (the torch range of the libraries) and licence; and ``auditwheel
show``'s policy. Reports the sizes. Prints a report; exits 1 on any failure.

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
from pathlib import Path

PACKAGE = "fastmace_oeq_ext"
LIBRARY = "libtorch_tp_jit.so"
COMMON_FILES = {"__init__.py", "manifest.json", "LICENSE.openequivariance", "BUILD_COMPILER.txt"}
# The libraries sit in fastmace_oeq_ext/torch-X.Y/: site-packages is two levels up.
RUNPATH = "$ORIGIN/../../torch/lib:$ORIGIN/../../nvidia/cu13/lib"
REQUIRED_NEEDED = {
    "libc10.so", "libtorch.so", "libtorch_cpu.so", "libtorch_python.so",
    "libcudart.so.13", "libnvrtc.so.13", "libcublas.so.13", "libcuda.so.1",
}  # fmt: skip
TORCH_FACTS = ("torch", "torch_minor", "cuda", "cxx11_abi")


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


def build_facts() -> dict:
    """What the manifest must say: the build's own description of this environment."""
    from build_inputs import describe

    return describe()


def check_library(library: Path, entry: dict, torch: dict | None, report: Report) -> None:
    """One manifest entry against the torch it names and the library file."""
    from write_manifest import highest_symbol_versions

    name = entry.get("library")
    if torch is None:
        report.check(False, f"{name}: built against no torch of this build ({entry})")
        return
    for key in TORCH_FACTS:
        report.check(entry.get(key) == torch[key], f"{name}: {key} = {entry.get(key)}")
    actual = hashlib.sha256(library.read_bytes()).hexdigest()
    report.check(entry.get("sha256") == actual, f"{name}: sha256 = library's ({actual[:16]}...)")
    versions = highest_symbol_versions(library)
    report.check(
        entry.get("glibc_max") == versions["GLIBC"]
        and entry.get("glibcxx_max") == versions["GLIBCXX"],
        f"{name}: highest symbol versions GLIBC_{versions['GLIBC']}, GLIBCXX_{versions['GLIBCXX']}",
    )
    needed, runpath, rpath = dynamic_section(library)
    report.check(
        runpath == [RUNPATH] and not rpath, f"{name}: RUNPATH {runpath}, RPATH {rpath or 'none'}"
    )
    missing = REQUIRED_NEEDED - set(needed)
    report.check(not missing, f"{name}: NEEDED {' '.join(needed)}")
    libpython = [n for n in needed if n.startswith("libpython")]
    report.check(not libpython, f"{name}: no libpython among NEEDED ({libpython or 'none'})")
    report.note(f"{name}: {library.stat().st_size / 2**20:.1f} MiB")


def torch_range(torches: list[dict]) -> str:
    low, high = torches[0]["torch_minor"], torches[-1]["torch_minor"]
    major, minor = high.split(".")
    return f"torch>={low},<{major}.{int(minor) + 1}"


def normalised(requirements: list[str]) -> list[str]:
    """Requirements in one spelling (name, then specifiers in packaging's order)."""
    from packaging.requirements import Requirement

    return sorted(str(Requirement(requirement)) for requirement in requirements)


def check(wheel: Path, report: Report) -> None:
    sys.path.insert(0, str(BUILD_SUPPORT))  # build_inputs and write_manifest
    facts = build_facts()
    torches = {torch["torch_minor"]: torch for torch in facts["torches"]}

    with zipfile.ZipFile(wheel) as archive, tempfile.TemporaryDirectory() as scratch:
        names = archive.namelist()
        manifest = json.loads(archive.read(f"{PACKAGE}/manifest.json"))
        entries = manifest.get("libraries", [])
        package_files = {
            n.split("/", 1)[1] for n in names if n.startswith(f"{PACKAGE}/") and not n.endswith("/")
        }
        expected = COMMON_FILES | {entry.get("library") for entry in entries}
        report.check(package_files == expected, f"package files: {sorted(package_files)}")
        built = sorted(entry.get("torch_minor") for entry in entries)
        report.check(built == sorted(torches), f"one library per torch built against: {built}")
        stray = [n for n in names if not n.startswith((f"{PACKAGE}/", "fastmace_oeq_ext-"))]
        report.check(not stray, f"nothing outside the package and dist-info: {stray or 'none'}")
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = email.message_from_bytes(archive.read(meta_name))

        report.check(manifest.get("manifest_version") == 2, "manifest_version = 2")
        for key in ("openequivariance", "pybind11", "python_tag"):
            report.check(manifest.get(key) == facts[key], f"manifest {key} = {manifest.get(key)}")
        report.check(
            bool(manifest.get("compiler")), f"manifest compiler = {manifest.get('compiler')}"
        )
        tag = wheel.name.removesuffix(".whl").split("-")[-1]
        report.check(manifest.get("platform_tag") == tag, f"manifest platform_tag = {tag}")
        for entry in entries:
            if f"{PACKAGE}/{entry.get('library')}" not in names:
                report.check(False, f"{entry.get('library')} is in the wheel")
                continue
            library = Path(archive.extract(f"{PACKAGE}/{entry['library']}", scratch))
            check_library(library, entry, torches.get(entry.get("torch_minor")), report)

        requires = normalised(meta.get_all("Requires-Dist") or [])
        wanted = normalised(["openequivariance==0.7.0", torch_range(facts["torches"])])
        report.check(requires == wanted, f"Requires-Dist: {requires}")
        licence = meta.get("License-Expression")
        report.check(licence == "MIT AND BSD-3-Clause", f"License-Expression: {licence}")
    report.note(f"wheel size: {wheel.stat().st_size / 2**20:.1f} MiB")
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
