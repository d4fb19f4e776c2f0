"""Issue 16's run on the harmonic copper lattice of tests/test_integrators_sampling.py.

256 systems from the perfect lattice with Maxwell-Boltzmann velocities at 300 K, Langevin at
1/ps, 6,000 steps of 2 fs, temperature every 4 fs; prints the mean of the runs' means, their
spread, the naive and the autocorrelation-based standard errors of one run, with and without
the first 2 ps (docs/validation/md-ensembles.md). About 2 minutes on one CPU core:

    PYTHONPATH=packages/fastmace/src python tools/validation/langevin_issue16.py
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parents[2] / "packages/fastmace/tests"))
from test_integrators_sampling import HarmonicLattice, autocorrelation_time, copper

from fastmace.dynamics.integrators import (
    langevin_init,
    langevin_step,
    maxwell_boltzmann_velocities,
)
from fastmace.dynamics.state import State


def main(n_systems: int = 256, steps: int = 6000, every: int = 2) -> None:
    torch.set_num_threads(1)
    atoms = copper()
    lattice = HarmonicLattice(atoms, n_systems)
    state = maxwell_boltzmann_velocities(State.from_atoms([atoms] * n_systems), 300.0, 7)
    md = langevin_init(state, lattice, timestep_fs=2.0, temperature_K=300.0, rng=8)
    samples = []
    for index in range(1, steps + 1):
        md = langevin_step(md, lattice)
        if index % every == 0:
            samples.append(md.temperature().numpy().copy())
    temperatures = np.array(samples)
    for label, first in (("whole run", 0), ("after 2 ps", 2000 // (2 * every))):
        t = temperatures[first:]
        n, means = t.shape[0], t.mean(axis=0)
        naive = t.std(axis=0).mean() / math.sqrt(n)
        tau = np.mean([autocorrelation_time(t[:, [s]]) for s in range(n_systems)])
        honest = t.std(axis=0).mean() * math.sqrt(2 * tau / n)
        z = (means - 300.0) / (t.std(axis=0) / math.sqrt(n))
        error = means.std() / math.sqrt(n_systems)
        print(
            f"{label}: mean of run means {means.mean():.1f} +- {error:.1f} K, "
            f"spread {means.std():.1f} K; one run's naive SE {naive:.2f} K, from its own tau "
            f"({tau * 2 * every:.0f} fs) {honest:.1f} K; naive z spread {z.std():.1f}; "
            f"runs at or below 282 K: {np.mean(means <= 282):.0%}"
        )


if __name__ == "__main__":
    main()
