"""A perfect crystal's mean temperature over the second half of a short run, with FastMACE's
default start and with velocities drawn at the target (docs/validation/md-ensembles.md).

16 copies of a 32-atom Cu cell, shipped demo model, Langevin at its default 1/ps, 1,000 steps
of 1 fs at 300 K, on the CPU (about 4.5 minutes per case on 2 cores):

    OMP_NUM_THREADS=2 python tools/validation/thermal_start_cpu.py
"""

from __future__ import annotations

import io
import time

import ase.build
import numpy as np

import fastmace as fm

CASES = {"default start": {}, "drawn at 300 K": {"initial_temperature_K": 300.0}}


def main() -> None:
    atoms = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat(2)
    for label, start in CASES.items():
        tick = time.perf_counter()
        result = fm.md(
            atoms, model="demo-emt-cu", steps=1000, temperature_K=300.0, thermo_every=20,
            seed=3, device="cpu", replicas=16, progress=io.StringIO(), **start,
        )  # fmt: skip
        means = np.array(result.mean_temperature_K)
        error = means.std() / np.sqrt(len(means))
        print(f"{label}: second half {means.mean():.1f} +- {error:.1f} K over {len(means)} "
              f"copies ({time.perf_counter() - tick:.0f} s)")  # fmt: skip


if __name__ == "__main__":
    main()
