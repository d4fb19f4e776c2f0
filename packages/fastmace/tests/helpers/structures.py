"""Structures the potential's tests share, and their edges from ASE's neighbour list (the
reference list: every pair within the cut-off, each direction)."""

from __future__ import annotations

from collections.abc import Sequence

import ase
import numpy as np
import torch
from ase.build import bulk, molecule
from ase.neighborlist import neighbor_list

from fastmace.dynamics.edges import Edges
from fastmace.dynamics.state import State


def ase_edges(state: State, cutoff: float, capacity_factor: float = 1.0) -> Edges:
    """Edges of every system from ASE's neighbour list, padded to ``capacity_factor`` x count.

    Padding slots are self-edges of atom 0 with zero shift: zero-length vectors, the worst a
    neighbour list could leave there.
    """
    senders, receivers, shifts = [], [], []
    offset = 0
    for atoms in state.to_atoms():
        i, j, unit_shifts = neighbor_list("ijS", atoms, cutoff)
        senders.append(i + offset)
        receivers.append(j + offset)
        shifts.append(unit_shifts)
        offset += len(atoms)
    count = sum(len(s) for s in senders)
    capacity = max(round(capacity_factor * count), 1)
    edge_index = torch.zeros((2, capacity), dtype=torch.int64)
    edge_index[0, :count] = torch.as_tensor(np.concatenate(senders))
    edge_index[1, :count] = torch.as_tensor(np.concatenate(receivers))
    unit_shifts = torch.zeros((capacity, 3), dtype=torch.float64)
    unit_shifts[:count] = torch.as_tensor(np.concatenate(shifts), dtype=torch.float64)
    mask = torch.zeros(capacity, dtype=torch.bool)
    mask[:count] = True
    # Built on the host from ASE's list, the edges live where the state does.
    parts = (edge_index, unit_shifts, mask, torch.tensor(count), torch.tensor(False))
    return Edges(*(part.to(state.positions.device) for part in parts))


def random_structure(numbers: Sequence[int], cell: np.ndarray, seed: int, min_distance: float):
    """Atoms at random positions in a periodic ``cell``, at least ``min_distance`` apart."""
    rng = np.random.default_rng(seed)
    atoms = ase.Atoms(cell=cell, pbc=True)
    while len(atoms) < len(numbers):
        trial = atoms + ase.Atom(numbers[len(atoms)], rng.uniform(0, 1, 3) @ np.asarray(cell))
        if len(trial) == 1 or trial.get_distances(-1, range(len(atoms)), mic=True).min() > (
            min_distance
        ):
            atoms = trial
    return atoms


def copper_supercell(repeat: tuple[int, int, int] = (2, 2, 2)) -> ase.Atoms:
    atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat(repeat)
    atoms.rattle(stdev=0.05, seed=1)
    return atoms


def triclinic_mixed() -> ase.Atoms:
    cell = np.array([[6.1, 0.0, 0.0], [2.2, 5.7, 0.0], [-1.4, 1.9, 5.9]])
    return random_structure([29, 29, 29, 8, 8, 6, 1, 1, 29, 8], cell, seed=3, min_distance=1.6)


def small_cell() -> ase.Atoms:
    """Two atoms in a skewed cell of 2.7-3.1 Å: every cut-off reaches many images."""
    cell = np.array([[2.9, 0.0, 0.0], [0.8, 2.7, 0.0], [0.5, -0.6, 3.0]])
    return ase.Atoms("CuO", scaled_positions=[[0, 0, 0], [0.45, 0.55, 0.5]], cell=cell, pbc=True)


def cluster() -> ase.Atoms:
    """Ethanol and a copper atom, without a cell."""
    atoms = molecule("CH3CH2OH")
    oxygen = atoms.positions[atoms.get_chemical_symbols().index("O")]
    atoms += ase.Atom("Cu", oxygen + np.array([0.0, 0.0, 2.0]))
    atoms.rattle(stdev=0.03, seed=2)
    return atoms


STRUCTURES = {
    "fcc-cu": copper_supercell,
    "triclinic": triclinic_mixed,
    "small-cell": small_cell,
    "cluster": cluster,
}


def edges_on(edges: Edges, device: torch.device | str) -> Edges:
    return Edges(*(v.to(device) if torch.is_tensor(v) else v for v in vars(edges).values()))
