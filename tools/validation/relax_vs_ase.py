"""FastMACE's FIRE against ASE's, on the demo model (CPU): iterations, positions, cells.

Two rattled 32-atom copper cells relaxed as one batch by ``fastmace.relaxation.Relaxation``,
then each alone by ASE's ``FIRE`` (positions) or ``FIRE(FrechetCellFilter(...))`` (cell, at
0 and 2 GPa) with FastMACE's ASE calculator on the same model. Prints one JSON line per case.

    python tools/validation/relax_vs_ase.py
"""

from __future__ import annotations

import json
import time

import ase.build
import numpy as np
from ase.filters import FrechetCellFilter
from ase.optimize import FIRE

import fastmace as fm
from fastmace.dynamics.relax import FireSettings
from fastmace.models.load import load
from fastmace.relaxation import Relaxation
from fastmace.vocabulary import EV_PER_A3_PER_GPA


def copper(seed: int) -> ase.Atoms:
    atoms = ase.build.bulk("Cu", "fcc", a=3.70, cubic=True).repeat((2, 2, 2))
    atoms.rattle(0.08, seed=seed)
    return atoms


def main() -> None:
    model = load("demo-emt-cu")
    for cell, pressure in ((False, 0.0), (True, 0.0), (True, 2.0)):
        structures = [copper(1), copper(2)]
        settings = FireSettings(fmax=0.01, cell=cell, pressure_GPa=pressure)
        started = time.perf_counter()
        ours = Relaxation(model, structures, settings, max_steps=400).run()
        ours_s = time.perf_counter() - started
        for index, atoms in enumerate(structures):
            reference = atoms.copy()
            reference.calc = fm.calculator("demo-emt-cu")
            scalar = pressure * EV_PER_A3_PER_GPA
            target = FrechetCellFilter(reference, scalar_pressure=scalar) if cell else reference
            optimizer = FIRE(target, logfile=None)
            optimizer.run(fmax=0.01, steps=400)
            relaxed = ours.structures[index]
            print(json.dumps({
                "cell": cell, "pressure_GPa": pressure, "system": index,
                "iterations": ours.iterations[index], "ase_iterations": optimizer.nsteps,
                "energy_difference_eV": ours.energies_eV[index]
                - reference.get_potential_energy(),
                "largest_position_difference_A": float(
                    np.abs(relaxed.positions - reference.positions).max()),
                "largest_cell_difference_A": float(
                    np.abs(relaxed.cell[:] - reference.cell[:]).max()),
                "fastmace_batch_s": round(ours_s, 1),
            }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
