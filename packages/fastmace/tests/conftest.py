"""Shared helpers: a clean environment for child processes, a cache root of the test's own and
a snapshot of a directory tree."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

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
