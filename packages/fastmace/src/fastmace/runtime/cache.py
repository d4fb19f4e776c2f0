"""The cache root and its layout: where generated code and checked downloads are kept.

Nothing is created until it is needed: :func:`cache_root` only computes a path, and
:func:`cache_dir` creates one sub-directory when a caller is about to write into it.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePath, PurePosixPath, PureWindowsPath

from fastmace.runtime import environment

APP_NAME = "fastmace"

# The cache's sub-directories; see docs/environment.md for what each holds.
# "compile" holds cuEquivariance's descriptors and what each compilation cost (compile_costs).
KINDS = frozenset({"triton", "inductor", "oeq", "models", "handoff", "compile"})
# Where potentials compiled ahead of time are kept (dynamics/aot_potential.py), under the root.
AHEAD_OF_TIME_PACKAGES = ("compile", "aot")


class CacheLocationError(RuntimeError):
    """The cache root lies where FastMACE must not write (inside the Python environment)."""


class CacheUnusableError(OSError):
    """A directory of the cache root cannot be created (a file in the way, no permission)."""


@dataclass(frozen=True)
class CacheRoot:
    """The cache root and how it was chosen."""

    path: Path
    source: str


def user_cache_directory(
    platform: str | None = None, environ: Mapping[str, str] | None = None
) -> PurePath:
    """The platform's per-user cache directory for FastMACE.

    Linux and other Unix: ``$XDG_CACHE_HOME/fastmace`` or ``~/.cache/fastmace``;
    macOS: ``~/Library/Caches/fastmace``; Windows: ``%LOCALAPPDATA%\\fastmace\\Cache``.
    ``platform`` takes ``sys.platform``'s values and defaults to this one.
    """
    platform = sys.platform if platform is None else platform
    env = os.environ if environ is None else environ
    if platform == "win32":
        local = env.get("LOCALAPPDATA") or str(
            PureWindowsPath(env.get("USERPROFILE") or "C:\\") / "AppData" / "Local"
        )
        return PureWindowsPath(local) / APP_NAME / "Cache"
    if platform == "darwin":
        return PurePosixPath(environment.home(env)) / "Library" / "Caches" / APP_NAME
    return PurePosixPath(environment.xdg_cache_home(env)) / APP_NAME


def locate_cache_root(
    platform: str | None = None, environ: Mapping[str, str] | None = None
) -> CacheRoot:
    """Where the cache root is, without checking or creating it."""
    override = environment.cache_override(environ)
    if override is not None:
        return CacheRoot(Path(os.path.normpath(override)), "FASTMACE_CACHE")
    directory = user_cache_directory(platform, environ)
    return CacheRoot(Path(str(directory)), "the user cache directory")


def is_inside(path: str | os.PathLike[str], parent: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is ``parent`` or lies below it, after resolving symbolic links."""
    child = os.path.realpath(path)
    base = os.path.realpath(parent)
    return child == base or child.startswith(base.rstrip(os.sep) + os.sep)


def check_cache_root(root: CacheRoot, prefix: str | None = None) -> None:
    """Raise CacheLocationError if the root lies inside the Python environment."""
    prefix = sys.prefix if prefix is None else prefix
    if is_inside(root.path, prefix):
        raise CacheLocationError(
            f"the cache root {root.path} (from {root.source}) lies inside the Python environment "
            f"{prefix}, which may be read-only, shared or rebuilt; set FASTMACE_CACHE to a "
            "directory outside it, e.g. export FASTMACE_CACHE=~/.cache/fastmace"
        )


def cache_root(environ: Mapping[str, str] | None = None) -> CacheRoot:
    """The checked cache root (not created). Raises CacheLocationError inside sys.prefix."""
    root = locate_cache_root(environ=environ)
    check_cache_root(root)
    return root


def cache_dir(kind: str, *parts: str, environ: Mapping[str, str] | None = None) -> Path:
    """``<cache root>/<kind>/<parts...>``, created now because the caller is about to use it."""
    if kind not in KINDS:
        raise ValueError(f"unknown cache kind {kind!r}; the kinds are {sorted(KINDS)}")
    root = cache_root(environ)
    directory = root.path.joinpath(kind, *parts)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        fix = (
            "set FASTMACE_CACHE to a writable directory"
            if root.source == "FASTMACE_CACHE"
            else "set FASTMACE_CACHE to a writable directory, or make this one writable"
        )
        raise CacheUnusableError(
            f"the cache root {root.path} (from {root.source}) cannot be used: creating "
            f"{directory} failed ({error.strerror or error}); {fix} (fastmace doctor checks it)",
        ) from error
    return directory


def scratch_dir(prefix: str, environ: Mapping[str, str] | None = None) -> Path:
    """A new private directory ``<cache root>/<prefix>XXXX``; the caller removes it."""
    root = cache_root(environ).path
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=root))


def handoff_dir(environ: Mapping[str, str] | None = None) -> Path:
    """A new private directory ``<cache root>/handoff/run-<date>-<time>-XXXX`` for one run in a
    child process (:mod:`fastmace.runner`); the caller removes it."""
    prefix = time.strftime("run-%Y%m%d-%H%M%S-")
    return Path(tempfile.mkdtemp(prefix=prefix, dir=cache_dir("handoff", environ=environ)))
