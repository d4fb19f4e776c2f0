"""Stale build locks: old, unheld lock files are listed; nothing is deleted."""

from __future__ import annotations

import os
import time

from fastmace.runtime.stale_locks import (
    StaleLock,
    find_stale_locks,
    is_lock_file,
    open_files_of_all_processes,
    removal_command,
)


def _make(path, age_s):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")
    stamp = time.time() - age_s
    os.utime(path, (stamp, stamp))
    return path


def test_lock_file_names():
    assert is_lock_file("lock") and is_lock_file("abc.lock")
    assert not is_lock_file("lockfile") and not is_lock_file("build.ninja")


def test_old_unheld_locks_are_found(tmp_path):
    old = _make(tmp_path / "ext" / "a" / "lock", 7200)
    _make(tmp_path / "ext" / "b" / "lock", 60)
    old_soft = _make(tmp_path / "oeq" / "c.lock", 4000)
    _make(tmp_path / "ext" / "a" / "main.o", 9000)
    found = find_stale_locks([tmp_path / "ext", tmp_path / "oeq", tmp_path / "absent"])
    assert [lock.path for lock in found] == [old, old_soft]
    assert all(lock.age_s > 3600 for lock in found)
    assert old.exists()


def test_a_held_lock_is_not_stale(tmp_path):
    lock = _make(tmp_path / "ext" / "lock", 7200)
    descriptor = os.open(lock, os.O_RDONLY)  # what torch's FileBaton does while it builds
    try:
        assert str(lock) in open_files_of_all_processes()
        assert find_stale_locks([tmp_path / "ext"]) == []
    finally:
        os.close(descriptor)
    assert len(find_stale_locks([tmp_path / "ext"])) == 1


def test_removal_command_quotes_paths(tmp_path):
    locks = [StaleLock(tmp_path / "a b" / "lock", 4000.0), StaleLock(tmp_path / "c.lock", 5000.0)]
    assert removal_command(locks) == f"rm -f '{tmp_path}/a b/lock' {tmp_path}/c.lock"
