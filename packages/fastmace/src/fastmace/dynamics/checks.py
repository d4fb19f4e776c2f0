"""Checks of a user's structures before anything runs: each failure says what and what to do."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence

import ase
import ase.units
import numpy as np
from ase.data import chemical_symbols
from ase.neighborlist import neighbor_list

MIN_DISTANCE_A = 0.5  # closer than this, no interatomic potential is meaningful
# Hotter than this, a structure's velocities are a mistake (units, a corrupt file), not physics:
# about 100 times the temperature at which any solid or liquid has long become a plasma.
MAX_INITIAL_TEMPERATURE_K = 1e6


class StructureError(ValueError):
    """A structure FastMACE cannot simulate as given."""


def check_structures(
    structures: Sequence[ase.Atoms],
    model_species: Iterable[int] | None,
    min_distance_A: float = MIN_DISTANCE_A,
) -> None:
    """Raise StructureError for the first problem found in any of ``structures``.

    ``model_species`` None skips the one check that needs the model (its elements): fm.md
    checks the rest before loading it.
    """
    if not structures:
        raise StructureError("no structure given")
    known = None if model_species is None else set(int(z) for z in model_species)
    for index, atoms in enumerate(structures):
        where = f"structure {index}" if len(structures) > 1 else "the structure"
        _check_one(atoms, where, known, min_distance_A)


def _check_one(atoms: ase.Atoms, where: str, known: set[int] | None, min_distance: float) -> None:
    if len(atoms) == 0:
        raise StructureError(f"{where} has no atoms")
    positions = atoms.get_positions()
    if not np.isfinite(positions).all():
        bad = np.flatnonzero(~np.isfinite(positions).all(axis=1))
        raise StructureError(f"{where} has non-finite positions (atoms {bad[:10].tolist()})")
    _check_masses(atoms, where)
    _check_velocities(atoms, where)
    unknown = [] if known is None else sorted(set(atoms.get_atomic_numbers().tolist()) - known)
    if unknown:
        names = ", ".join(chemical_symbols[z] for z in unknown)
        model = ", ".join(chemical_symbols[z] for z in sorted(known or ()))
        raise StructureError(
            f"{where} contains {names}, which the model does not cover; its elements are: "
            f"{model}. Choose a model trained on these elements"
        )
    cell = np.asarray(atoms.get_cell())
    pbc = atoms.get_pbc()
    lengths = np.linalg.norm(cell, axis=1)
    if np.any(pbc & (lengths < 1e-6)):
        axes = "".join("abc"[i] for i in range(3) if pbc[i] and lengths[i] < 1e-6)
        raise StructureError(
            f"{where} is periodic along {axes} but its cell vector there is zero: set the cell "
            "(atoms.cell) or make that direction non-periodic (atoms.pbc)"
        )
    if pbc.all() and abs(np.linalg.det(cell)) < 1e-6:
        raise StructureError(
            f"{where} has a periodic cell of zero volume (cell vectors {cell.tolist()}); the cell "
            "vectors must be linearly independent"
        )
    geometry = _geometry_digest(atoms, min_distance)
    if geometry in _SPACED_APART:  # this geometry passed a moment ago (fm.md, then its run)
        _SPACED_APART.move_to_end(geometry)
        return
    first, second, distance = _close_pairs(atoms, min_distance)
    if not len(distance):
        _SPACED_APART[geometry] = None
        while len(_SPACED_APART) > REMEMBERED_GEOMETRIES:
            _SPACED_APART.popitem(last=False)
        return
    closest = int(np.argmin(distance))
    raise StructureError(
        f"{where} has atoms {int(first[closest])} and {int(second[closest])} only "
        f"{distance[closest]:.3f} Å apart (less than {min_distance} Å): overlapping atoms; "
        "check the structure file, its units (Å) and its cell"
    )


# The close-pair search is the one check whose cost grows with the atoms (1.5 s for 55,296
# atoms on 2 cores), and fm.md's preflight and then its Simulation both ask it of the same
# structures. The digests of the last few geometries found apart are remembered, so the
# second asking is free; a changed position, cell or periodicity is a new digest.
REMEMBERED_GEOMETRIES = 16
_SPACED_APART: OrderedDict[bytes, None] = OrderedDict()


def _geometry_digest(atoms: ase.Atoms, min_distance: float) -> bytes:
    digest = hashlib.sha256(repr(float(min_distance)).encode())
    for array in (atoms.get_positions(), np.asarray(atoms.get_cell()), atoms.get_pbc()):
        contiguous = np.ascontiguousarray(array)
        digest.update(repr((contiguous.dtype.str, contiguous.shape)).encode())
        digest.update(contiguous.tobytes())
    return digest.digest()


# ASE's neighbour list bins the whole cell (bins at least 3 Å wide): a mostly empty cell of
# 1e6 Å asks it for 1e16 bins, and it allocates tens of GB. Past this many bins per atom the
# close pairs are found by comparing every pair instead, in pieces of bounded size.
MOST_ASE_BINS_PER_ATOM = 64
PAIRS_PER_PIECE = 4_000_000


def _close_pairs(atoms: ase.Atoms, cutoff: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pairs of atoms closer than ``cutoff`` (indices and distances), in memory that grows with
    the atoms whatever the cell's size."""
    pbc = atoms.get_pbc()
    if not pbc.all():
        return neighbor_list("ijd", atoms, cutoff)
    cell = np.asarray(atoms.get_cell())
    positions = atoms.get_positions()
    volume = abs(np.linalg.det(cell))
    faces = np.linalg.norm(np.cross(np.roll(cell, -1, axis=0), np.roll(cell, -2, axis=0)), axis=1)
    heights = volume / faces
    ase_bins = np.prod(np.maximum(1.0, np.floor(heights / max(cutoff, 3.0))))
    if ase_bins <= MOST_ASE_BINS_PER_ATOM * len(atoms) + 1000 or heights.min() < 2 * cutoff:
        return neighbor_list("ijd", atoms, cutoff)
    # Every periodic height is at least twice the cutoff, so a pair within it has fractional
    # differences below 1/2 and the rounded (minimum) image is that pair's only close image.
    reciprocal = np.linalg.inv(cell)
    rows = max(1, PAIRS_PER_PIECE // len(atoms))
    found: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for start in range(0, len(atoms), rows):
        delta = positions[None, :, :] - positions[start : start + rows, None, :]
        fractional = delta @ reciprocal
        delta = (fractional - np.round(fractional)) @ cell
        distance = np.linalg.norm(delta, axis=-1)
        first, second = np.nonzero(distance < cutoff)
        keep = first + start != second
        found.append((first[keep] + start, second[keep], distance[first[keep], second[keep]]))
    return tuple(np.concatenate(parts) for parts in zip(*found, strict=True))  # type: ignore[return-value]


def _check_masses(atoms: ase.Atoms, where: str) -> None:
    """Refuse zero, negative and non-finite masses (set by hand, or read from a file)."""
    masses = atoms.get_masses()
    bad = np.flatnonzero(~(np.isfinite(masses) & (masses > 0)))
    if len(bad):
        shown = ", ".join(f"atom {i}: {masses[i]:g}" for i in bad[:5])
        raise StructureError(
            f"{where} has masses that are not positive and finite ({shown}); set them "
            "(atoms.set_masses()) or leave ASE's defaults for the elements"
        )


def _check_velocities(atoms: ase.Atoms, where: str) -> None:
    """Refuse non-finite velocities, and velocities hotter than MAX_INITIAL_TEMPERATURE_K."""
    if not atoms.has("momenta"):
        return
    momenta = atoms.get_momenta()
    finite = np.isfinite(momenta).all(axis=1)
    if not finite.all():
        bad = np.flatnonzero(~finite)
        values = momenta[bad[:3]].tolist()
        raise StructureError(
            f"{where} has non-finite velocities (atoms {bad[:10].tolist()}, momenta "
            f"{values}); set finite velocities, or remove them (atoms.set_momenta(None)) and "
            "draw them with initial_temperature_K"
        )
    masses = atoms.get_masses()
    with np.errstate(over="ignore", invalid="ignore"):
        kinetic_eV = 0.5 * float(np.sum(momenta**2 / masses[:, None]))
        temperature_K = 2.0 * kinetic_eV / (3.0 * len(atoms) * ase.units.kB)
    if not np.isfinite(temperature_K) or temperature_K > MAX_INITIAL_TEMPERATURE_K:
        largest = np.abs(momenta / masses[:, None]).max(axis=1) * ase.units.fs  # Å/fs
        fastest = int(np.argmax(largest))
        speed = largest[fastest]
        raise StructureError(
            f"{where} has velocities of kinetic temperature {temperature_K:.3g} K, above the "
            f"bound of {MAX_INITIAL_TEMPERATURE_K:.0e} K (atom {fastest} has a velocity "
            f"component of {speed:.3g} Å/fs); check the velocities' units (ASE's, not Å/fs), "
            "or remove them (atoms.set_momenta(None)) and draw them with initial_temperature_K"
        )
