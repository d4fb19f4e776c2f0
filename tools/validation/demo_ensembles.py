"""The sampled ensembles on the demo model itself: tens of picoseconds, many replicas at once.

Issue 33, item 7. The unit tests check each integrator on potentials whose answers are exact
(tests/test_integrators_sampling.py, test_integrators_ensembles.py). This runs the shipped
demo model through ``fm.md`` as a user would, with ``replicas`` independent copies of the
32-atom copper cell in one batch, for each thermostat and NPT, and compares what the copies
sampled after equilibration with what the canonical ensemble says:

- mean temperature = the target;
- the kinetic energy's relative variance = 2 / N_f (N_f = 3N - 3 = 93 degrees of freedom);
- NPT: mean pressure = the target.

Error bars come from the spread of the replicas' own means (they are independent), so they
count each trajectory's time correlation. On the GPU machine:

    python tools/validation/demo_ensembles.py --out $OUT/ensembles [--ps 20] [--replicas 64]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from pathlib import Path

import ase.io
import numpy as np

import fastmace as fm

EXAMPLE = Path(__file__).parents[2] / "examples" / "cu-fcc-32.extxyz"
TIMESTEP_FS = 2.0
TARGET_K = 300.0
CASES = {
    "langevin 1/ps (default)": {"ensemble": "nvt-langevin"},
    "langevin 10/ps": {"ensemble": "nvt-langevin", "friction_per_ps": 10.0},
    "csvr 100 fs (default)": {"ensemble": "nvt-csvr"},
    "nose-hoover chain 100 fs (default)": {"ensemble": "nvt-nose-hoover"},
    "npt 0 GPa (default barostat)": {"ensemble": "npt", "pressure_GPa": 0.0},
}


def replica_series(thermo: Path, column: str) -> dict[int, list[tuple[int, float]]]:
    """Each system's (step, value) rows of one thermo.csv column."""
    series: dict[int, list[tuple[int, float]]] = {}
    with thermo.open() as handle:
        for row in csv.DictReader(line for line in handle if not line.startswith("#")):
            system = int(row.get("system") or 0)
            series.setdefault(system, []).append((int(row["step"]), float(row[column])))
    return series


def sampled(series: dict[int, list[tuple[int, float]]], from_step: int) -> np.ndarray:
    """(systems, samples) of the values from ``from_step`` on."""
    return np.array([[v for step, v in rows if step >= from_step] for rows in series.values()])


def mean_and_error(per_replica: np.ndarray) -> tuple[float, float]:
    return float(per_replica.mean()), float(per_replica.std(ddof=1) / math.sqrt(per_replica.size))


def analyse(out: Path, atoms: int, steps: int, equilibration_steps: int, case: dict) -> dict:
    thermo = out / "thermo.csv"
    temperature = sampled(replica_series(thermo, "temperature_K"), equilibration_steps)
    dof = 3 * atoms - 3
    per_replica_mean = temperature.mean(axis=1)
    mean_t, error_t = mean_and_error(per_replica_mean)
    relative_variance = temperature.var(axis=1) / per_replica_mean**2
    variance, variance_error = mean_and_error(relative_variance)
    result = {
        "mean_temperature_K": mean_t, "mean_temperature_error_K": error_t,
        "z_temperature": (mean_t - TARGET_K) / error_t,
        "relative_variance_of_K": variance, "relative_variance_error": variance_error,
        "canonical_relative_variance": 2 / dof,
        "z_variance": (variance - 2 / dof) / variance_error,
        "samples_per_replica": int(temperature.shape[1]),
    }  # fmt: skip
    if case["ensemble"] == "npt":
        pressure = sampled(replica_series(thermo, "pressure_GPa"), equilibration_steps)
        mean_p, error_p = mean_and_error(pressure.mean(axis=1))
        result.update(mean_pressure_GPa=mean_p, mean_pressure_error_GPa=error_p,
                      z_pressure=(mean_p - case["pressure_GPa"]) / error_p)  # fmt: skip
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--ps", type=float, default=20.0)
    parser.add_argument("--equilibration-ps", type=float, default=4.0)
    parser.add_argument("--replicas", type=int, default=64)
    parser.add_argument("--device", default=None)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    structure = ase.io.read(EXAMPLE)
    steps = round(args.ps * 1000 / TIMESTEP_FS)
    equilibration = round(args.equilibration_ps * 1000 / TIMESTEP_FS)
    record = {"model": "demo-emt-cu", "atoms": len(structure), "replicas": args.replicas,
              "timestep_fs": TIMESTEP_FS, "steps": steps, "equilibration_steps": equilibration,
              "temperature_K": TARGET_K, "cases": []}  # fmt: skip
    for name, case in CASES.items():
        tick = time.perf_counter()
        slug = name.split(" (")[0].replace("/", " per ").replace(" ", "-")
        directory = args.out / slug
        entry = {"case": name, **case}
        try:
            fm.md(
                structure, model="demo-emt-cu", steps=steps, timestep_fs=TIMESTEP_FS,
                temperature_K=TARGET_K, replicas=args.replicas, seed=7, output=directory,
                thermo_every=10, trajectory_every=0, restart_every=0, device=args.device,
                **case,
            )  # fmt: skip
            entry.update(status="ok", **analyse(directory, len(structure), steps,
                                                equilibration, case))  # fmt: skip
        except Exception as error:  # recorded; the next case still runs
            entry.update(status="failed", error=f"{type(error).__name__}: {error}"[:500])
        entry["wall_s"] = time.perf_counter() - tick
        record["cases"].append(entry)
        print(json.dumps(entry), flush=True)
        (args.out / "demo_ensembles.json").write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
