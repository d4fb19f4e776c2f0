"""The user's structures: a file ASE reads, an ``ase.Atoms`` or a list of them, as a list.

ASE's own errors name neither the file nor a fix (an unknown extension is reported as the bare
extension, binary bytes as a UTF-8 decode error, an empty frame surfaces much later as a NumPy
error), so every failure of reading a file is turned into a :class:`StructureFileError` that
says which file, what is wrong with it and what to do.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import ase
import ase.io
import numpy as np
from ase.data import chemical_symbols
from ase.formula import Formula
from ase.io.formats import UnknownFileTypeError

Structure = ase.Atoms | Sequence[ase.Atoms] | str | os.PathLike[str]

_FORMATS_HINT = (
    "give a file in a format ASE reads, named with that format's usual extension (.extxyz, "
    ".xyz, .cif, .vasp or POSCAR, .traj, ...; `ase info --formats` lists them)"
)


def chemical_formula(atoms: ase.Atoms) -> str:
    """``atoms.get_chemical_formula()`` (Hill order) from the counts of each element: ASE
    writes out and parses one symbol per atom, 0.26 s for a million atoms."""
    numbers, counts = np.unique(atoms.get_atomic_numbers(), return_counts=True)
    elements = {chemical_symbols[z]: int(n) for z, n in zip(numbers, counts, strict=True)}
    return Formula.from_dict(elements).format("hill")


class StructureFileError(ValueError):
    """A structure file that cannot be read, or that holds no atoms."""


def read_structure_file(path: Path, index: str | int = -1) -> list[ase.Atoms]:
    """The frames ``index`` of the file ``path`` (the last by default), each with atoms."""
    if not path.is_file():
        raise FileNotFoundError(f"no structure file {path}")
    try:
        read = ase.io.read(path, index=index)
    except UnknownFileTypeError as error:
        if str(error).startswith("Empty file"):
            raise StructureFileError(
                f"the structure file {path} is empty; {_FORMATS_HINT}"
            ) from None
        raise StructureFileError(
            f"cannot read the structure file {path}: ASE does not know the format of "
            f"{_kind(path)}; {_FORMATS_HINT}"
        ) from None
    except UnicodeDecodeError as error:
        raise StructureFileError(
            f"cannot read the structure file {path}: ASE reads {_kind(path)} as text, but the file "
            f"holds bytes that are not text (at byte {error.start}). Is it the structure file, "
            f"or a binary file with the wrong name? {_FORMATS_HINT[0].upper()}{_FORMATS_HINT[1:]}"
        ) from None
    except OSError as error:
        raise StructureFileError(
            f"cannot read the structure file {path}: {error.strerror or error}"
        ) from None
    except Exception as error:  # a parser's own failure: a damaged file or the wrong format
        said = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        raise StructureFileError(
            f"cannot read the structure file {path} (ASE's reader of {_kind(path)} failed: "
            f"{said}); the file is damaged or not in the format its name says. Check it, or "
            "convert it with `ase convert`"
        ) from None
    frames = read if isinstance(read, list) else [read]
    if not frames:
        raise StructureFileError(f"the structure file {path} holds no frame at index {index!r}")
    for number, atoms in enumerate(frames):
        if len(atoms) == 0:
            which = "its last frame" if index == -1 else f"frame {number} of those read"
            raise StructureFileError(
                f"the structure file {path} holds no atoms ({which} is empty); check the file, "
                "or give another frame"
            )
    return frames


def read_structures(
    structure: Structure, repeat: Sequence[int] | int | None = None, index: str | int = -1
) -> list[ase.Atoms]:
    """``structure`` as a list of ASE structures, each repeated ``repeat`` times if given.

    A path is read with ``ase.io.read`` (any format ASE reads; ``index`` picks frames, the
    last one by default); a list may mix structures and paths. ``repeat`` builds a supercell
    explicitly: FastMACE never enlarges a cell on its own. The caller's objects are copied,
    never modified.
    """
    if isinstance(structure, str | os.PathLike):
        structures = read_structure_file(Path(structure).expanduser(), index)
    elif isinstance(structure, ase.Atoms):
        structures = [structure]
    else:
        given = list(structure) if isinstance(structure, Iterable) else [structure]
        structures = []
        for item in given:
            if isinstance(item, str | os.PathLike):
                structures += read_structure_file(Path(item).expanduser(), index)
            elif isinstance(item, ase.Atoms):
                structures.append(item)
            else:
                raise TypeError(
                    "structure must be ase.Atoms, a file path, or a list of either; got "
                    f"{type(structure).__name__} {structure!r:.60}"
                )
    structures = [atoms.copy() for atoms in structures]
    for number, atoms in enumerate(structures):
        _refuse_partial_sites(atoms, structure if len(structures) == 1 else f"structure {number}")
    if repeat is not None:
        counts = (repeat,) * 3 if isinstance(repeat, int) else tuple(repeat)
        if (
            len(counts) != 3
            or any(isinstance(n, bool) or not isinstance(n, numbers.Integral) for n in counts)
            or any(n < 1 for n in counts)
        ):
            raise ValueError(f"repeat must be three positive integers, got {repeat!r}")
        structures = [atoms.repeat(counts) for atoms in structures]
    return structures


class DisorderedStructureError(ValueError):
    """A structure with sites of fractional occupancy (ASE keeps one element per site)."""


def _refuse_partial_sites(atoms: ase.Atoms, source: object) -> None:
    """Refuse a structure read from a file with partly occupied or shared sites: ASE keeps
    one element per site, at full weight, and says nothing (``atoms.info["occupancy"]``)."""
    occupancy = atoms.info.get("occupancy")
    if not isinstance(occupancy, dict):
        return
    partial = []
    for site, shares in occupancy.items():
        if not isinstance(shares, dict):
            continue
        if len(shares) > 1 or any(float(share) < 1 - 1e-6 for share in shares.values()):
            shown = ", ".join(f"{element} {float(share):g}" for element, share in shares.items())
            partial.append(f"site {site}: {shown}")
    if partial:
        where = (
            f"the structure file {source}"
            if isinstance(source, str | os.PathLike)
            else ("the structure" if isinstance(source, ase.Atoms) else str(source))
        )
        listed = "; ".join(partial[:5]) + (
            f"; and {len(partial) - 5} more" if len(partial) > 5 else ""
        )
        raise DisorderedStructureError(
            f"{where} has sites of fractional occupancy ({listed}): ASE reads one element per "
            "site, at full weight, so the run would not be of this material. Make an ordered "
            "cell first (one element per site, for instance a supercell with the occupancies "
            "as fractions of its sites, such as a special quasirandom structure) and run that"
        )


def _kind(path: Path) -> str:
    return f"'{path.suffix}' files" if path.suffix else f"files named {path.name!r}"
