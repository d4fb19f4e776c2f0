"""The import-time decisions, with injected environments and mount tables."""

from __future__ import annotations

import filelock
import pytest

from fastmace.runtime import environment
from fastmace.runtime.mounts import parse_mount_table
from fastmace.runtime.startup import apply_at_import, file_lock_problems

NFS_HOME = parse_mount_table(
    "overlay / overlay rw 0 0\nserver:/home /home nfs4 rw 0 0\n/dev/sda1 /local ext4 rw 0 0\n"
)
LOCAL_HOME = parse_mount_table("overlay / overlay rw 0 0\nserver:/proj /proj nfs rw 0 0\n")


@pytest.fixture(autouse=True)
def keep_filelock_class():
    # apply_at_import rebinds filelock.FileLock; the test process already has the soft lock.
    original = filelock.FileLock
    yield
    filelock.FileLock = original


def test_cuda_cache_on_nfs_home_is_disabled():
    env = {"HOME": "/home/alice"}
    info = apply_at_import(env, loaded_modules=set(), mounts=NFS_HOME)
    assert env["CUDA_CACHE_DISABLE"] == "1"
    assert info.cuda_cache == "disabled"
    assert info.cuda_cache_on_nfs is True
    assert "/home/alice/.nv/ComputeCache lies on NFS" in info.cuda_cache_reason
    assert "server:/home" in info.cuda_cache_reason


def test_cuda_cache_path_on_nfs_with_local_home():
    env = {"HOME": "/local/alice", "CUDA_CACHE_PATH": "/proj/cuda cache"}
    info = apply_at_import(env, loaded_modules=set(), mounts=LOCAL_HOME)
    assert env["CUDA_CACHE_DISABLE"] == "1"
    assert info.cuda_cache_path == "/proj/cuda cache"


def test_cuda_cache_path_local_with_nfs_home_is_left_alone():
    env = {"HOME": "/home/alice", "CUDA_CACHE_PATH": "/local/cuda"}
    info = apply_at_import(env, loaded_modules=set(), mounts=NFS_HOME)
    assert "CUDA_CACHE_DISABLE" not in env
    assert info.cuda_cache == "left alone"
    assert "not on NFS" in info.cuda_cache_reason


@pytest.mark.parametrize("value", ["0", "1"])
def test_users_cuda_cache_setting_is_kept(value):
    env = {"HOME": "/home/alice", "CUDA_CACHE_DISABLE": value}
    info = apply_at_import(env, loaded_modules=set(), mounts=NFS_HOME)
    assert env["CUDA_CACHE_DISABLE"] == value
    assert info.cuda_cache == "left alone"
    assert f"you set CUDA_CACHE_DISABLE={value}" in info.cuda_cache_reason


def test_kernel_locks_on_request_leave_nfs_cuda_cache_enabled():
    env = {"HOME": "/home/alice", "FASTMACE_SOFT_FILE_LOCKS": "0"}
    info = apply_at_import(env, loaded_modules=set(), mounts=NFS_HOME)
    assert "CUDA_CACHE_DISABLE" not in env
    assert info.lock_mode == "kernel"
    assert info.cuda_cache_on_nfs is True


def test_late_import_still_disables_nfs_cuda_cache():
    env = {"HOME": "/home/alice"}
    sentinel = filelock.FileLock
    info = apply_at_import(env, loaded_modules={"torch"}, mounts=NFS_HOME)
    assert info.late_switch is True and info.lock_mode == "kernel"
    assert filelock.FileLock is sentinel
    assert env["CUDA_CACHE_DISABLE"] == "1"


def test_switch_rebinds_filelock():
    filelock.FileLock = filelock.UnixFileLock
    info = apply_at_import({"HOME": "/local/a"}, loaded_modules=set(), mounts=LOCAL_HOME)
    assert filelock.FileLock is filelock.SoftFileLock
    assert info.lock_mode == "soft"


def test_file_lock_problems():
    kernel = apply_at_import(
        {"HOME": "/home/a", "FASTMACE_SOFT_FILE_LOCKS": "0"}, loaded_modules=set(), mounts=NFS_HOME
    )
    problems = file_lock_problems(kernel, cache_root_on_nfs=True, environ={})
    assert len(problems) == 2
    assert "kernel file locks" in problems[0]
    assert "CUDA driver cache" in problems[1]
    assert file_lock_problems(kernel, False, {"CUDA_CACHE_DISABLE": "1"}) == []
    soft_env = {"HOME": "/home/a"}
    soft = apply_at_import(soft_env, loaded_modules=set(), mounts=NFS_HOME)
    assert file_lock_problems(soft, cache_root_on_nfs=True, environ=soft_env) == []


def test_changes_are_recorded():
    env = {"HOME": "/home/alice"}
    apply_at_import(env, loaded_modules=set(), mounts=NFS_HOME)
    last = environment.changes()[-1]
    assert (last.name, last.before, last.after) == ("CUDA_CACHE_DISABLE", None, "1")
