"""Cache files that hold code, loaded only when this user wrote them.

Two kinds of cache entry run code when read: pickles (cuEquivariance's descriptors) and
compiled potentials (shared libraries, dynamics/aot_potential.py). The cache root may be shared
(``FASTMACE_CACHE`` on a group file system), so another user could plant or replace such a
file. The threat model (docs/environment.md): whoever can write the cache root must not be able
to run code in this user's runs.

The design: when this process writes such an entry, it records the file's SHA-256 in a
directory only this user can write (``$XDG_STATE_HOME/fastmace/vouched``, by default
``~/.local/state/fastmace/vouched``, mode 0700, checked to be this user's and not writable by
others before every use). A reader loads an entry only when its bytes have the recorded digest;
otherwise the entry counts as absent and is rebuilt (the rebuild is vouched for anew). The
records are JSON; nothing in this directory is ever executed.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from fastmace.runtime.atomic import atomic_write_text

FORMAT = 1


class PrivateStoreError(OSError):
    """The directory of digests cannot be made private to this user (the message says why)."""


def store_directory(environ: Mapping[str, str] | None = None) -> Path:
    """Where this user's digests live (not created)."""
    environ = os.environ if environ is None else environ
    state = environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "fastmace" / "vouched"


def _private_store(environ: Mapping[str, str] | None) -> Path:
    """The store, created 0700 if missing; PrivateStoreError when others could write it."""
    directory = store_directory(environ)
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        info = directory.stat()
    except OSError as error:
        raise PrivateStoreError(f"{directory}: {error.strerror or error}") from error
    if info.st_uid != os.getuid():
        raise PrivateStoreError(f"{directory} belongs to another user (uid {info.st_uid})")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PrivateStoreError(f"{directory} can be written by others (mode {info.st_mode:o})")
    return directory


def _record_path(entry: Path, environ: Mapping[str, str] | None) -> Path:
    # One record per entry path: two cache roots never share records.
    name = hashlib.sha256(str(entry.resolve()).encode()).hexdigest()[:40]
    return _private_store(environ) / f"{name}.json"


def vouch(entry: Path, data: bytes, environ: Mapping[str, str] | None = None) -> bool:
    """Record that ``entry`` holds ``data``, the bytes this process just wrote there (their
    digest, not the file's: a file swapped since the write is not vouched for). False when no
    private store can be had: the entry then is never loaded, only rebuilt."""
    try:
        digest = hashlib.sha256(data).hexdigest()
        record = {"format": FORMAT, "path": str(entry.resolve()), "sha256": digest}
        atomic_write_text(_record_path(entry, environ), json.dumps(record))
    except OSError:
        return False
    return True


def read_vouched(entry: Path, environ: Mapping[str, str] | None = None) -> bytes | None:
    """The bytes of ``entry`` when they are the ones this user recorded, else None.

    Reads the file once and checks those bytes, so a file swapped between the check and the
    use cannot slip through (for entries read into memory, such as pickles).
    """
    try:
        data = entry.read_bytes()
        record = json.loads(_record_path(entry, environ).read_text())
    except (OSError, ValueError):
        return None
    if not (
        isinstance(record, dict)
        and record.get("format") == FORMAT
        and record.get("path") == str(entry.resolve())
        and record.get("sha256") == hashlib.sha256(data).hexdigest()
    ):
        return None
    return data


def is_vouched(entry: Path, environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``entry`` holds the very bytes this user recorded for it."""
    return read_vouched(entry, environ) is not None
