"""One output frame: the structures of every system at one step, checked once for all writers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import ase
import numpy as np


@dataclass(frozen=True)
class Frame:
    """All systems of a batch at one step; energies (eV) and forces (eV/Å) are optional."""

    step: int
    time_fs: float
    atoms: list[ase.Atoms]
    energies: list[float] | None
    forces: list[np.ndarray] | None


def make_frame(
    step: int,
    time_fs: float,
    atoms: ase.Atoms | Sequence[ase.Atoms],
    energies: float | Sequence[float] | np.ndarray | None = None,
    forces: np.ndarray | Sequence[np.ndarray] | None = None,
) -> Frame:
    """A checked :class:`Frame`.

    ``forces`` is either one array per system or a single (N, 3) array of all atoms in system
    order, as the engine holds them.
    """
    if isinstance(step, bool) or not isinstance(step, int | np.integer) or step < 0:
        raise ValueError(f"frame step must be a non-negative integer, got {step!r}")
    structures = [atoms] if isinstance(atoms, ase.Atoms) else list(atoms)
    if not structures or not all(isinstance(item, ase.Atoms) for item in structures):
        raise TypeError("a frame needs one ase.Atoms per system (at least one)")
    counts = [len(item) for item in structures]
    if 0 in counts:
        raise ValueError(f"system {counts.index(0)} of the frame at step {step} has no atoms")
    return Frame(
        step=int(step),
        time_fs=float(time_fs),
        atoms=structures,
        energies=None if energies is None else _energies(energies, len(structures)),
        forces=None if forces is None else _forces(forces, counts),
    )


def _energies(energies: float | Sequence[float] | np.ndarray, n_systems: int) -> list[float]:
    values = np.atleast_1d(np.asarray(energies, dtype=np.float64))
    if values.shape != (n_systems,):
        raise ValueError(
            f"expected one energy per system ({n_systems}), got an array of shape {values.shape}"
        )
    return [float(value) for value in values]


def _forces(forces: np.ndarray | Sequence[np.ndarray], counts: list[int]) -> list[np.ndarray]:
    if isinstance(forces, np.ndarray) and forces.ndim == 2:
        if forces.shape != (sum(counts), 3):
            raise ValueError(
                f"forces of all atoms must have shape ({sum(counts)}, 3), got {forces.shape}"
            )
        forces = np.split(forces, np.cumsum(counts)[:-1])
    arrays = [np.asarray(item, dtype=np.float64) for item in forces]
    if len(arrays) != len(counts):
        raise ValueError(f"expected forces for {len(counts)} systems, got {len(arrays)}")
    for index, (array, count) in enumerate(zip(arrays, counts, strict=True)):
        if array.shape != (count, 3):
            raise ValueError(
                f"forces of system {index} must have shape ({count}, 3), got {array.shape}"
            )
    return arrays
