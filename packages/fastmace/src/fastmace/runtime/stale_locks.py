"""Lock files left behind by killed extension builds, found without touching them.

A killed ``torch.utils.cpp_extension`` build leaves a ``lock`` file in its build directory,
and OpenEquivariance then waits up to 300 s for it. We list such files when they are older
than an hour and no process has them open; removing them is the user's decision.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

STALE_AFTER_S = 3600.0


@dataclass(frozen=True)
class StaleLock:
    path: Path
    age_s: float


def is_lock_file(name: str) -> bool:
    """torch's FileBaton writes ``lock``; filelock writes ``<name>.lock``."""
    return name == "lock" or name.endswith(".lock")


def open_files_of_all_processes(proc: str = "/proc") -> set[str]:
    """Paths that some process we may inspect has open (both torch's and filelock's locks
    keep their file descriptor open while held). Other users' processes are invisible."""
    held: set[str] = set()
    try:
        pids = [entry for entry in os.listdir(proc) if entry.isdigit()]
    except OSError:
        return held
    for pid in pids:
        fd_dir = os.path.join(proc, pid, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                held.add(os.readlink(os.path.join(fd_dir, fd)))
            except OSError:
                continue
    return held


def find_stale_locks(
    roots: Iterable[Path],
    now: float | None = None,
    stale_after_s: float = STALE_AFTER_S,
    held: set[str] | None = None,
) -> list[StaleLock]:
    """Lock files under ``roots`` older than ``stale_after_s`` that no process holds."""
    now = time.time() if now is None else now
    held = open_files_of_all_processes() if held is None else held
    found = []
    for root in roots:
        if not root.is_dir():
            continue
        for directory, _, files in os.walk(root):
            for name in files:
                if not is_lock_file(name):
                    continue
                path = Path(directory, name)
                try:
                    age = now - path.stat().st_mtime
                except OSError:
                    continue  # removed while we looked: not stale
                if age > stale_after_s and os.path.realpath(path) not in held:
                    found.append(StaleLock(path, age))
    return sorted(found, key=lambda lock: str(lock.path))


def removal_command(locks: Iterable[StaleLock]) -> str:
    """The shell command that removes the given lock files."""
    return "rm -f " + " ".join(shlex.quote(str(lock.path)) for lock in locks)
