"""The batched MD state: device tensors for one or several independent systems.

Every per-atom tensor has one row per atom of all systems together; ``system`` says which
system each atom belongs to, and per-system tensors have one row per system. One structure is
the batch of one: there is no separate single-system code path. Beside it: what a potential
returns for a State (:class:`ForceResult`) and the potential's signature (``ComputeFn``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import ase
import numpy as np
import torch

POSITION_DTYPE = torch.float64  # positions, velocities, masses and cells are kept in float64


@dataclass
class State:
    """Positions (Å), velocities (Å/fs), masses (amu), cells (Å) of a batch of systems.

    Attributes:
        positions: (N, 3) float64 Cartesian positions.
        velocities: (N, 3) float64 velocities in Å/fs.
        masses: (N,) float64 atomic masses in amu.
        atomic_numbers: (N,) int64.
        cell: (S, 3, 3) float64, rows are the lattice vectors (ASE's convention).
        pbc: (S, 3) bool periodicity per system and direction.
        system: (N,) int64 system index of each atom, non-decreasing.
    """

    positions: torch.Tensor
    velocities: torch.Tensor
    masses: torch.Tensor
    atomic_numbers: torch.Tensor
    cell: torch.Tensor
    pbc: torch.Tensor
    system: torch.Tensor

    @property
    def n_atoms(self) -> int:
        # The size itself, not int() of it: traced ahead of time (dynamics/aot_potential.py)
        # it stays symbolic, so one compiled potential serves every number of atoms.
        return self.positions.shape[0]

    @property
    def n_systems(self) -> int:
        return self.cell.shape[0]

    @property
    def device(self) -> torch.device:
        return self.positions.device

    def atoms_per_system(self) -> torch.Tensor:
        """(S,) int64 number of atoms in each system."""
        return torch.bincount(self.system, minlength=self.n_systems)

    def clone(self) -> State:
        return replace(self, **{name: getattr(self, name).clone() for name in _FIELDS})

    def to(self, device: torch.device | str) -> State:
        return replace(self, **{name: getattr(self, name).to(device) for name in _FIELDS})

    @classmethod
    def from_atoms(
        cls, structures: ase.Atoms | Sequence[ase.Atoms], device: torch.device | str = "cpu"
    ) -> State:
        """A state from one ASE structure or a list of them; velocities from their momenta.

        ASE stores velocities in its own time unit; they are converted to Å/fs here.
        """
        if isinstance(structures, ase.Atoms):
            structures = [structures]
        if not structures:
            raise ValueError("State.from_atoms needs at least one structure")
        fs = ase.units.fs
        positions = np.concatenate([a.get_positions() for a in structures])
        velocities = np.concatenate([a.get_velocities() * fs for a in structures])
        masses = np.concatenate([a.get_masses() for a in structures])
        numbers = np.concatenate([a.get_atomic_numbers() for a in structures])
        cell = np.stack([np.asarray(a.get_cell()) for a in structures])
        pbc = np.stack([np.asarray(a.get_pbc(), dtype=bool) for a in structures])
        system = np.repeat(np.arange(len(structures)), [len(a) for a in structures])

        def as_float(array: np.ndarray) -> torch.Tensor:
            return torch.as_tensor(array, dtype=POSITION_DTYPE, device=device).contiguous()

        return cls(
            positions=as_float(positions),
            velocities=as_float(velocities),
            masses=as_float(masses),
            atomic_numbers=torch.as_tensor(numbers, dtype=torch.int64, device=device),
            cell=as_float(cell),
            pbc=torch.as_tensor(pbc, dtype=torch.bool, device=device),
            system=torch.as_tensor(system, dtype=torch.int64, device=device),
        )

    def to_atoms(self) -> list[ase.Atoms]:
        """One ASE structure per system, with positions, cell, pbc and velocities (ASE units)."""
        host = self.to("cpu")
        counts = host.atoms_per_system().tolist()
        starts = np.concatenate([[0], np.cumsum(counts)])
        structures = []
        for index in range(self.n_systems):
            rows = slice(int(starts[index]), int(starts[index + 1]))
            atoms = ase.Atoms(
                numbers=host.atomic_numbers[rows].numpy(),
                positions=host.positions[rows].numpy(),
                cell=host.cell[index].numpy(),
                pbc=host.pbc[index].numpy(),
                masses=host.masses[rows].numpy(),
            )
            atoms.set_velocities(host.velocities[rows].numpy() / ase.units.fs)
            structures.append(atoms)
        return structures


_FIELDS = ("positions", "velocities", "masses", "atomic_numbers", "cell", "pbc", "system")


@dataclass
class ForceResult:
    """What a potential returns for a State.

    Attributes:
        energy: (S,) float64 potential energy of each system in eV.
        forces: (N, 3) float64 forces in eV/Å, minus the gradient of the energy.
        stress: (S, 3, 3) float64 configurational stress in eV/Å^3, or None where the caller
            needs none (only NPT does). It is ``(1/V) dE/dε`` for a symmetric strain ``ε`` of
            cell and positions, ASE's convention: positive under tension, so the pressure from
            it is ``-trace/3``. It has no kinetic part; the integrators add that themselves.
    """

    energy: torch.Tensor
    forces: torch.Tensor
    stress: torch.Tensor | None = None


ComputeFn = Callable[[State], ForceResult]
"""A potential: energy, forces (and stress) at the positions and cells of a State. It must not
modify the State; within a step it is called once, and may be captured in a CUDA graph."""


@dataclass
class PotentialOutput:
    """What a :class:`~fastmace.dynamics.potential.Potential` computes for a batch of S
    systems with N atoms in all.

    Attributes:
        energy: (S,) float64 total energy of each system in eV, summed in float64.
        forces: (N, 3) float64 forces in eV/Å.
        virial: (S, 3, 3) float64 virial ``-dE/dε`` in eV (mace-torch's ``virials``), or None
            when stress was not asked for.
        stress: (S, 3, 3) float64 stress ``(1/V) dE/dε`` in eV/Å³, ASE's sign convention (as
            mace-torch's MACECalculator reports it); zero for a system whose cell has no
            volume; None when not asked for.
    """

    energy: torch.Tensor
    forces: torch.Tensor
    virial: torch.Tensor | None = None
    stress: torch.Tensor | None = None
