"""Shared helpers: a clean environment for child processes, a cache root of the test's own, a
snapshot of a directory tree, the example structure, rattled copper, run settings and the demo
model."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import ase
import ase.build
import pytest

# The shipped example: 32 atoms of fcc copper (the file users run first).
EXAMPLE = Path(__file__).parents[3] / "examples" / "cu-fcc-32.extxyz"

# Variables of ours (and of the tools we configure) that must not leak from the developer's
# shell into a test's child process.
_SCRUBBED_PREFIXES = ("FASTMACE_", "OEQ_", "TORCHINDUCTOR_", "TRITON_", "CUDA_CACHE_", "CUBLAS_")
_SCRUBBED = {"XDG_CACHE_HOME", "PYTORCH_CUDA_ALLOC_CONF", "MAX_JOBS"}


@pytest.fixture
def clean_env(tmp_path: Path) -> dict[str, str]:
    """An environment for a child process with a fresh HOME and no FastMACE variables."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in _SCRUBBED and not key.startswith(_SCRUBBED_PREFIXES)
    }
    # A directory of the test's own: nothing left in the user's torch-extensions directory
    # by earlier work (a stale lock, say) can change what a child process sees.
    env["TORCH_EXTENSIONS_DIR"] = str(tmp_path / "torch_extensions")
    home = tmp_path / "home"
    home.mkdir()
    env["HOME"] = str(home)
    env["TMPDIR"] = str(tmp_path / "tmp")
    (tmp_path / "tmp").mkdir()
    return env


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache root of the test's own (FASTMACE_CACHE), for this process and its children."""
    monkeypatch.setenv("FASTMACE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def run_python(
    code: str, env: dict[str, str], cwd: Path | None = None, python_options: Sequence[str] = ()
) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter of this environment (with ``python_options``)."""
    return subprocess.run(
        [sys.executable, *python_options, "-c", code],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def run_fastmace(
    args: list[str], env: dict[str, str], cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """Run the ``fastmace`` command line in a child process."""
    return subprocess.run(
        [sys.executable, "-m", "fastmace", *args],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def tree(root: Path) -> set[str]:
    """Every path below ``root``, relative to it."""
    return {str(path.relative_to(root)) for path in root.rglob("*")}


def copper(repeat: tuple[int, int, int] = (2, 1, 1)) -> ase.Atoms:
    """Rattled fcc copper, ``repeat`` cubic cells (the default: 8 atoms)."""
    atoms = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat(repeat)
    atoms.rattle(0.02, seed=3)
    return atoms


def settings(steps: int, **changes):
    """RunSettings of a short Langevin run at 300 K with 2 fs steps; ``changes`` replace any."""
    from fastmace.dynamics.ensembles import ensemble
    from fastmace.io import OutputSchedule
    from fastmace.simulation import RunSettings

    values = dict(
        ensemble=ensemble("nvt", temperature_K=300.0, friction_per_ps=5.0),
        steps=steps,
        timestep_fs=2.0,
        seed=7,
        schedule=OutputSchedule(trajectory_every=5, thermo_every=5, restart_every=10),
        initial_temperature_K=300.0,
    )  # the schedule makes K = 5
    values.update(changes)
    return RunSettings(**values)


@pytest.fixture(scope="module")
def demo():
    """The shipped demo model, loaded once per test module."""
    from fastmace.models.load import load

    return load("demo-emt-cu")
