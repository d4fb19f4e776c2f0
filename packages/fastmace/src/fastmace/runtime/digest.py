"""The SHA-256 of a file, read in chunks (checkpoints and libraries reach hundreds of MB)."""

from __future__ import annotations

import hashlib
from pathlib import Path

_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of the file at ``path``; OSError when it cannot be read."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
