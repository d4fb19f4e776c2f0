"""The table of released MACE checkpoint files (data in checkpoints.json) and their hashes.

The table is data, not code, so that correcting a hash is a one-line change. A file whose
SHA-256 differs from the table's is refused, so a wrong entry fails safe.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

_HASH_CHUNK = 1 << 20


@dataclass(frozen=True)
class Checkpoint:
    """One released checkpoint file."""

    id: str
    name: str
    file: str
    url: str
    sha256: str
    licence: str
    model_type: str


@cache
def checkpoints() -> tuple[Checkpoint, ...]:
    """Every checkpoint of the table, in the table's order."""
    text = resources.files(__package__).joinpath("checkpoints.json").read_text(encoding="utf-8")
    table = json.loads(text)
    fields = Checkpoint.__dataclass_fields__
    return tuple(
        Checkpoint(**{key: value for key, value in row.items() if key in fields})
        for row in table["checkpoints"]
    )


def checkpoint_for_file(file_name: str) -> Checkpoint | None:
    """The table's checkpoint released under ``file_name``, or None."""
    for checkpoint in checkpoints():
        if checkpoint.file == file_name:
            return checkpoint
    return None


def sha256_of(path: Path) -> str:
    """The SHA-256 of a file, read in chunks (checkpoints reach hundreds of MB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
