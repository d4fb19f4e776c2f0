"""Who runs a run directory: ``run.lock``, so that two processes never write one run at once.

The lock file holds the owner's host, process id and process start time. It is created
atomically (:func:`fastmace.runtime.atomic.create_exclusive`: a hard link, atomic on NFS too),
touched while the run goes on (its modification time is the owner's heartbeat, at most every
``HEARTBEAT_EVERY_S``), and removed when the run's output is closed.

A lock whose owner is gone is stale and is taken over, so a killed run never blocks its own
resume. On the owner's host that is certain: no live process has its id and start time (a
zombie counts as gone). A process on another host cannot be seen from here, so its lock is
stale once it has not been touched for ``STALE_AFTER_S``. A live owner's lock is never taken:
:class:`LockHeld` names the owner, for a message that says how to tell whether it still runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from fastmace.runtime.atomic import create_exclusive
from fastmace.runtime.process_clock import process_start_ticks, process_state

LOCK_NAME = "run.lock"
HEARTBEAT_EVERY_S = 30.0
# Another host's lock untouched this long is stale: far above the heartbeat, so a run that is
# busy for minutes between blocks (a compilation, a regrowth) keeps its directory.
STALE_AFTER_S = 15 * 60.0


@dataclass(frozen=True)
class LockOwner:
    """The process that holds a run directory."""

    host: str
    pid: int
    started: int | None
    """The process's start, in clock ticks since boot (/proc); None where unknown."""
    since: float
    """When it took the lock (Unix time)."""

    @classmethod
    def this_process(cls) -> LockOwner:
        pid = os.getpid()
        return cls(socket.gethostname(), pid, process_start_ticks(pid), time.time())

    def to_bytes(self) -> bytes:
        return (json.dumps(asdict(self)) + "\n").encode("utf-8")

    def describe(self) -> str:
        taken = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"process {self.pid} on host {self.host} (since {taken})"


class LockHeld(RuntimeError):
    """The lock belongs to a live process (``owner``; None when its file cannot be read)."""

    def __init__(self, path: Path, owner: LockOwner | None) -> None:
        self.path = path
        self.owner = owner
        who = owner.describe() if owner is not None else "a process whose lock cannot be read"
        super().__init__(f"{path} is held by {who}")


class RunLock:
    """This process's hold on one run directory: :meth:`acquire`, :meth:`keep_alive` while
    running, :meth:`release` at the end."""

    def __init__(self, path: Path, owner: LockOwner) -> None:
        self.path = path
        self.owner = owner
        self._touched = time.monotonic()

    @classmethod
    def acquire(cls, directory: Path) -> RunLock:
        """Take ``directory``'s lock, taking over a stale one; LockHeld if its owner lives."""
        path = Path(directory) / LOCK_NAME
        owner = LockOwner.this_process()
        for _ in range(3):  # a stale lock removed, then another process may win the race
            try:
                create_exclusive(path, owner.to_bytes())
                return cls(path, owner)
            except FileExistsError:
                held = read_owner(path)
                if held is not None and owner_alive(held, path):
                    raise LockHeld(path, held) from None
                _remove_if_unchanged(path, held)
        raise LockHeld(path, read_owner(path))

    def keep_alive(self) -> None:
        """Touch the lock if the last touch is ``HEARTBEAT_EVERY_S`` old: cheap per block."""
        now = time.monotonic()
        if now - self._touched < HEARTBEAT_EVERY_S:
            return
        self._touched = now
        with contextlib.suppress(OSError):  # a lost heartbeat must not stop the run
            os.utime(self.path)

    def release(self) -> None:
        """Remove the lock if it is still ours; harmless when called twice."""
        if read_owner(self.path) == self.owner:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()


def read_owner(path: Path) -> LockOwner | None:
    """The owner written in the lock file ``path``; None if it is absent or unreadable."""
    try:
        fields = json.loads(Path(path).read_text(encoding="utf-8"))
        return LockOwner(
            host=str(fields["host"]),
            pid=int(fields["pid"]),
            started=None if fields.get("started") is None else int(fields["started"]),
            since=float(fields["since"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def owner_alive(owner: LockOwner, path: Path) -> bool:
    """Whether the lock's owner may still be running (see the module's docstring)."""
    if owner.host != socket.gethostname():
        try:
            return time.time() - Path(path).stat().st_mtime < STALE_AFTER_S
        except FileNotFoundError:
            return False
    started = process_start_ticks(owner.pid)
    if started is None:  # no /proc entry: gone, or a system without /proc
        return _signal_reaches(owner.pid) and not Path("/proc").is_dir()
    if process_state(owner.pid) == "Z":  # exited, waiting for its parent to reap it
        return False
    return owner.started is None or started == owner.started


def held_by_live_process(directory: Path) -> LockOwner | None:
    """The live owner of ``directory``'s lock, or None when nobody (alive) holds it."""
    path = Path(directory) / LOCK_NAME
    owner = read_owner(path)
    if owner is not None and owner_alive(owner, path):
        return owner
    return None


def _remove_if_unchanged(path: Path, stale: LockOwner | None) -> None:
    """Remove a stale lock, unless another process replaced it since it was read."""
    if read_owner(path) == stale:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _signal_reaches(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True
