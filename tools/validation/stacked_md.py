"""The stacked linear layers in a captured, compiled MD run on the GPU, against the same run
with cuEquivariance's layers: per block, whether it was redone (a neighbour-list overflow or a
stale list) and the temperature.

    python tools/validation/stacked_md.py [--atoms 216] [--blocks 12]
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import fastmace  # noqa: F401  (before torch: PyTorch's file locks)

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
from profile_step import nacl

from fastmace.dynamics import potential as potential_module
from fastmace.dynamics.ensembles import ensemble
from fastmace.io import OutputSchedule
from fastmace.models.load import load
from fastmace.planner import EngineSettings
from fastmace.simulation import RunSettings, Simulation


def run(loaded, atoms: int, blocks: int, stacked: bool) -> None:
    defaults = potential_module.Potential.__init__.__kwdefaults__
    defaults["stack_linears"] = stacked  # this diagnostic's own process only
    engine = EngineSettings(device="cuda", backend="cueq", block_steps=50, graphs=True,
                            compile=True, radial_table=True)  # fmt: skip
    settings = RunSettings(
        ensemble=ensemble("nvt", temperature_K=300.0, friction_per_ps=1.0), steps=50 * blocks,
        timestep_fs=1.0, seed=1, schedule=OutputSchedule(0, 0, 0), initial_temperature_K=300.0,
    )  # fmt: skip
    simulation = Simulation(loaded, [nacl(atoms)], settings, output=None, engine=engine,
                            progress=io.StringIO())  # fmt: skip
    print(f"stacked {stacked}: layers {len(simulation.potential.stacked_layers)}", flush=True)
    run_block = simulation.engine.run_block

    def reporting_block(steps=None):
        report = run_block(steps)
        state = simulation.engine.md.state
        kinetic = 0.5 * (state.masses[:, None] * state.velocities**2).sum()
        # eV -> K for 3N degrees of freedom (velocities in Å/fs times amu: 103.64 amu Å²/fs² = 1 eV)
        temperature = float(2 * kinetic * 103.6427 / (3 * state.masses.numel() * 8.617333e-5))
        print(f"  step {report.step:5} redone {report.rebuilt_capacity!s:5} "
              f"searched more {report.searched_more_often!s:5} T {temperature:.1f} "
              f"launch {simulation.engine.last_launch} "
              f"capture failure {simulation.engine.capture_failure}",
              flush=True)  # fmt: skip
        return report

    simulation.engine.run_block = reporting_block
    simulation.run()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--atoms", type=int, default=216)
    parser.add_argument("--blocks", type=int, default=12)
    args = parser.parse_args()
    loaded = load("template:mp0-medium", backend="cueq", device="cuda", dtype="float32")
    for stacked in (False, True):
        run(loaded, args.atoms, args.blocks, stacked)


if __name__ == "__main__":
    main()
