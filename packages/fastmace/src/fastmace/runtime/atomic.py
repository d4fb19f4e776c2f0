"""Atomic file replacement: a reader sees the old file or the new one, never half of either.

The new content goes to a hidden temporary file in the same directory (``os.replace`` is atomic
only within one file system), is flushed and fsynced, replaces the target, and then the
directory itself is fsynced so that the rename survives a power loss too.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

# Temporaries are named ".<target>.<16 hex>.tmp": hidden, and never mistaken for the target.
_TEMPORARY = re.compile(r"^\..+\.[0-9a-f]{16}\.tmp$")


def _temporary_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")


def _write_temporary(path: Path, write: Callable[[BinaryIO], None]) -> Path:
    """Write a durable temporary next to ``path``; it is removed again if ``write`` fails."""
    temporary = _temporary_path(path)
    # os.open with 0o666 lets the umask decide permissions, as for any other output file.
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(descriptor, "wb") as stream:
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    return temporary


def atomic_write(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Replace ``path`` with what ``write`` puts into the stream it is given, atomically."""
    path = Path(path)
    temporary = _write_temporary(path, write)
    try:
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    sync_directory(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    """Replace ``path`` with the UTF-8 ``text``, atomically."""
    atomic_write(path, lambda stream: stream.write(text.encode("utf-8")))


def create_exclusive(path: Path, data: bytes) -> None:
    """Create ``path`` with ``data`` complete; FileExistsError when it already exists.

    A hard link is atomic and fails when the target exists, even on NFS, so two processes that
    create the same run directory at once cannot both succeed.
    """
    path = Path(path)
    temporary = _write_temporary(path, lambda stream: stream.write(data))
    try:
        os.link(temporary, path)
    except FileExistsError:
        raise
    except OSError:
        # A file system without hard links: fall back to check-then-replace.
        if path.exists():
            raise FileExistsError(f"{path} already exists") from None
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
    sync_directory(path.parent)


def sync_directory(directory: Path) -> None:
    """fsync a directory so that renames in it are durable; a no-op where that is unsupported."""
    try:
        descriptor = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass  # some file systems (and all of Windows) refuse fsync on a directory
    finally:
        os.close(descriptor)


def is_temporary(name: str) -> bool:
    """Whether ``name`` is one of our temporaries (left behind only by a killed process)."""
    return _TEMPORARY.match(name) is not None


def remove_temporaries(directory: Path) -> list[Path]:
    """Delete temporaries a killed process left in ``directory``; returns what was removed."""
    removed = []
    for entry in Path(directory).iterdir():
        if entry.is_file() and is_temporary(entry.name):
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()
            removed.append(entry)
    return removed
