"""Physical checks of the engine with the shipped demo model (a MACE trained on EMT copper).

The integrators' statistical tests (canonical kinetic-energy distributions, NPT pressure) use
a cheap analytic potential in test_integrators*.py; here the real model, through the whole
engine (neighbour list with skin, padding, potential, integrator), must conserve energy and
retrace its steps.
"""

from __future__ import annotations

import csv
from dataclasses import replace

import ase.build
import numpy as np

from fastmace.dynamics.engine import ForceField
from fastmace.dynamics.ensembles import ensemble
from fastmace.dynamics.integrators import maxwell_boltzmann_velocities, nve_init, nve_step
from fastmace.dynamics.neighbours import NeighbourList
from fastmace.dynamics.potential import Potential
from fastmace.dynamics.state import State
from fastmace.io import OutputSchedule
from fastmace.simulation import RunSettings, Simulation

# Bounds for 32 Cu atoms at 300 K, 2 fs steps, float64 model (measured: see
# docs/validation/md-engine.md): fluctuation of the total energy and its drift.
MAX_FLUCTUATION_EV_PER_ATOM = 2e-4
MAX_DRIFT_EV_PER_ATOM_PER_PS = 2e-4


def crystal() -> ase.Atoms:
    atoms = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat(2)
    atoms.rattle(0.03, seed=11)
    return atoms


def test_nve_conserves_energy_over_a_thousand_steps(demo, tmp_path):
    settings = RunSettings(
        ensemble=ensemble("nve"),
        steps=1000,
        timestep_fs=2.0,
        seed=1,
        schedule=OutputSchedule(trajectory_every=0, thermo_every=10, restart_every=0),
        initial_temperature_K=300.0,
    )  # the thermo interval makes K = 10
    Simulation(demo, [crystal()], settings, tmp_path / "run").run()
    rows = list(csv.DictReader((tmp_path / "run" / "thermo.csv").open()))
    time_ps = np.array([float(r["time_fs"]) for r in rows]) / 1000.0
    total = np.array([float(r["total_energy_eV"]) for r in rows]) / 32
    temperature = np.array([float(r["temperature_K"]) for r in rows])
    assert 50 < temperature[-100:].mean() < 300  # it is moving: half the kinetic energy goes
    fluctuation = np.abs(total - total[0]).max()
    drift = abs(np.polyfit(time_ps, total, 1)[0])
    assert fluctuation < MAX_FLUCTUATION_EV_PER_ATOM, fluctuation
    assert drift < MAX_DRIFT_EV_PER_ATOM_PER_PS, drift


def test_nve_retraces_its_steps_when_velocities_are_reversed(demo):
    state = State.from_atoms(crystal())
    potential = Potential.from_loaded(demo, state.atomic_numbers)
    neighbours = NeighbourList(state, potential.r_max, 0.5)
    force_field = ForceField(potential, neighbours, neighbours.build(state), stress=False)
    start = maxwell_boltzmann_velocities(state, 300.0, 5)
    md = nve_init(start, force_field, timestep_fs=2.0)
    for _ in range(40):
        md = nve_step(md, force_field)
    md = replace(md, state=replace(md.state, velocities=-md.state.velocities))
    for _ in range(40):
        md = nve_step(md, force_field)
    back = (md.state.positions - start.positions).abs().max().item()
    assert back < 1e-8, back
    assert np.allclose(-md.state.velocities.numpy(), start.velocities.numpy(), atol=1e-10)


def test_the_thermostat_noise_is_independent_of_the_initial_velocities(demo):
    """The velocities drawn at the start and Langevin's noise come from one stream: with two
    generators seeded alike, the first noise repeated the velocities' draw (at 1/ps, 12% more
    kinetic energy on the first step). At a friction so high that one step replaces the
    velocities by noise, they must be uncorrelated with the drawn ones."""
    settings = RunSettings(
        ensemble=ensemble("nvt", temperature_K=300.0, friction_per_ps=1e6),
        steps=1,
        timestep_fs=2.0,
        seed=3,
        schedule=OutputSchedule(trajectory_every=0, thermo_every=0, restart_every=0),
        initial_temperature_K=300.0,
    )
    after = Simulation(demo, [crystal()], settings).run().structures[0].get_velocities()
    drawn = maxwell_boltzmann_velocities(State.from_atoms(crystal()), 300.0, 3).velocities
    correlation = np.corrcoef(after.ravel(), drawn.numpy().ravel())[0, 1]
    assert abs(correlation) < 0.4, correlation  # 96 components: about 0.1 by chance; was 0.99
