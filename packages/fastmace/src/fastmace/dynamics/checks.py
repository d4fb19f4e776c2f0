"""Checks of a user's structures before anything runs: each failure says what and what to do."""

from __future__ import annotations

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
    first, second, distance = neighbor_list("ijd", atoms, min_distance)
    if len(distance):
        closest = int(np.argmin(distance))
        raise StructureError(
            f"{where} has atoms {int(first[closest])} and {int(second[closest])} only "
            f"{distance[closest]:.3f} Å apart (less than {min_distance} Å): overlapping atoms; "
            "check the structure file, its units (Å) and its cell"
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
