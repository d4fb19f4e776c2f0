"""What ``import fastmace`` does to the process: NFS-safe file locks and the CUDA driver cache.

PyTorch locks its extension builds and its Inductor cache with ``filelock.FileLock``, which on
Linux sends kernel lock requests (``flock``); on an NFS home a server can stop answering them.
``filelock.SoftFileLock`` instead creates the lock file atomically and sends no request. PyTorch
binds the class when it is imported, so the switch must happen before ``import torch``.
"""

from __future__ import annotations

import sys
from collections.abc import Container, Mapping, MutableMapping
from dataclasses import dataclass

import filelock

from fastmace.runtime import environment
from fastmace.runtime.mounts import Mount, nfs_mount_of


@dataclass(frozen=True)
class RuntimeInfo:
    """What ``import fastmace`` decided for this process (``fastmace.runtime_info()``)."""

    lock_mode: str
    """``"soft"`` (filelock.SoftFileLock) or ``"kernel"`` (filelock's default, flock)."""
    lock_reason: str
    late_switch: bool
    """True when torch was imported before fastmace, so PyTorch kept kernel locks."""
    cuda_cache: str
    """``"disabled"`` (FastMACE set CUDA_CACHE_DISABLE=1) or ``"left alone"``."""
    cuda_cache_reason: str
    cuda_cache_path: str
    cuda_cache_on_nfs: bool


def _decide_cuda_cache(
    soft_setting: bool | None,
    environ: MutableMapping[str, str] | None,
    mounts: list[Mount] | None,
) -> tuple[str, str, str, bool]:
    try:
        path = environment.cuda_cache_path(environ)
    except environment.EnvironmentVariableError as error:
        # Not raised here: an import error would hide the message (and `fastmace doctor`).
        return "left alone", f"{error} (a run refuses it)", error.value, False
    nfs = nfs_mount_of(path, mounts)
    if soft_setting is False:
        return (
            "left alone",
            "FASTMACE_SOFT_FILE_LOCKS=0 leaves it alone",
            str(path),
            nfs is not None,
        )
    user_value = environment.cuda_cache_disable(environ)
    if user_value is not None:
        reason = f"you set CUDA_CACHE_DISABLE={user_value}"
        return "left alone", reason, str(path), nfs is not None
    if nfs is None:
        return "left alone", f"{path} is not on NFS", str(path), False
    where = f"{path} lies on NFS ({nfs.source} mounted on {nfs.mount_point}, {nfs.fs_type})"
    environment.set_if_unset(environment.CUDA_CACHE_DISABLE.name, "1", where, environ)
    return "disabled", f"set CUDA_CACHE_DISABLE=1: {where}", str(path), True


def apply_at_import(
    environ: MutableMapping[str, str] | None = None,
    loaded_modules: Container[str] | None = None,
    mounts: list[Mount] | None = None,
) -> RuntimeInfo:
    """Switch PyTorch's file locks and the CUDA driver cache as docs/environment.md says.

    A bad value of FASTMACE_SOFT_FILE_LOCKS or CUDA_CACHE_PATH counts as unset here and is
    named in the reasons; runs refuse it and ``fastmace doctor`` reports it
    (:func:`fastmace.runtime.environment.problems`). Raises RuntimeError when soft locks are
    demanded (=1) but torch was imported first. ``mounts`` defaults to /proc/self/mounts.
    """
    loaded = sys.modules if loaded_modules is None else loaded_modules
    try:
        setting, invalid = environment.soft_file_locks(environ), None
    except environment.EnvironmentVariableError as error:
        setting, invalid = None, f"{error} (taken as unset; a run refuses it)"
    torch_first = "torch" in loaded
    late = False
    if setting is False:
        mode, reason = "kernel", "FASTMACE_SOFT_FILE_LOCKS=0"
    elif torch_first and setting is True:
        raise RuntimeError(
            "FASTMACE_SOFT_FILE_LOCKS=1 demands soft file locks, but torch was imported before "
            "fastmace and has already bound kernel locks. Import fastmace first (before torch "
            "and anything that imports it, such as mace), or unset FASTMACE_SOFT_FILE_LOCKS."
        )
    elif torch_first:
        mode, late = "kernel", True
        reason = (
            "torch was imported before fastmace, so PyTorch keeps kernel locks; "
            "import fastmace first to get soft locks"
        )
    else:
        # Rebinding the attribute is the documented purpose of importing fastmace first:
        # modules that later run `from filelock import FileLock` (torch, too) get the soft lock.
        filelock.FileLock = filelock.SoftFileLock  # type: ignore[misc]
        mode = "soft"
        reason = invalid or (
            "FASTMACE_SOFT_FILE_LOCKS=1" if setting else "FASTMACE_SOFT_FILE_LOCKS unset"
        )
    cuda_cache, cuda_reason, cuda_path, cuda_nfs = _decide_cuda_cache(setting, environ, mounts)
    return RuntimeInfo(mode, reason, late, cuda_cache, cuda_reason, cuda_path, cuda_nfs)


def file_lock_problems(
    info: RuntimeInfo, cache_root_on_nfs: bool, environ: Mapping[str, str] | None = None
) -> list[str]:
    """Why this process's locks could hang on NFS; empty when they cannot."""
    problems = []
    if info.lock_mode == "kernel" and cache_root_on_nfs:
        problems.append(f"kernel file locks ({info.lock_reason}) with the cache root on NFS")
    if info.cuda_cache_on_nfs and environment.cuda_cache_disable(environ) != "1":
        problems.append(f"the CUDA driver cache {info.cuda_cache_path} is on NFS and enabled")
    return problems
