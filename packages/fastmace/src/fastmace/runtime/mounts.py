"""Which filesystem a path lies on, read from the kernel's mount table.

We never ``stat`` a path to learn its filesystem: on a broken NFS mount ``stat`` can hang
for minutes, while ``/proc/self/mounts`` is answered by the local kernel.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

MOUNT_TABLE = "/proc/self/mounts"
NFS_TYPES = frozenset({"nfs", "nfs4"})

# The kernel writes space, tab, newline and backslash in mount paths as \ooo octal escapes.
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class Mount:
    """One line of the mount table."""

    source: str
    mount_point: str
    fs_type: str

    @property
    def is_nfs(self) -> bool:
        return self.fs_type in NFS_TYPES


def unescape_mount_field(field: str) -> str:
    """Undo the kernel's octal escaping of one mount-table field (``\\040`` is a space)."""
    return _OCTAL_ESCAPE.sub(lambda match: chr(int(match.group(1), 8)), field)


def parse_mount_table(text: str) -> list[Mount]:
    """Parse the text of ``/proc/self/mounts`` (or ``/etc/mtab``); malformed lines are skipped."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        source, mount_point, fs_type = (unescape_mount_field(f) for f in fields[:3])
        mounts.append(Mount(source, mount_point, fs_type))
    return mounts


def read_mount_table(path: str = MOUNT_TABLE) -> list[Mount]:
    """The mounts of this process, or an empty list where there is no such table (macOS)."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as table:
            return parse_mount_table(table.read())
    except OSError:
        return []


def _lexical_absolute(path: str | os.PathLike[str]) -> str:
    # abspath/normpath work on the string only; realpath would touch the filesystem.
    return os.path.normpath(os.path.abspath(os.path.expanduser(os.fspath(path))))


def _is_under(path: str, mount_point: str) -> bool:
    if mount_point == "/":
        return path.startswith("/")
    return path == mount_point or path.startswith(mount_point.rstrip("/") + "/")


def mount_of(path: str | os.PathLike[str], mounts: list[Mount]) -> Mount | None:
    """The mount holding ``path``: the longest mount point that is a prefix of it.

    Of several mounts on the same point, the last one in the table is the visible one.
    The path need not exist.
    """
    target = _lexical_absolute(path)
    best: Mount | None = None
    for mount in mounts:
        if not _is_under(target, mount.mount_point):
            continue
        if best is None or len(mount.mount_point) >= len(best.mount_point):
            best = mount
    return best


def nfs_mount_of(path: str | os.PathLike[str], mounts: list[Mount] | None = None) -> Mount | None:
    """The NFS mount holding ``path``, or None when it lies on another filesystem."""
    mount = mount_of(path, read_mount_table() if mounts is None else mounts)
    return mount if mount is not None and mount.is_nfs else None
