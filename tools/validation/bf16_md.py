"""MD observables of the BF16 tier against float32: NVE drift, and an NVT run's temperature,
pressure and radial distribution, beside float32's own run-to-run noise.

On the shipped demo model (copper), through ``fm.md`` as a user runs it:

- NVE, 10 ps at 2 fs from 600 K (about 300 K once equipartitioned): the total energy's drift
  (slope of a straight-line fit, meV per atom per ps) and its fluctuation, float32 and BF16.
- NVT (CSVR at 300 K, 100 fs), 10 ps at 2 fs: mean temperature and pressure over the second
  half with block-averaged standard errors, and the Cu-Cu radial distribution of its frames;
  float32 with two seeds (their difference is the noise) and BF16 with the first seed.

    python tools/validation/bf16_md.py --out docs/validation/bf16-md.json [--ps 10]

On the CPU the BF16 tier computes the products of BF16-rounded factors in float32: the numbers
BF16 tensor cores give, up to the order of the sums (dynamics/reduced_matmul.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import ase
import numpy as np
from ase.build import bulk

import fastmace as fm
from fastmace.io.plot import read_series
from fastmace.io.trajectory import read_trajectory

TIMESTEP_FS = 2.0
RDF_RANGE_A = (1.5, 6.0)
RDF_BINS = 90


def copper(repeat: int) -> ase.Atoms:
    return bulk("Cu", "fcc", a=3.61, cubic=True).repeat(repeat)


def run(atoms: ase.Atoms, directory: Path, precision: str, ensemble: str, steps: int,
        seed: int, **settings) -> tuple[dict, Path]:  # fmt: skip
    tick = time.perf_counter()
    fm.md(
        atoms, model="demo-emt-cu", ensemble=ensemble, steps=steps, timestep_fs=TIMESTEP_FS,
        output=directory, seed=seed, thermo_every=10, trajectory_every=50,
        config=fm.EngineConfig(matmul_precision=precision, dtype="float32"), **settings,
    )  # fmt: skip
    series = read_series(directory / "thermo.csv")[0]
    series["seconds"] = time.perf_counter() - tick
    return series, directory / "trajectory.extxyz"


def block_error(values: np.ndarray, blocks: int = 5) -> float:
    """Standard error of the mean from ``blocks`` contiguous blocks (correlated samples)."""
    means = [float(np.mean(chunk)) for chunk in np.array_split(values, blocks)]
    return float(np.std(means, ddof=1) / np.sqrt(blocks))


def drift(series: dict, atoms: int) -> dict[str, float]:
    time_ps = np.asarray(series["time_ps"])
    energy = np.asarray(series["total_energy_eV"]) / atoms
    slope = np.polyfit(time_ps, energy, 1)[0]
    return {
        "drift_meV_per_atom_per_ps": 1000 * float(slope),
        "fluctuation_meV_per_atom": 1000 * float(np.std(energy)),
        "steps_per_s": (len(time_ps) - 1) * 10 / series["seconds"],
    }


def rdf(frames: list[ase.Atoms]) -> np.ndarray:
    edges = np.linspace(*RDF_RANGE_A, RDF_BINS + 1)
    counts = np.zeros(RDF_BINS)
    for atoms in frames:
        distances = atoms.get_all_distances(mic=True)[np.triu_indices(len(atoms), 1)]
        counts += np.histogram(distances, bins=edges)[0]
    atoms = frames[0]
    density = len(atoms) / atoms.get_volume()
    shells = 4.0 / 3.0 * np.pi * (edges[1:] ** 3 - edges[:-1] ** 3)
    return 2.0 * counts / (len(frames) * len(atoms) * density * shells)


def nvt_figures(series: dict, trajectory: Path) -> tuple[dict[str, float], np.ndarray]:
    half = len(series["time_ps"]) // 2
    temperature = np.asarray(series["temperature_K"][half:])
    pressure = np.asarray(series["pressure_GPa"][half:])
    frames = read_trajectory(trajectory)
    return {
        "mean_temperature_K": float(temperature.mean()),
        "temperature_error_K": block_error(temperature),
        "mean_pressure_GPa": float(pressure.mean()),
        "pressure_error_GPa": block_error(pressure),
        "frames": len(frames) - len(frames) // 2,
    }, rdf(frames[len(frames) // 2 :])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ps", type=float, default=10.0, help="length of each run")
    parser.add_argument("--repeat", type=int, default=3, help="fcc cells per side (4 atoms each)")
    parser.add_argument("--out", type=Path, default=None)
    arguments = parser.parse_args(argv)
    steps = round(arguments.ps * 1000 / TIMESTEP_FS)
    atoms = copper(arguments.repeat)
    document: dict = {"atoms": len(atoms), "timestep_fs": TIMESTEP_FS, "steps": steps,
                      "nve": {}, "nvt": {}}  # fmt: skip
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        for precision in ("float32", "bf16"):
            series, _ = run(atoms, root / f"nve-{precision}", precision, "nve", steps, 0,
                            initial_temperature_K=600.0)  # fmt: skip
            document["nve"][precision] = drift(series, len(atoms))
            print("nve", precision, document["nve"][precision], flush=True)
        distributions = {}
        for precision, seed in (("float32", 0), ("float32", 1), ("bf16", 0)):
            name = f"{precision}-seed{seed}"
            series, trajectory = run(atoms, root / f"nvt-{name}", precision, "nvt-csvr", steps,
                                     seed, temperature_K=300.0, tau_fs=100.0)  # fmt: skip
            figures, distributions[name] = nvt_figures(series, trajectory)
            document["nvt"][name] = figures
            print("nvt", name, figures, flush=True)
    reference = distributions["float32-seed0"]
    width = (RDF_RANGE_A[1] - RDF_RANGE_A[0]) / RDF_BINS
    for name in ("float32-seed1", "bf16-seed0"):
        difference = distributions[name] - reference
        document["nvt"][name]["rdf_max_difference"] = float(np.abs(difference).max())
        document["nvt"][name]["rdf_integrated_abs_difference_A"] = float(
            np.abs(difference).sum() * width
        )
        print("rdf", name, "against float32-seed0:", document["nvt"][name], flush=True)
    document["rdf_r_A"] = list(np.linspace(*RDF_RANGE_A, RDF_BINS + 1)[:-1] + width / 2)
    document["rdf"] = {name: list(values) for name, values in distributions.items()}
    if arguments.out is not None:
        arguments.out.write_text(json.dumps(document, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
