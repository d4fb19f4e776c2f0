"""MACE-POLAR-1's structures and mace-torch's own results for them (the polar tests' reference)."""

from __future__ import annotations

import ase
import numpy as np
import torch
from ase.build import bulk, molecule


def mace_torch_results(
    reference: torch.nn.Module, atoms: ase.Atoms, dtype: str
) -> tuple[float, np.ndarray, np.ndarray | None]:
    """Energy, forces and (periodic cells) stress from mace-torch's MACECalculator."""
    from mace.calculators import MACECalculator
    from mace.tools import torch_tools

    calc = MACECalculator(
        models=[reference], model_type="PolarMACE", default_dtype=dtype, device="cpu"
    )
    atoms = atoms.copy()
    atoms.calc = calc
    # graph-longrange makes some of its real-space work in torch's default dtype.
    with torch_tools.default_dtype(dtype):
        energy = atoms.get_potential_energy()
        forces = atoms.get_forces()
        stress = atoms.get_stress(voigt=False) if atoms.pbc.all() else None
    return energy, forces, stress


def methanol(charge: int | None = None, spin: int | None = None) -> ase.Atoms:
    atoms = molecule("CH3OH")
    atoms.rattle(stdev=0.05, seed=3)
    if charge is not None:
        atoms.info["charge"] = charge
    if spin is not None:
        atoms.info["spin"] = spin
    return atoms


def copper_oxide(charge: int | None = None) -> ase.Atoms:
    """A rattled 8-atom periodic cell of Cu with two O."""
    atoms = bulk("Cu", "fcc", a=3.7, cubic=True).repeat((2, 1, 1))
    atoms.numbers[[0, 5]] = 8
    atoms.rattle(stdev=0.05, seed=4)
    if charge is not None:
        atoms.info["charge"] = charge
    return atoms
