"""Finding a checkpoint file, proving it is the file it claims to be, and downloading it.

Lookup order for a label (docs/models.md): ``checkpoint=`` path, the package's own files (the
demo model), ``$FASTMACE_MODELS/<file>`` (an empty file there is skipped),
``<cache root>/models/<file>``, and only with ``download=True`` the official URL. Downloads
stream into a ``.part`` file, are hashed while streaming and are renamed into place only when
the SHA-256 matches. A file is read once: the bytes that were hashed are the bytes that are
unpickled (:func:`verify`), so a file swapped after the check is never loaded. Nothing here
deletes a file the user put somewhere.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import TextIO

from fastmace.models.label_table import Checkpoint, checkpoint_for_file
from fastmace.runtime import environment
from fastmace.runtime.cache import cache_dir, locate_cache_root
from fastmace.runtime.digest import sha256_file

_CHUNK = 1 << 20


class ModelFileError(RuntimeError):
    """A checkpoint file that cannot be found, read or trusted."""


class ChecksumMismatchError(ModelFileError):
    """A file's SHA-256 differs from the one it must have."""


@dataclass(frozen=True)
class ModelFile:
    """A checkpoint file ready to load, and why it may be loaded."""

    path: Path
    source: str
    sha256: str
    verified: bool
    """True when ``sha256`` matched the expected hash; False when the user vouched (trusted)."""
    content: bytes = field(default=b"", repr=False, compare=False)
    """The file's bytes as read and hashed: what is unpickled (empty once loaded)."""

    def without_content(self) -> ModelFile:
        """The record alone, to keep after loading without holding the file in memory."""
        return replace(self, content=b"")


def check_trust_options(sha256: object, trusted: object) -> None:
    """ValueError/TypeError unless ``sha256`` is None or 64 hex digits and ``trusted`` a bool."""
    if sha256 is not None and not (
        isinstance(sha256, str)
        and len(sha256) == 64
        and all(c in "0123456789abcdefABCDEF" for c in sha256)
    ):
        raise ValueError(
            f"sha256={sha256!r} is not a SHA-256: give the file's 64 hex digits "
            "(`sha256sum FILE` prints them)"
        )
    if not isinstance(trusted, bool):
        raise TypeError(f"trusted={trusted!r} must be True or False")


def sha256_of(path: Path) -> str:
    """The SHA-256 of a checkpoint file; ModelFileError when it cannot be read."""
    try:
        return sha256_file(path)
    except OSError as error:
        raise ModelFileError(f"cannot read the checkpoint file {path}: {error}") from error


def read_checkpoint_bytes(path: Path) -> bytes:
    """The whole file, read once; ModelFileError when it cannot be read."""
    try:
        return path.read_bytes()
    except OSError as error:
        raise ModelFileError(f"cannot read the checkpoint file {path}: {error}") from error


def unvouched_file_error(path: Path) -> ModelFileError:
    """The refusal of a file with neither a known SHA-256 nor the user's trust."""
    return ModelFileError(
        f"{path} has no known SHA-256, and loading a pickled checkpoint runs code from it: "
        "pass sha256='<its hash>' to check it, or trusted=True if you trust the file"
    )


def verify(path: Path, expected: str | None, source: str, trusted: bool = False) -> ModelFile:
    """Read ``path`` once and accept its bytes if their hash matches ``expected``, or if the
    user trusts the file. The returned record carries those bytes: load them, not the path."""
    if not path.is_file():
        raise ModelFileError(f"the checkpoint {path} ({source}) is not a readable file")
    content = read_checkpoint_bytes(path)
    actual = hashlib.sha256(content).hexdigest()
    if expected is not None and actual == expected.lower():
        return ModelFile(path, source, actual, verified=True, content=content)
    if trusted:
        return ModelFile(path, source, actual, verified=False, content=content)
    if expected is None:
        raise unvouched_file_error(path)
    raise ChecksumMismatchError(
        f"{path} ({source}) has SHA-256 {actual}, but {expected.lower()} was expected; the file "
        "is not the one it claims to be (damaged, partial, or another model). Nothing was deleted: "
        "replace it, or fetch it again with fm.load(label, download=True)"
    )


def _packaged_path(relative: str) -> Path:
    return Path(str(resources.files("fastmace.models").joinpath(relative)))


def _search_places(
    checkpoint: Checkpoint, environ: Mapping[str, str] | None
) -> list[tuple[str, Path | None]]:
    places: list[tuple[str, Path | None]] = []
    if checkpoint.packaged:
        places.append(("shipped with fastmace", _packaged_path(checkpoint.packaged)))
    models = environment.models_directory(environ)
    places.append(("FASTMACE_MODELS", models / checkpoint.file if models else None))
    root = locate_cache_root(environ=environ).path
    places.append(("the cache", root / "models" / checkpoint.file))
    return places


def find_label_file(
    checkpoint: Checkpoint,
    explicit: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[str, Path]:
    """Where a label's file is, as (source, path), in the documented order, without reading it.

    ModelFileError names the places searched and how to get the file; nothing is downloaded.
    """
    if explicit is not None:
        return "checkpoint=", Path(explicit)
    searched = []
    for source, path in _search_places(checkpoint, environ):
        if path is None:
            searched.append(f"{source} (unset)")
            continue
        searched.append(str(path))
        if path.is_file() and path.stat().st_size > 0:
            return source, path
    how = (
        f"fetch it once with fm.load({checkpoint.id!r}, download=True) or "
        f"`fastmace models fetch {checkpoint.id}`, or give checkpoint=PATH"
        if checkpoint.url
        else "reinstall fastmace"
    )
    raise ModelFileError(
        f"the file of {checkpoint.id} ({checkpoint.file}) was not found in: "
        f"{', '.join(searched)}; {how}"
    )


def locate_label_file(
    checkpoint: Checkpoint,
    explicit: Path | None = None,
    download: bool = False,
    trusted: bool = False,
    environ: Mapping[str, str] | None = None,
    progress: TextIO | None = None,
) -> ModelFile:
    """The verified file of a label-table checkpoint, found in the documented order."""
    if explicit is not None:
        return verify(Path(explicit), checkpoint.sha256, "checkpoint=", trusted)
    try:
        source, path = find_label_file(checkpoint, environ=environ)
    except ModelFileError:
        if not (download and checkpoint.url):
            raise
    else:
        return verify(path, checkpoint.sha256, source)
    target = cache_dir("models", environ=environ) / checkpoint.file
    download_file(checkpoint.url, target, checkpoint.sha256, progress=progress)
    return verify(target, checkpoint.sha256, "downloaded")


def locate_url(
    url: str,
    sha256: str | None,
    trusted: bool,
    environ: Mapping[str, str] | None = None,
    progress: TextIO | None = None,
) -> ModelFile:
    """A checkpoint given by URL: reused from the cache when its hash is known, else downloaded."""
    if sha256 is None and not trusted:
        raise ModelFileError(
            f"a model URL needs sha256='<the file's SHA-256>' (or trusted=True): {url}"
        )
    name = url.rstrip("/").rsplit("/", 1)[-1] or "model"
    target = locate_cache_root(environ=environ).path / "models" / name
    if sha256 is not None and target.is_file():
        try:
            return verify(target, sha256, "the cache")
        except ChecksumMismatchError:
            pass  # another file of that name: download the right one
    target = cache_dir("models", environ=environ) / name
    download_file(url, target, sha256, progress=progress)
    return verify(target, sha256, "downloaded", trusted=sha256 is None)


def _report(progress: TextIO | None, text: str) -> None:
    if progress is not None:
        progress.write(f"\r{text}")
        progress.flush()


def download_file(
    url: str, target: Path, sha256: str | None, progress: TextIO | None = None
) -> str:
    """Stream ``url`` into ``target`` through a ``.part`` file; returns the SHA-256.

    The file appears at ``target`` only complete and (when ``sha256`` is given) verified; on
    any failure, interruption included, the ``.part`` file is removed.
    """
    if progress is None and sys.stderr.isatty():
        progress = sys.stderr
    part = target.with_name(f"{target.name}.{uuid.uuid4().hex[:8]}.part")
    digest = hashlib.sha256()
    received = 0
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(part, "wb") as out:
            length = response.headers.get("Content-Length")
            expected_size = int(length) if length and length.isdigit() else None
            last_report = 0.0
            while chunk := response.read(_CHUNK):
                out.write(chunk)
                digest.update(chunk)
                received += len(chunk)
                if time.monotonic() - last_report > 0.5:
                    total = f"/{expected_size / 1e6:.1f}" if expected_size else ""
                    _report(progress, f"downloading {target.name}: {received / 1e6:.1f}{total} MB")
                    last_report = time.monotonic()
            if expected_size is not None and received != expected_size:
                raise ModelFileError(
                    f"the download of {url} ended early: {received} of {expected_size} bytes"
                )
            out.flush()
            os.fsync(out.fileno())
        actual = digest.hexdigest()
        if sha256 is not None and actual != sha256.lower():
            raise ChecksumMismatchError(
                f"the download of {url} has SHA-256 {actual}, but {sha256.lower()} was expected; "
                "it was discarded"
            )
        os.replace(part, target)
        _report(progress, f"downloaded {target.name}: {received / 1e6:.1f} MB\n")
        return actual
    except (urllib.error.URLError, OSError) as error:
        raise ModelFileError(f"cannot download {url}: {error}") from error
    finally:
        part.unlink(missing_ok=True)


@dataclass(frozen=True)
class FileStatus:
    """One file found in a model directory, and what we know of it."""

    path: Path
    checkpoint_id: str | None
    state: str
    """``verified``, ``mismatch``, ``unchecked`` (no hashing), ``empty`` or ``unknown``."""


def model_directories(environ: Mapping[str, str] | None = None) -> list[Path]:
    """The directories searched for checkpoint files: $FASTMACE_MODELS, <cache root>/models."""
    directories = [environment.models_directory(environ)]
    directories.append(locate_cache_root(environ=environ).path / "models")
    return [directory for directory in directories if directory is not None]


def scan_model_files(
    environ: Mapping[str, str] | None = None, hash_files: bool = True
) -> list[FileStatus]:
    """Every file in the model directories, checked against the label table. Changes nothing."""
    found = []
    for directory in model_directories(environ):
        if not directory.exists():
            continue
        for path in sorted(directory.iterdir()):
            if not path.is_file() or path.name.endswith(".part"):
                continue
            checkpoint = checkpoint_for_file(path.name)
            if checkpoint is None:
                state = "unknown"
            elif path.stat().st_size == 0:
                state = "empty"
            elif not hash_files:
                state = "unchecked"
            else:
                state = "verified" if sha256_of(path) == checkpoint.sha256 else "mismatch"
            found.append(FileStatus(path, checkpoint.id if checkpoint else None, state))
    return found
