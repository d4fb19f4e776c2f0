"""The structures D3 is checked on, apart from the tests that need torch-dftd (so that the
fused kernels' comparison runs where torch-dftd is not installed)."""

from __future__ import annotations

import ase
import numpy as np
from ase.build import bulk, fcc111, molecule


def structures() -> dict[str, ase.Atoms]:
    """A molecule (no cell), a slab with an adsorbate (periodic in x, y) and a rattled bulk
    cell with a sheared, non-orthogonal lattice; all small, so torch-dftd's host list is quick."""
    ethanol = molecule("CH3CH2OH")
    slab = fcc111("Cu", (2, 2, 2), vacuum=6.0)
    water = molecule("H2O")
    water.translate(slab.positions[-1] + [0.0, 0.0, 2.2] - water.positions[0])
    slab += water
    slab.pbc = [True, True, False]
    rocksalt = bulk("NaCl", "rocksalt", a=5.64)
    shear = np.array([[1.02, 0.03, 0.0], [0.0, 0.99, 0.0], [0.0, 0.0, 1.0]])
    rocksalt.set_cell(rocksalt.cell @ shear, scale_atoms=True)
    found = {"molecule": ethanol, "slab": slab, "bulk": rocksalt}
    for seed, atoms in enumerate(found.values()):
        atoms.rattle(0.05, seed=seed)
    return found
