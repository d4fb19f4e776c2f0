"""Every routine task of the repository: ``nox -s tests``, ``nox -s lint``, ``nox -s demo``,
``nox -s native_wheel``, and ``nox -s ci``, what CI runs.

Our two distributions (fastmace, fastmace-oeq-ext) are always installed from this checkout:
the package index serves an unrelated project under the same names.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).parent
CORE = ROOT / "packages" / "fastmace"
# The torch that CI and the development machines use (a CUDA 13 build; it also runs on the CPU).
TORCH = "torch==2.14.1"
# The GPU test machine's torch: the native wheel holds a library for it too, and CI proves it.
TORCH_GPU_MACHINE = "torch==2.11.0"
OEQ = "openequivariance==0.7.0"
# Which torches native_wheel's clean install runs with (space-separated; default both above).
CLEAN_INSTALL_TORCHES = "CLEAN_INSTALL_TORCHES"

nox.options.sessions = ["lint", "tests", "native_wheel", "docs"]
nox.options.default_venv_backend = "venv"


def _torch_dir(session: nox.Session) -> str:
    # find_spec locates torch without importing it (an import would print warnings here).
    code = "import os, importlib.util as u; print(os.path.dirname(u.find_spec('torch').origin))"
    return session.run("python", "-c", code, silent=True).strip()


def install_core(session: nox.Session, extras: str = "") -> None:
    """torch, OpenEquivariance (built offline against that torch) and fastmace from CORE."""
    session.install(TORCH)
    # OEq's sdist would download libtorch; point its CMake at the torch just installed instead.
    session.install(
        OEQ,
        "-C", f"cmake.define.FETCHCONTENT_SOURCE_DIR_LIBTORCH={_torch_dir(session)}",
        "-C", "cmake.define.CMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON",
    )  # fmt: skip
    session.install("-e", f"{CORE}{extras}")
    check = (
        "import pathlib, fastmace; "
        f"assert pathlib.Path(fastmace.__file__).resolve().is_relative_to({str(CORE)!r}), "
        "f'fastmace came from {fastmace.__file__}, not this checkout'"
    )
    session.run("python", "-c", check)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (lint and formatting) and the import layering (import-linter's contracts in
    pyproject.toml; the package is found on PYTHONPATH, not imported)."""
    session.install("ruff==0.17.6", "import-linter==2.17")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("lint-imports", "--no-cache", env={"PYTHONPATH": "packages/fastmace/src"})


@nox.session
def tests(session: nox.Session) -> None:
    """Lint, then the CPU test suite (GPU tests are marked `gpu` and deselected here)."""
    install_core(session, "[dev]")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("lint-imports", "--no-cache")
    # pytest exits 5 when it collects nothing; nox treats that as a failure, as it should.
    # One worker per core, each file on one worker (module fixtures load once), one thread
    # each: 16.5 min on 2 cores against 27 one after another (2026-12-03). The files go out
    # slowest first, in conftest.py's order (SLOWEST_FIRST), not xdist's (most tests first).
    # --durations: CI's log names the slowest tests, where its 30 minutes go.
    session.run(
        "pytest", "-m", "not gpu", "-n", "auto", "--dist", "loadfile", "--no-loadscope-reorder",
        "--durations=25", *session.posargs, env={"OMP_NUM_THREADS": "1"},
    )  # fmt: skip


@nox.session(venv_backend="none")
def ci(session: nox.Session) -> None:
    """What CI runs (README's test command): ``tests`` and, beside it in a second nox process,
    ``native_wheel`` (its clean install with the GPU machine's torch only), ``docs`` and
    ``wheelhouse`` (whose offline install is checked as a clean install with TORCH) one after
    the other.

    The test suite keeps both cores busy most of the time; the release chain is mostly
    installs and copies of wheels from local disk, which one after the other left a core idle
    for a third of CI's 30 minutes (user time 41 min of 61 core-minutes, 88b0018). The chain's
    output goes to a log, printed once the suite is done; either failing fails the session.
    """
    log_path = Path(session.create_tmp()) / "release-chain.log"
    chain = [sys.executable, "-m", "nox", "-s", "native_wheel", "docs", "wheelhouse"]
    session.log(f"{' '.join(chain[2:])} beside the tests, into {log_path}")
    # The wheelhouse's offline install passes the same checks with TORCH as a clean install
    # does (check_install.sh): native_wheel's clean install is left to the other torch.
    environment = {**os.environ, CLEAN_INSTALL_TORCHES: TORCH_GPU_MACHINE}
    with log_path.open("w") as log:
        release = subprocess.Popen(
            chain, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=environment
        )
    try:
        session.run(sys.executable, "-m", "nox", "-s", "tests", "--", *session.posargs)
    finally:
        code = release.wait()
        print(log_path.read_text(), flush=True)
    if code != 0:
        session.error(f"the release chain failed (exit {code}): its output is above")


@nox.session
def docs(session: nox.Session) -> None:
    """The documentation site (mkdocs.yml, API reference from the docstrings), built with
    warnings as errors into a scratch directory; `mkdocs serve` shows it while writing."""
    session.install(
        "mkdocs==1.6.1", "mkdocstrings==1.0.8", "mkdocstrings-python==2.0.11", "griffelib==2.4.1"
    )
    site = Path(session.create_tmp()) / "site"
    session.run("mkdocs", "build", "--strict", "--site-dir", str(site))


@nox.session(venv_backend="none")
def wheelhouse(session: nox.Session) -> None:
    """Every wheel an offline `pip install --no-index --find-links DIR "fastmace[oeq]"` needs,
    into dist/wheelhouse (or the directory given after --), proven by that install."""
    out = session.posargs[0] if session.posargs else str(ROOT / "dist" / "wheelhouse")
    session.run("bash", str(ROOT / "tools/release/wheelhouse.sh"), out, env=_fresh_native_wheel())


def _fresh_native_wheel() -> dict[str, str]:
    """OEQ_EXT_WHEEL for wheelhouse.sh when native_wheel's wheel is newer than every source it
    is built from (CI runs native_wheel first: the wheel is built and checked once per run)."""
    wheels = sorted((ROOT / "dist" / "oeq-wheels").glob("fastmace_oeq_ext-*.whl"))
    sources = [
        path
        for folder in ("packages/fastmace-oeq-ext", "tools/release/oeq_wheels")
        for path in (ROOT / folder).rglob("*")
        if path.is_file()
    ]
    if len(wheels) != 1 or not sources:
        return {}
    newest_source = max(path.stat().st_mtime for path in sources)
    return {"OEQ_EXT_WHEEL": str(wheels[0])} if wheels[0].stat().st_mtime > newest_source else {}


@nox.session
def demo(session: nox.Session) -> None:
    """The main job: MD of fcc copper with the shipped demo model (on the CPU without a GPU).

    examples/demo.toml: NVT at 300 K (CSVR), 1000 steps of 2 fs, started so that it sits at
    300 K from the first 0.1 ps (the file says how; tests/test_demo.py checks it). The run
    directory lands in runs/ (trajectory, thermo log and its plot thermo.png, restart, report).
    Then fastmace doctor says what this machine can do beyond that.
    """
    install_core(session, "[plot]")
    runs = ROOT / "runs"
    runs.mkdir(exist_ok=True)
    session.chdir(runs)  # the config names no output: md-cu-fcc-32-<date>-<time> lands here
    session.run("fastmace", "run", str(ROOT / "examples" / "demo.toml"))
    # A CPU-only machine passes doctor (what only a GPU uses is a warning there); a GPU machine
    # lacks cuEquivariance's CUDA kernels, which the demo does not install, and doctor exits 1
    # and names the wheel. Either way its report is information here.
    session.run("fastmace", "doctor", "--no-hash", success_codes=[0, 1])


@nox.session(venv_backend="none")
def native_wheel(session: nox.Session) -> None:
    """Build fastmace-oeq-ext locally (cp311; one library for torch 2.14 and one for 2.11), check
    it, then the clean install once with each of those torches installed (the torches named
    in the environment variable CLEAN_INSTALL_TORCHES, when set: ``ci`` leaves TORCH's to the
    wheelhouse, whose offline install passes the same checks).

    Both scripts make their own venvs; the wheel lands in dist/oeq-wheels.
    """
    out = ROOT / "dist" / "oeq-wheels"
    for stale in out.glob("*.whl"):
        stale.unlink()
    session.run(
        "bash", str(ROOT / "tools/release/oeq_wheels/build.sh"), "--local", str(out),
        env={"EXTRA_TORCH": TORCH_GPU_MACHINE},
    )  # fmt: skip
    for torch in os.environ.get(CLEAN_INSTALL_TORCHES, f"{TORCH} {TORCH_GPU_MACHINE}").split():
        session.run(
            "bash", str(ROOT / "tools/release/clean_install.sh"), str(out),
            env={"CLEAN_INSTALL_TORCH": torch},
        )  # fmt: skip
