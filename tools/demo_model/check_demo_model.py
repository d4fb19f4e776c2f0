"""Physical checks of the shipped demo model (demo-emt-cu.model) against ASE's EMT copper.

The model file is loaded the way users load released checkpoints, through mace-torch's
``MACECalculator`` in float64, and run on a 3x3x3 cubic Cu supercell (108 atoms):

* equation of state: lattice constant and bulk modulus of fcc Cu, model against EMT;
* NVE: velocity Verlet from 300 K; the drift of the total energy (maximum deviation and the
  slope of a straight-line fit);
* NVT: Langevin at 300 K; the displacement of the atoms from their lattice sites (the crystal
  must stay fcc: small RMS displacement, no atom hopping to another site, 12 nearest
  neighbours), and EMT's potential energy and forces on snapshots of the trajectory.

Run it from the repository root (several minutes on two CPU cores):

    python tools/demo_model/check_demo_model.py

Options: ``--model FILE``, ``--steps N`` (per MD run, default 2000), ``--timestep FS``
(default 2), ``--seed N`` and ``--json FILE`` (also write the results as JSON).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from ase import Atoms, units
from ase.build import bulk
from ase.calculators.calculator import Calculator
from ase.calculators.emt import EMT
from ase.eos import EquationOfState
from ase.md.langevin import Langevin
from ase.md.velocitydistribution import MaxwellBoltzmannDistribution, Stationary
from ase.md.verlet import VelocityVerlet
from mace.calculators import MACECalculator

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = REPO_ROOT / "packages/fastmace/src/fastmace/models/demo/demo-emt-cu.model"
LATTICE = 3.61  # Å, as in the training data
TEMPERATURE = 300.0  # K
FRICTION = 0.01 / units.fs
HOP_DISTANCE = 0.5 * LATTICE / np.sqrt(2)  # Å: half the nearest-neighbour distance
NEIGHBOUR_CUTOFF = 3.0  # Å: between the first (2.55 Å) and second (3.61 Å) shells
SAMPLE_EVERY = 10  # MD steps between recorded samples
EMT_SNAPSHOTS = 10  # snapshots of the NVT run compared with EMT


def supercell() -> Atoms:
    """The 108-atom cubic fcc Cu supercell of the MD checks."""
    return bulk("Cu", "fcc", a=LATTICE, cubic=True) * (3, 3, 3)


def equation_of_state(calc: Calculator) -> dict[str, float]:
    """Lattice constant (Å) and bulk modulus (GPa) from an E(V) fit over ±3 % in a."""
    volumes, energies = [], []
    for a in np.linspace(0.97 * LATTICE, 1.03 * LATTICE, 9):
        atoms = bulk("Cu", "fcc", a=a, cubic=True)
        atoms.calc = calc
        volumes.append(atoms.get_volume())
        energies.append(atoms.get_potential_energy())
    eos = EquationOfState(volumes, energies, eos="birchmurnaghan")
    v0, _, b = eos.fit()
    return {"lattice_a": float(v0 ** (1 / 3)), "bulk_modulus_gpa": float(b / units.GPa)}


def minimum_image(vectors: np.ndarray, cell: np.ndarray) -> np.ndarray:
    """Displacement vectors wrapped into the nearest periodic image of an orthorhombic cell."""
    lengths = np.diag(cell)
    return vectors - lengths * np.round(vectors / lengths)


def nearest_neighbour_counts(atoms: Atoms) -> np.ndarray:
    """How many atoms lie within NEIGHBOUR_CUTOFF of each atom."""
    distances = atoms.get_all_distances(mic=True)
    return np.sum(distances < NEIGHBOUR_CUTOFF, axis=1) - 1  # minus the atom itself


def run_nve(
    calc: Calculator, steps: int, timestep_fs: float, rng: np.random.Generator
) -> dict[str, float]:
    """Velocity Verlet from 300 K: the total-energy drift per atom."""
    atoms = supercell()
    atoms.calc = calc
    MaxwellBoltzmannDistribution(atoms, temperature_K=TEMPERATURE, rng=rng)
    Stationary(atoms)  # no centre-of-mass motion, so the temperature is thermal only
    dynamics = VelocityVerlet(atoms, timestep_fs * units.fs)
    times, totals, temperatures = [], [], []

    def record() -> None:
        times.append(dynamics.get_time() / (1000 * units.fs))  # ps
        totals.append(atoms.get_potential_energy() + atoms.get_kinetic_energy())
        temperatures.append(atoms.get_temperature())

    dynamics.attach(record, interval=SAMPLE_EVERY)
    start = time.perf_counter()
    dynamics.run(steps)
    wall = time.perf_counter() - start
    n = len(atoms)
    deviation = 1000 * (np.array(totals) - totals[0]) / n  # meV/atom
    slope, _ = np.polyfit(times, deviation, 1)
    return {
        "steps": steps,
        "timestep_fs": timestep_fs,
        "duration_ps": float(times[-1]),
        "max_abs_drift_mev_per_atom": float(np.max(np.abs(deviation))),
        "final_drift_mev_per_atom": float(deviation[-1]),
        "linear_drift_mev_per_atom_per_ps": float(slope),
        "std_total_energy_mev_per_atom": float(np.std(deviation)),
        "mean_temperature_k": float(np.mean(temperatures[len(temperatures) // 5 :])),
        "wall_s": wall,
        "ms_per_step": 1000 * wall / steps,
    }


def run_nvt(
    calc: Calculator, steps: int, timestep_fs: float, rng: np.random.Generator
) -> dict[str, float]:
    """Langevin at 300 K: does the crystal stay fcc, and does EMT agree on the snapshots."""
    atoms = supercell()
    sites = atoms.positions.copy()
    cell = atoms.cell.array
    atoms.calc = calc
    MaxwellBoltzmannDistribution(atoms, temperature_K=TEMPERATURE, rng=rng)
    Stationary(atoms)
    dynamics = Langevin(
        atoms,
        timestep_fs * units.fs,
        temperature_K=TEMPERATURE,
        friction=FRICTION,
        fixcm=False,
        rng=rng,
    )
    rms, potentials, temperatures, counts = [], [], [], []
    farthest = np.zeros(len(atoms))  # each atom's largest distance from its site so far
    snapshots: list[Atoms] = []
    snapshot_every = max(1, steps // EMT_SNAPSHOTS)

    def record() -> None:
        displacement = minimum_image(atoms.positions - sites, cell)
        # The thermostat lets the whole crystal drift; only motion relative to it counts.
        displacement -= displacement.mean(axis=0)
        distance = np.linalg.norm(displacement, axis=1)
        rms.append(float(np.sqrt(np.mean(distance**2))))
        np.maximum(farthest, distance, out=farthest)
        potentials.append(atoms.get_potential_energy() / len(atoms))
        temperatures.append(atoms.get_temperature())
        counts.append(nearest_neighbour_counts(atoms))
        step = dynamics.nsteps
        if step > 0 and step % snapshot_every == 0:
            snapshots.append(Atoms(atoms.numbers, atoms.positions, cell=atoms.cell, pbc=atoms.pbc))

    dynamics.attach(record, interval=SAMPLE_EVERY)
    start = time.perf_counter()
    dynamics.run(steps)
    wall = time.perf_counter() - start
    # The first fifth is equilibration (the crystal starts on its lattice sites).
    settled = slice(len(rms) // 5, None)
    all_counts = np.concatenate(counts[settled])

    model_energy, emt_energy, force_errors = [], [], []
    for snapshot in snapshots:
        snapshot.calc = calc
        model_energy.append(snapshot.get_potential_energy() / len(snapshot))
        model_forces = snapshot.get_forces()
        snapshot.calc = EMT()
        emt_energy.append(snapshot.get_potential_energy() / len(snapshot))
        force_errors.append(snapshot.get_forces() - model_forces)
    energy_error = 1000 * (np.array(model_energy) - np.array(emt_energy))
    force_error = 1000 * np.concatenate(force_errors).ravel()
    return {
        "steps": steps,
        "timestep_fs": timestep_fs,
        "mean_temperature_k": float(np.mean(temperatures[settled])),
        "mean_rms_displacement_a": float(np.mean(rms[settled])),
        "max_rms_displacement_a": float(np.max(rms)),
        "max_displacement_a": float(farthest.max()),
        "hop_threshold_a": float(HOP_DISTANCE),
        "atoms_hopped": int(np.sum(farthest > HOP_DISTANCE)),
        "fraction_with_12_neighbours": float(np.mean(all_counts == 12)),
        "mean_potential_energy_ev_per_atom": float(np.mean(potentials[settled])),
        "snapshots_compared": len(snapshots),
        "snapshot_model_energy_ev_per_atom": float(np.mean(model_energy)),
        "snapshot_emt_energy_ev_per_atom": float(np.mean(emt_energy)),
        "snapshot_energy_mae_mev_per_atom": float(np.mean(np.abs(energy_error))),
        "snapshot_energy_max_error_mev_per_atom": float(np.max(np.abs(energy_error))),
        "snapshot_forces_mae_mev_per_a": float(np.mean(np.abs(force_error))),
        "snapshot_forces_rmse_mev_per_a": float(np.sqrt(np.mean(force_error**2))),
        "wall_s": wall,
        "ms_per_step": 1000 * wall / steps,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the checks and print (and optionally save) the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="model file")
    parser.add_argument("--steps", type=int, default=2000, help="steps of each MD run")
    parser.add_argument("--timestep", type=float, default=2.0, help="MD time step in fs")
    parser.add_argument("--seed", type=int, default=0, help="seed of the initial velocities")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    calc = MACECalculator(model_paths=str(args.model), device="cpu", default_dtype="float64")
    results = {
        "model": str(args.model),
        "eos_model": equation_of_state(calc),
        "eos_emt": equation_of_state(EMT()),
    }
    print(json.dumps(results, indent=2), flush=True)
    results["nve"] = run_nve(calc, args.steps, args.timestep, rng)
    print(json.dumps(results["nve"], indent=2), flush=True)
    results["nvt"] = run_nvt(calc, args.steps, args.timestep, rng)
    print(json.dumps(results["nvt"], indent=2), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
