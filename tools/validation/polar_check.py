"""MACE-POLAR-1 through fm.calculator: the measurements of docs/validation/polar.md.

On the given device (default: CUDA when there is one), with the ``polar-tiny`` template:

1. energy, forces and stress of fm.calculator against mace-torch's MACECalculator, float64
   and float32, for an open molecule, a periodic cell, a cation doublet, a neutral doublet
   and a charged periodic cell;
2. forces and stress against central finite differences of the energy (float64);
3. NVE with ASE's VelocityVerlet on fm.calculator over 20 fs at two timesteps: the error of a
   smooth potential falls 4 times when the step halves (``--nve``);
4. the time of one calculator call, and whether a cueq conversion passes its check (CUDA).

Usage: PYTHONPATH=packages/fastmace/src python tools/validation/polar_check.py [--device D] [--nve]
"""

from __future__ import annotations

import argparse
import copy
import time

import ase
import numpy as np
import torch
from ase.build import bulk, molecule

import fastmace as fm


def structures() -> dict[str, ase.Atoms]:
    methanol = molecule("CH3OH")
    methanol.rattle(stdev=0.05, seed=3)
    cell = bulk("Cu", "fcc", a=3.7, cubic=True).repeat((2, 1, 1))
    cell.numbers[[0, 5]] = 8
    cell.rattle(stdev=0.05, seed=4)
    cation = methanol.copy()
    cation.info.update(charge=1, spin=2)
    radical = molecule("CH3")
    radical.info["spin"] = 2
    charged_cell = cell.copy()
    charged_cell.info["charge"] = 1
    return {
        "open molecule (CH3OH)": methanol,
        "periodic cell (Cu6O2)": cell,
        "cation doublet (CH3OH+, spin 2)": cation,
        "neutral doublet (CH3, spin 2)": radical,
        "charged periodic cell (Cu6O2, +1)": charged_cell,
    }


def mace_torch(module: torch.nn.Module, atoms: ase.Atoms, dtype: str, device: str):
    from mace.calculators import MACECalculator
    from mace.tools import torch_tools

    atoms = atoms.copy()
    atoms.calc = MACECalculator(
        models=[copy.deepcopy(module)], model_type="PolarMACE", default_dtype=dtype, device=device
    )
    with torch_tools.default_dtype(dtype):
        return (
            atoms.get_potential_energy(),
            atoms.get_forces(),
            atoms.get_stress(voigt=False) if atoms.pbc.all() else None,
        )


def compare(device: str) -> None:
    print(f"## fm.calculator against mace-torch's MACECalculator ({device})")
    print("| dtype | structure | |ΔE| eV | max |ΔF| eV/Å | max |Δσ| eV/Å³ | |E| eV | max |F| |")
    print("|---|---|---|---|---|---|---|")
    for dtype in ("float64", "float32"):
        loaded = fm.load("template:polar-tiny", dtype=dtype, device=device)
        for name, atoms in structures().items():
            energy, forces, stress = mace_torch(loaded.module, atoms, dtype, device)
            ours = atoms.copy()
            ours.calc = fm.calculator(loaded)
            d_energy = abs(ours.get_potential_energy() - energy)
            d_forces = float(np.abs(ours.get_forces() - forces).max())
            d_stress = (
                f"{float(np.abs(ours.get_stress(voigt=False) - stress).max()):.2e}"
                if stress is not None
                else "-"
            )
            print(
                f"| {dtype} | {name} | {d_energy:.2e} | {d_forces:.2e} | {d_stress} | "
                f"{abs(energy):.2f} | {float(np.abs(forces).max()):.2f} |"
            )


def finite_differences(device: str) -> None:
    print(f"\n## Against central finite differences of the energy (float64, {device})")
    loaded = fm.load("template:polar-tiny", dtype="float64", device=device)
    h_position, h_strain = 1e-4, 1e-5
    for name, atoms in structures().items():
        atoms = atoms.copy()
        atoms.calc = fm.calculator(loaded)
        forces = atoms.get_forces()
        numeric = np.zeros((2, 3))
        for row, index in enumerate((0, len(atoms) - 1)):
            for axis in range(3):
                energies = []
                for sign in (1, -1):
                    moved = atoms.copy()
                    moved.calc = atoms.calc
                    moved.positions[index, axis] += sign * h_position
                    energies.append(moved.get_potential_energy())
                numeric[row, axis] = -(energies[0] - energies[1]) / (2 * h_position)
        force_error = float(np.abs(numeric - forces[[0, len(atoms) - 1]]).max())
        line = f"- {name}: forces (atoms 0 and last) off by {force_error:.1e} eV/Å"
        if atoms.pbc.all():
            stress = atoms.get_stress(voigt=False)
            _, _, theirs = mace_torch(loaded.module, atoms, "float64", device)
            numeric_stress = np.zeros((3, 3))
            volume = atoms.get_volume()
            for i in range(3):
                for j in range(3):
                    energies = []
                    for sign in (1, -1):
                        strain = np.eye(3)
                        strain[i, j] += sign * h_strain
                        strained = atoms.copy()
                        strained.calc = atoms.calc
                        strained.set_cell(atoms.cell @ strain, scale_atoms=True)
                        energies.append(strained.get_potential_energy())
                    numeric_stress[i, j] = (energies[0] - energies[1]) / (2 * h_strain) / volume
            numeric_stress = 0.5 * (numeric_stress + numeric_stress.T)
            line += (
                f"; stress: ours vs mace-torch {np.abs(stress - theirs).max():.1e}, "
                f"ours vs finite differences {np.abs(stress - numeric_stress).max():.1e} "
                f"eV/Å³ (largest component {np.abs(numeric_stress).max():.1e})"
            )
        print(line)


def nve(model: str, timestep_fs: float, duration_fs: float = 20.0) -> tuple[float, float]:
    """Largest |E_total - E_total(0)| and largest per-step |ΔE| (eV) of ASE's VelocityVerlet
    on fm.calculator over ``duration_fs``, from 300 K, float64."""
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution
    from ase.md.verlet import VelocityVerlet

    atoms = structures()["periodic cell (Cu6O2)"].repeat((1, 2, 1))
    atoms.calc = fm.calculator(model, dtype="float64")
    MaxwellBoltzmannDistribution(atoms, temperature_K=300, rng=np.random.default_rng(0))
    dynamics = VelocityVerlet(atoms, timestep=timestep_fs * ase.units.fs)
    totals = [atoms.get_total_energy()]
    for _ in range(round(duration_fs / timestep_fs)):
        dynamics.run(1)
        totals.append(atoms.get_total_energy())
    totals = np.array(totals)
    return float(np.abs(totals - totals[0]).max()), float(np.abs(np.diff(totals)).max())


def timing(device: str) -> None:
    print(f"\n## One calculator call ({device}, float64 and float32; best of 5 after one warm-up)")
    for dtype in ("float64", "float32"):
        loaded = fm.load("template:polar-tiny", dtype=dtype, device=device)
        for name, atoms in list(structures().items())[:2]:
            atoms = atoms.copy()
            atoms.calc = fm.calculator(loaded)
            times = []
            for step in range(6):
                atoms.positions[0, 0] += 1e-3  # a new structure each call
                tick = time.perf_counter()
                atoms.get_forces()
                if step:
                    times.append(time.perf_counter() - tick)
            print(f"- {dtype}, {name}: {min(times) * 1e3:.1f} ms")


def cueq(device: str) -> None:
    print(f"\n## backend='cueq' for PolarMACE ({device})")
    try:
        loaded = fm.load("template:polar-tiny", dtype="float64", device=device, backend="cueq")
        print(f"- conversion passed its check: {loaded.conversion_check}")
    except Exception as error:  # reported, not raised: this is a probe
        print(f"- refused: {type(error).__name__}: {str(error)[:300]}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--nve", action="store_true")
    args = parser.parse_args()
    compare(args.device)
    finite_differences(args.device)
    timing(args.device)
    if args.device.startswith("cuda"):
        cueq(args.device)
    if args.nve:
        print("\n## NVE, ASE VelocityVerlet, 20 fs, 16-atom cell from 300 K, float64")
        for model in ("template:polar-tiny", "template:tiny"):
            for timestep_fs in (0.5, 0.25):
                largest, step = nve(model, timestep_fs)
                print(
                    f"- {model}, {timestep_fs} fs: max |E - E0| {largest:.2e} eV, "
                    f"largest |ΔE| in one step {step:.2e} eV"
                )


if __name__ == "__main__":
    main()
