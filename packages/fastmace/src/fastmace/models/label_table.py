"""The label table: released checkpoints, their heads and aliases (data in label_table.json).

The table is data, not code, so that correcting a hash is a one-line change. A file whose
SHA-256 differs from the table's is refused, so a wrong entry fails safe. A label names a
checkpoint and optionally a head: ``mh-1``, ``mh-1:omat_pbe``, ``mh-1:r2scan`` (a head alias).
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from functools import cache
from importlib import resources


class UnknownLabelError(ValueError):
    """A model label or head that the table does not have."""


@dataclass(frozen=True)
class Head:
    """One output head of a checkpoint and the reference data it was trained on."""

    name: str
    functional: str | None
    training_data: str | None
    aliases: tuple[str, ...] = ()
    d3_functional: str | None = None
    """The D3(BJ) parameter set for ``functional`` (torch-dftd's name), None where dispersion
    does not apply: the reference already contains it, or is not a density functional."""


@dataclass(frozen=True)
class Checkpoint:
    """One released checkpoint file."""

    id: str
    name: str
    file: str
    url: str | None
    sha256: str
    licence: str
    model_type: str
    aliases: tuple[str, ...]
    heads: tuple[Head, ...]
    default_head: str
    packaged: str | None = None
    """For checkpoints shipped inside fastmace: the path below the ``fastmace.models`` package."""

    def head(self, name: str | None) -> Head:
        """The head called ``name`` (or one of its aliases); the default head for None."""
        wanted = self.default_head if name is None else name
        for head in self.heads:
            if wanted == head.name or wanted in head.aliases:
                return head
        names = ", ".join(head.name for head in self.heads)
        raise UnknownLabelError(f"{self.id} has no head {wanted!r}; its heads are: {names}")


@cache
def _table() -> dict:
    text = resources.files(__package__).joinpath("label_table.json").read_text(encoding="utf-8")
    return json.loads(text)


@cache
def checkpoints() -> tuple[Checkpoint, ...]:
    """Every checkpoint of the table, in the table's order."""
    rows = []
    for row in _table()["checkpoints"]:
        heads = tuple(
            Head(
                h["name"],
                h["functional"],
                h["training_data"],
                tuple(h["aliases"]),
                h.get("d3_functional"),
            )
            for h in row["heads"]
        )
        rows.append(
            Checkpoint(
                id=row["id"],
                name=row["name"],
                file=row["file"],
                url=row.get("url"),
                sha256=row["sha256"],
                licence=row["licence"],
                model_type=row["model_type"],
                aliases=tuple(row["aliases"]),
                heads=heads,
                default_head=row["default_head"],
                packaged=row.get("packaged"),
            )
        )
    return tuple(rows)


def licence_name(short: str) -> str:
    """The full name of a licence abbreviation used in the table (``ASL``, ``MIT``)."""
    return _table()["licences"].get(short, short)


def checkpoint_for_file(file_name: str) -> Checkpoint | None:
    """The table's checkpoint released under ``file_name``, or None."""
    for checkpoint in checkpoints():
        if checkpoint.file == file_name:
            return checkpoint
    return None


def find_checkpoint(name: str) -> Checkpoint | None:
    """The checkpoint whose id or alias is ``name`` (case-insensitive), or None."""
    wanted = name.lower()
    for checkpoint in checkpoints():
        if wanted == checkpoint.id or wanted in checkpoint.aliases:
            return checkpoint
    return None


def resolve_label(label: str) -> tuple[Checkpoint, Head]:
    """``"mh-1:omat_pbe"`` -> the checkpoint and head; raises UnknownLabelError with hints."""
    name, _, head = label.partition(":")
    checkpoint = find_checkpoint(name)
    if checkpoint is None:
        known = [c.id for c in checkpoints()] + [a for c in checkpoints() for a in c.aliases]
        close = difflib.get_close_matches(name.lower(), known, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise UnknownLabelError(
            f"unknown model label {name!r}.{hint} `fastmace models list` shows the labels; "
            "a checkpoint file of your own can be given as a path."
        )
    return checkpoint, checkpoint.head(head or None)
