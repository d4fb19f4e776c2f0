"""The structure the gate checks: the user's own, or a smaller part of it when it is large.

The gate compares the plan's model with mace-torch's float64 e3nn model on the *same* input,
so any structure with the user's elements and local environments is a fair test; a large one
only makes the float64 reference slow. In order of preference:

1. the whole structure, up to ``max_atoms`` atoms;
2. the cell it was repeated from (``fm.md(repeat=...)``), when that is known and small enough;
3. a periodic sub-cell, when the structure repeats one exactly (a supercell read from a file):
   the largest such sub-cell within ``max_atoms``, still periodic, so stress is compared too;
4. otherwise (a disordered or thermalised structure) the ``max_atoms`` atoms nearest the one
   closest to the cell's centre, as a cluster without a cell; stress is then not compared,
   since a cluster has none.

:func:`reduced_structure` returns the structure and one line saying which it is, for the
gate's result (report and metadata.json).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import ase
import numpy as np
from ase.geometry import find_mic
from scipy.spatial import cKDTree

MAX_GATE_ATOMS = 4096
# Two atoms are the same site of a repeated cell when they lie this close (Å) after the shift.
SYMMETRY_TOLERANCE_A = 1e-4


@dataclass(frozen=True)
class GateStructure:
    """The structure the gate checks, and how it relates to the run's structure."""

    atoms: ase.Atoms
    description: str


def reduced_structure(
    atoms: ase.Atoms, unit: ase.Atoms | None = None, max_atoms: int | None = None
) -> GateStructure:
    """``atoms``, or the best smaller structure for the gate (see the module's docstring).

    ``unit`` is the cell ``atoms`` was repeated from, if known; ``max_atoms`` defaults to
    MAX_GATE_ATOMS.
    """
    max_atoms = MAX_GATE_ATOMS if max_atoms is None else max_atoms
    if len(atoms) <= max_atoms:
        return GateStructure(atoms, f"the run's structure ({len(atoms)} atoms)")
    if unit is not None and len(unit) <= max_atoms and len(unit) < len(atoms):
        return GateStructure(unit, f"the cell before repeat ({len(unit)} atoms)")
    if atoms.pbc.all():
        sub = _periodic_sub_cell(atoms, max_atoms)
        if sub is not None:
            part, counts = sub
            times = "x".join(map(str, counts))
            return GateStructure(
                part, f"a periodic sub-cell ({len(part)} atoms) that the structure repeats {times}"
            )
    cluster, centre = _cluster(atoms, max_atoms)
    return GateStructure(
        cluster,
        f"a cluster of the {len(cluster)} atoms nearest atom {centre} (the structure has "
        f"{len(atoms)} and no exact repeat); stress not compared",
    )


def _fractional(atoms: ase.Atoms) -> np.ndarray:
    """Fractional coordinates wrapped into [0, 1) (``% 1.0`` twice: -1e-17 % 1.0 is 1.0)."""
    return atoms.get_scaled_positions(wrap=False) % 1.0 % 1.0


def _repeats_along(
    atoms: ase.Atoms, fractional: np.ndarray, tree: cKDTree, axis: int, times: int
) -> bool:
    """Does shifting every atom by ``cell[axis] / times`` map the structure onto itself?"""
    shifted = fractional.copy()
    shifted[:, axis] = (shifted[:, axis] + 1.0 / times) % 1.0 % 1.0
    # Fractional tolerance: the Å tolerance over the shortest cell length, a safe bound.
    tolerance = SYMMETRY_TOLERANCE_A / float(np.min(atoms.cell.lengths()))
    distance, index = tree.query(shifted, distance_upper_bound=tolerance)
    if not np.all(np.isfinite(distance)):
        return False
    numbers = atoms.numbers
    return bool(np.array_equal(numbers[index], numbers))


def _largest_repeats(atoms: ase.Atoms, fractional: np.ndarray) -> tuple[int, int, int]:
    """Along each lattice vector, the most times the structure repeats a slice of itself."""
    n = len(atoms)
    tree = cKDTree(fractional, boxsize=1.0)
    counts = []
    for axis in range(3):
        found = 1
        for times in sorted((d for d in range(2, n + 1) if n % d == 0), reverse=True):
            if _repeats_along(atoms, fractional, tree, axis, times):
                found = times
                break
        counts.append(found)
    return counts[0], counts[1], counts[2]


def _periodic_sub_cell(
    atoms: ase.Atoms, max_atoms: int
) -> tuple[ase.Atoms, tuple[int, int, int]] | None:
    """The largest sub-cell within ``max_atoms`` that the structure repeats, or None."""
    fractional = _fractional(atoms)
    repeats = _largest_repeats(atoms, fractional)
    best = None
    for counts in itertools.product(*(_divisors(r) for r in repeats)):
        pieces = counts[0] * counts[1] * counts[2]
        if pieces == 1 or len(atoms) % pieces or len(atoms) // pieces > max_atoms:
            continue
        if best is None or pieces < best[0] * best[1] * best[2]:
            best = counts
    if best is None:
        return None
    # The first copy, with a little slack below each boundary so rounding cannot lose an atom.
    inside = np.all(fractional * np.array(best) < 1.0 - 1e-9, axis=1)
    part = atoms[inside]
    if len(part) * best[0] * best[1] * best[2] != len(atoms):
        return None
    part.set_cell(atoms.cell.array / np.array(best)[:, None], scale_atoms=False)
    part.set_pbc(True)
    return part, best


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _cluster(atoms: ase.Atoms, max_atoms: int) -> tuple[ase.Atoms, int]:
    """The ``max_atoms`` atoms nearest the atom closest to the cell's centre, without a cell."""
    positions = atoms.positions
    periodic_cell = atoms.cell.rank == 3
    middle = atoms.cell.array.sum(axis=0) / 2 if periodic_cell else positions.mean(axis=0)
    centre = int(np.argmin(np.linalg.norm(positions - middle, axis=1)))
    vectors = positions - positions[centre]
    if atoms.pbc.any():
        vectors, _ = find_mic(vectors, atoms.cell, atoms.pbc)
    order = np.argsort(np.linalg.norm(vectors, axis=1), kind="stable")[:max_atoms]
    cluster = ase.Atoms(
        numbers=atoms.numbers[order],
        positions=positions[centre] + vectors[order],
        masses=atoms.get_masses()[order],
        pbc=False,
    )
    return cluster, centre
