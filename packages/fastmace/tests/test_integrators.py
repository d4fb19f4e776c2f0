"""Integrators: units, input checks, the test potential itself, NVE and batching.

The physics tests run a real potential, Lennard-Jones with a shifted-force cutoff between all
pairs of atoms of each system under the minimum-image convention, on small fcc crystals of 32
atoms; its forces and stress are checked against finite differences here. The thermostat and
barostat distributions are in test_integrators_ensembles.py.
"""

from __future__ import annotations

import math
from dataclasses import replace

import ase.units
import numpy as np
import pytest
import torch
from helpers.lennard_jones import (
    LennardJones,
    batch,
    crystal,
    run,
)

from fastmace.dynamics.integrators import (
    ForceResult,
    RandomStreams,
    csvr_init,
    csvr_step,
    langevin_init,
    langevin_step,
    maxwell_boltzmann_velocities,
    nose_hoover_chain_init,
    nose_hoover_chain_step,
    npt_init,
    npt_step,
    nve_init,
    nve_step,
    units,
)
from fastmace.dynamics.integrators.csvr import resample_kinetic_energy
from fastmace.dynamics.integrators.npt import cell_strain, deform
from fastmace.dynamics.state import State

# Small tensors: one thread each avoids oversubscribing a busy 2-core machine.
pytestmark = pytest.mark.usefixtures("one_thread")


# --- units and the test potential ------------------------------------------------------------


def test_units_agree_with_ase():
    assert pytest.approx(ase.units.kB, rel=1e-14) == units.KB_EV_PER_K
    assert pytest.approx(1 / ase.units.fs**2, rel=1e-14) == units.EV_PER_AMU_A2_PER_FS2
    assert pytest.approx(ase.units.GPa, rel=1e-14) == units.EV_PER_A3_PER_GPA
    assert pytest.approx(ase.units.bar, rel=1e-14) == units.EV_PER_A3_PER_BAR
    assert pytest.approx(1000.0) == units.FS_PER_PS
    assert units.per_gpa_to_a3_per_ev(1.0) * ase.units.GPa == pytest.approx(1.0, rel=1e-14)


def test_lennard_jones_forces_are_minus_the_energy_gradient():
    state = State.from_atoms([crystal(2, rattle=0.15, seed=1), crystal(2, rattle=0.15, seed=2)])
    lj = LennardJones(state.system)
    forces = lj(state).forces
    step = 1e-5
    for atom, axis in [(0, 0), (5, 1), (31, 2), (40, 0), (63, 2)]:
        shifted = []
        for sign in (1, -1):
            positions = state.positions.clone()
            positions[atom, axis] += sign * step
            shifted.append(lj(replace(state, positions=positions)).energy.sum())
        gradient = float(shifted[0] - shifted[1]) / (2 * step)
        assert -gradient == pytest.approx(float(forces[atom, axis]), rel=1e-6, abs=1e-9)
    assert forces.abs().max() > 0.05  # the rattled crystal is not at rest


def test_lennard_jones_stress_is_the_strain_derivative_of_the_energy():
    atoms = crystal(2, rattle=0.15, seed=3)
    atoms.set_cell(atoms.cell[:] @ np.array([[1.0, 0.02, 0.0], [0.0, 0.98, 0.01], [0, 0, 1.01]]))
    state = State.from_atoms(atoms)
    lj = LennardJones(state.system)
    stress, volume = lj(state).stress[0], abs(float(torch.linalg.det(state.cell[0])))
    step = 1e-6
    for a, b in [(0, 0), (1, 1), (2, 2), (0, 1), (1, 2), (0, 2)]:
        strain = torch.zeros(3, 3, dtype=torch.float64)
        strain[a, b] = strain[b, a] = step / 2 if a != b else step
        energies = []
        for sign in (1, -1):
            deformation = torch.eye(3, dtype=torch.float64) + sign * strain
            strained = replace(
                state, positions=state.positions @ deformation, cell=state.cell @ deformation
            )
            energies.append(lj(strained).energy[0])
        derivative = float(energies[0] - energies[1]) / (2 * step) / volume
        # an off-diagonal strain moves both ab and ba by step/2: dE/dstep is stress[a, b] V
        assert derivative == pytest.approx(float(stress[a, b]), rel=1e-5, abs=1e-9)
    assert stress.diagonal().abs().min() > 1e-4  # far from zero stress: a real check


# --- NVE -------------------------------------------------------------------------------------


def test_nve_conserves_energy_over_thousands_of_steps():
    """Velocity Verlet at 5 fs for 15 ps (3000 steps) on the crystal at 40 K: the total energy stays
    within 1e-5 eV/atom of its start and drifts by less than 1e-7 eV/atom/ps (measured:
    2.3e-6 eV/atom and 1e-8 eV/atom/ps)."""
    state = batch([crystal(2, rattle=0.05, seed=s) for s in range(4)], 40.0, seed=4)
    lj = LennardJones(state.system)
    md = nve_init(state, lj, timestep_fs=5.0)
    start = md.conserved_energy()
    md, energies = run(md, nve_step, lj, 3000, every=10, observe=lambda m: m.conserved_energy())
    per_atom = (torch.stack(energies) - start) / 32  # (samples, systems) eV/atom
    time_ps = torch.arange(1, len(energies) + 1, dtype=torch.float64) * 10 * 5.0 / 1000
    slope = ((time_ps - time_ps.mean())[:, None] * per_atom).sum(0) / (
        (time_ps - time_ps.mean()) ** 2
    ).sum()
    assert per_atom.abs().max() < 1e-5
    assert slope.abs().max() < 1e-7
    assert md.temperature().min() > 10.0  # it moved: half the kinetic energy went potential


def test_nve_is_time_reversible():
    state = batch([crystal(2, rattle=0.05, seed=5)], 40.0, seed=5)
    lj = LennardJones(state.system)
    md = nve_init(state, lj, timestep_fs=5.0)
    start = md.state
    md, _ = run(md, nve_step, lj, 400)
    assert (md.state.positions - start.positions).abs().max() > 0.05
    md = replace(md, state=replace(md.state, velocities=-md.state.velocities))
    md, _ = run(md, nve_step, lj, 400)
    # round-off only (measured 1e-14 Å after 2 x 400 steps)
    assert torch.allclose(md.state.positions, start.positions, rtol=0, atol=1e-12)
    assert torch.allclose(-md.state.velocities, start.velocities, rtol=0, atol=1e-14)


def test_init_removes_centre_of_mass_momentum_and_nve_keeps_it_zero():
    state = batch([crystal(2, rattle=0.05, seed=6)] * 2, 40.0)
    state = replace(state, velocities=state.velocities + torch.tensor([0.01, -0.02, 0.005]))
    lj = LennardJones(state.system)
    md = nve_init(state, lj, timestep_fs=5.0)
    assert not torch.equal(state.velocities, md.state.velocities)  # the input is untouched
    md, _ = run(md, nve_step, lj, 50)
    momentum = torch.zeros(2, 3, dtype=torch.float64).index_add_(
        0, md.state.system, md.state.masses[:, None] * md.state.velocities
    )
    assert momentum.abs().max() < 1e-12
    assert md.degrees_of_freedom.tolist() == [93.0, 93.0]


def test_maxwell_boltzmann_velocities_match_the_temperature():
    state = State.from_atoms([crystal(3)] * 4)  # 4 x 108 atoms
    hot = maxwell_boltzmann_velocities(state, [100.0, 100.0, 300.0, 300.0], rng=7)
    md = nve_init(hot, LennardJones(hot.system), timestep_fs=1.0)
    temperature = md.temperature()
    # each system's 2K/(dof kT) is a chi-square mean of 321 dof: relative sd 0.079
    assert float(temperature[:2].mean()) == pytest.approx(100.0, rel=0.2)
    assert float(temperature[2:].mean()) == pytest.approx(300.0, rel=0.2)
    again = maxwell_boltzmann_velocities(state, [100.0, 100.0, 300.0, 300.0], rng=7)
    assert torch.equal(hot.velocities, again.velocities)


# --- batching ---------------------------------------------------------------------------------


def _two_different_systems():
    small = crystal(2, rattle=0.05, seed=8)
    del small[[3, 17, 30]]  # 29 atoms, with vacancies
    return [crystal(2, rattle=0.05, seed=9), small]


@pytest.mark.parametrize(
    ("init", "step", "options"),
    [
        (nve_init, nve_step, {}),
        (nose_hoover_chain_init, nose_hoover_chain_step, {"temperature_K": [30.0, 60.0]}),
    ],
    ids=["nve", "nose-hoover-chain"],
)
def test_a_batch_evolves_as_its_systems_alone(init, step, options):
    """Deterministic integrators: each system of a batch follows the trajectory it follows
    alone (systems of different sizes and, for the chain, different temperatures)."""
    structures = _two_different_systems()
    together = batch(structures, [30.0, 60.0], seed=10)
    lj = LennardJones(together.system)
    md = init(together, lj, timestep_fs=5.0, **options)
    md, _ = run(md, step, lj, 200)
    counts = [len(structures[0]), len(structures[1])]
    for index, (velocities, temperature) in enumerate(
        zip(together.velocities.split(counts), [30.0, 60.0], strict=True)
    ):
        alone = replace(State.from_atoms(structures[index]), velocities=velocities.clone())
        own = {key: temperature for key in options}
        md_alone = init(alone, LennardJones(alone.system), timestep_fs=5.0, **own)
        md_alone, _ = run(md_alone, step, LennardJones(alone.system), 200)
        rows = md.state.system == index
        assert torch.allclose(md.state.positions[rows], md_alone.state.positions, atol=1e-10)
        assert torch.allclose(md.state.velocities[rows], md_alone.state.velocities, atol=1e-12)
        assert torch.allclose(md.energy[index], md_alone.energy[0], atol=1e-10)


def test_stochastic_runs_are_reproducible_and_leave_the_global_generator_alone():
    state = batch([crystal(2, rattle=0.05, seed=11)] * 2, 40.0)
    lj = LennardJones(state.system)
    global_state = torch.random.get_rng_state()

    def trajectory(init, step, seed, **options):
        md = init(state, lj, timestep_fs=5.0, temperature_K=40.0, rng=seed, **options)
        return run(md, step, lj, 20)[0].state.positions

    for init, step in [(langevin_init, langevin_step), (csvr_init, csvr_step)]:
        first, second = trajectory(init, step, 12), trajectory(init, step, 12)
        assert torch.equal(first, second)
        assert not torch.allclose(first, trajectory(init, step, 13), atol=1e-8)
    # An int seed gives system s the stream of seed + s; generators may be given the same way.
    by_generators = [torch.Generator().manual_seed(12), torch.Generator().manual_seed(13)]
    by_generator = trajectory(langevin_init, langevin_step, by_generators)
    assert torch.equal(by_generator, trajectory(langevin_init, langevin_step, 12))
    # One generator for the whole batch is one stream: different numbers per system.
    shared = trajectory(langevin_init, langevin_step, torch.Generator().manual_seed(12))
    assert not torch.allclose(shared, by_generator, atol=1e-8)
    assert torch.equal(torch.random.get_rng_state(), global_state)


@pytest.mark.parametrize("which", ["langevin", "csvr", "npt"])
def test_a_system_in_a_batch_follows_its_trajectory_alone(which):
    # Each system draws from its own stream (seed + its index), so its noise, and with it its
    # trajectory, does not depend on what else is in the batch.
    structures = [crystal(2, rattle=0.05, seed=11), crystal(2, rattle=0.05, seed=12)]
    together = batch(structures, 40.0)
    options = {"timestep_fs": 5.0, "temperature_K": 40.0}
    init, step = {
        "langevin": (langevin_init, langevin_step),
        "csvr": (csvr_init, csvr_step),
        "npt": (npt_init, npt_step),
    }[which]
    if which == "npt":
        options |= {"pressure_GPa": 0.0, "barostat_tau_fs": 500.0, "cell_mode": "per_axis"}
    lj = LennardJones(together.system)
    end = run(init(together, lj, rng=20, **options), step, lj, 30)[0].state
    for index, atoms in enumerate(structures):
        alone = batch([atoms], 40.0, seed=index)  # its velocities too: seed 0 + index
        lj_alone = LennardJones(alone.system)
        alone_end = run(init(alone, lj_alone, rng=20 + index, **options), step, lj_alone, 30)[0]
        rows = together.system == index
        torch.testing.assert_close(
            end.positions[rows], alone_end.state.positions, rtol=0, atol=1e-10
        )


@pytest.mark.parametrize("which", ["langevin", "csvr"])
def test_without_coupling_the_thermostats_are_velocity_verlet(which):
    state = batch([crystal(2, rattle=0.05, seed=14)] * 2, 40.0)
    lj = LennardJones(state.system)
    reference, _ = run(nve_init(state, lj, timestep_fs=5.0), nve_step, lj, 100)
    if which == "langevin":
        md = langevin_init(
            state, lj, timestep_fs=5.0, temperature_K=40.0, friction_per_ps=0.0, rng=1
        )
        md, _ = run(md, langevin_step, lj, 100)
        tolerance = 1e-10
    else:
        md = csvr_init(state, lj, timestep_fs=5.0, temperature_K=40.0, tau_fs=1e15, rng=1)
        md, _ = run(md, csvr_step, lj, 100)
        tolerance = 1e-5  # the noise is of order sqrt(dt/tau)
    assert torch.allclose(md.state.positions, reference.state.positions, atol=tolerance)


# --- conserved quantities of the thermostatted integrators ---------------------------------


@pytest.mark.parametrize(
    ("chain_length", "order", "substeps"), [(1, 1, 1), (3, 3, 1), (4, 5, 2), (2, 7, 1)]
)
def test_nose_hoover_chain_conserves_its_extended_energy(chain_length, order, substeps):
    state = batch([crystal(2, rattle=0.05, seed=15)] * 2, [20.0, 80.0])
    lj = LennardJones(state.system)
    md = nose_hoover_chain_init(
        state, lj, timestep_fs=5.0, temperature_K=[50.0, 30.0], tau_fs=100.0,
        chain_length=chain_length, n_substeps=substeps, suzuki_yoshida_order=order,
    )  # fmt: skip
    start = md.conserved_energy()
    md, energies = run(
        md, nose_hoover_chain_step, lj, 400, every=10, observe=lambda m: m.conserved_energy()
    )
    change = (torch.stack(energies) - start).abs().max(dim=0).values / 32
    assert change.max() < 3e-5  # eV/atom (measured below 8e-6)
    assert md.chain_positions.abs().max() > 0.01  # the chain acted
    assert md.chain_velocities.shape == (2, chain_length)


@pytest.mark.parametrize("which", ["langevin", "csvr"])
def test_energy_given_to_the_bath_is_accounted_for(which):
    """Total energy plus the bath's share is conserved (Bussi's effective energy)."""
    state = batch([crystal(2, rattle=0.05, seed=16)] * 2, 20.0)
    lj = LennardJones(state.system)
    if which == "langevin":
        md = langevin_init(
            state, lj, timestep_fs=5.0, temperature_K=60.0, friction_per_ps=5.0, rng=2
        )
        step = langevin_step
    else:
        md = csvr_init(state, lj, timestep_fs=5.0, temperature_K=60.0, tau_fs=100.0, rng=2)
        step = csvr_step
    start = md.conserved_energy()
    md, energies = run(md, step, lj, 400, every=10, observe=lambda m: m.conserved_energy())
    assert ((torch.stack(energies) - start).abs().max() / 32) < 3e-5  # measured 6e-6 eV/atom
    assert (md.thermostat_energy / 32).abs().min() > 1e-3  # the bath did heat the systems


# --- the pieces of the stochastic schemes ------------------------------------------------------


def test_csvr_kinetic_energy_update_leaves_the_canonical_distribution_invariant():
    """Bussi et al. (2007) Eq. (A7) maps a canonical kinetic energy to a canonical one, with
    correlation exp(-t/tau) between the two: checked on 200000 independent draws."""
    generator = torch.Generator().manual_seed(21)
    n, dof, kT = 200_000, 93.0, 0.003
    dofs = torch.full((n,), dof, dtype=torch.float64)
    kTs = torch.full((n,), kT, dtype=torch.float64)
    kinetic = kT * torch._standard_gamma(dofs / 2, generator=generator)  # canonical K
    for tau in (0.2, 1.0, 10.0):
        taus = torch.full((n,), tau, dtype=torch.float64)
        streams = RandomStreams((generator,), (1,) * n)  # n systems drawing from one stream
        new, _ = resample_kinetic_energy(kinetic, kTs, dofs, taus, 1.0, streams)
        x = new / (dof * kT / 2)
        assert float(x.mean()) == pytest.approx(1.0, abs=5 * (2 / dof / n) ** 0.5)
        assert float(((x - 1) ** 2).mean() * dof / 2) == pytest.approx(1.0, abs=0.02)
        correlation = float(torch.corrcoef(torch.stack([kinetic, new]))[0, 1])
        assert correlation == pytest.approx(math.exp(-1.0 / tau), abs=0.01)


def test_barostat_strain_follows_the_pressure_difference():
    """Without noise (kT = 0) one barostat step is the strain (beta dt / 3 tau_p)(P - P_0),
    with P the full pressure tensor, kinetic part included, computed here independently."""
    state = batch([crystal(2, rattle=0.05, seed=22), crystal(2, rattle=0.05, seed=23)], 40.0)
    lj = LennardJones(state.system)
    options = {"timestep_fs": 4.0, "temperature_K": 40.0, "barostat_tau_fs": 100.0}
    expected_rate = 0.1 / ase.units.GPa * 4.0 / (3 * 100.0)  # beta dt / (3 tau_p) in Å^3/eV
    for mode in ("isotropic", "per_axis", "full"):
        md = npt_init(
            state, lj, **options, pressure_bar=[1000.0, -2000.0], compressibility_per_GPa=0.1,
            cell_mode=mode, rng=0,
        )  # fmt: skip
        md = replace(md, kT=torch.zeros_like(md.kT))
        v = md.state.velocities
        kinetic = md.state.masses[:, None, None] * v[:, :, None] * v[:, None, :] / ase.units.fs**2
        kinetic = torch.stack([kinetic[md.state.system == s].sum(dim=0) for s in range(2)])
        volume = torch.linalg.det(md.state.cell).abs()[:, None, None]
        pressure = kinetic / volume - md.stress
        target = torch.tensor([1000.0, -2000.0], dtype=torch.float64) * ase.units.bar
        difference = pressure - target[:, None, None] * torch.eye(3, dtype=torch.float64)
        if mode == "isotropic":
            difference = difference.diagonal(dim1=1, dim2=2).mean(dim=1)[:, None, None]
            difference = difference * torch.eye(3, dtype=torch.float64)
        elif mode == "per_axis":
            difference = torch.diag_embed(difference.diagonal(dim1=1, dim2=2))
        strain = cell_strain(md)
        assert torch.allclose(strain, expected_rate * difference, rtol=1e-10, atol=1e-16)
        assert float(strain.abs().max()) > 1e-6


def test_cell_rescaling_keeps_fractional_coordinates_and_scaled_momenta():
    state = batch([crystal(2, rattle=0.05, seed=24)] * 2, 40.0)
    strain = torch.tensor([[1e-3, 2e-4, 0.0], [2e-4, -5e-4, 1e-4], [0.0, 1e-4, 3e-4]])
    strain = torch.stack([strain, -strain]).to(torch.float64)
    deformed = deform(state, strain)
    fractional = torch.linalg.solve(
        state.cell[state.system].transpose(1, 2), state.positions[:, :, None]
    )
    after = torch.linalg.solve(
        deformed.cell[state.system].transpose(1, 2), deformed.positions[:, :, None]
    )
    assert torch.allclose(fractional, after, atol=1e-13)
    # the momentum of the scaled coordinates, m v h^T, is unchanged
    momentum = torch.einsum("ni,nji->nj", state.velocities, state.cell[state.system])
    momentum_after = torch.einsum("ni,nji->nj", deformed.velocities, deformed.cell[state.system])
    assert torch.allclose(momentum, momentum_after, atol=1e-15)
    expected_volume = torch.linalg.det(state.cell) * torch.exp(
        strain.diagonal(dim1=1, dim2=2).sum(1)
    )
    assert torch.allclose(torch.linalg.det(deformed.cell), expected_volume, rtol=1e-12)


# --- input checks -----------------------------------------------------------------------------

_STATE = State.from_atoms(crystal(2, rattle=0.05, seed=17))
_LJ = LennardJones(_STATE.system)
_WARM = maxwell_boltzmann_velocities(_STATE, 40.0, rng=0)
_THERMOSTAT = {"timestep_fs": 1.0, "temperature_K": 300.0}
_INTEGRATORS = {
    "nve": (nve_init, {"timestep_fs": 1.0}),
    "langevin": (langevin_init, {**_THERMOSTAT, "rng": 0}),
    "csvr": (csvr_init, {**_THERMOSTAT, "rng": 0}),
    "nhc": (nose_hoover_chain_init, _THERMOSTAT),
    "npt": (npt_init, {**_THERMOSTAT, "pressure_GPa": 0.0, "rng": 0}),
}


def _slab() -> State:
    atoms = crystal(2, rattle=0.05, seed=17)
    atoms.pbc = [True, True, False]
    return maxwell_boltzmann_velocities(State.from_atoms(atoms), 40.0, rng=0)


def _without_stress(state: State) -> ForceResult:
    return replace(_LJ(state), stress=None)


@pytest.mark.parametrize(
    ("integrator", "changes", "error", "message"),
    [
        ("nve", {"timestep_fs": 0.0}, ValueError, r"timestep_fs must be in \(0, 10\] fs"),
        ("nve", {"timestep_fs": -1.0}, ValueError, "timestep_fs must be in"),
        ("nve", {"timestep_fs": 50.0}, ValueError, "not in ASE time units"),
        ("nve", {"timestep_fs": math.nan}, ValueError, "timestep_fs must be in"),
        ("nve", {"timestep_fs": "1"}, TypeError, "timestep_fs must be a number"),
        ("langevin", {"temperature_K": -5.0}, ValueError, "temperature_K must be >= 0 K; got -5 K"),
        ("langevin", {"friction_per_ps": -1.0}, ValueError, "friction_per_ps must be >= 0 1/ps"),
        ("langevin", {"temperature_K": [1.0, 2.0]}, ValueError, "one value or one per system"),
        ("langevin", {"temperature_K": math.inf}, ValueError, "temperature_K must be finite"),
        ("langevin", {"rng": 1.5}, TypeError, "rng must be an int seed, a torch.Generator"),
        ("csvr", {"tau_fs": 0.0}, ValueError, "tau_fs must be > 0 fs"),
        ("csvr", {"state": _STATE}, ValueError, "cannot heat a system at rest"),
        ("nhc", {"chain_length": 0}, ValueError, "chain_length must be an integer >= 1"),
        ("nhc", {"n_substeps": 0}, ValueError, "n_substeps must be an integer >= 1"),
        ("nhc", {"suzuki_yoshida_order": 2}, ValueError, "suzuki_yoshida_order must be one of"),
        ("nhc", {"temperature_K": 0.0}, ValueError, "temperature_K must be > 0 K"),
        ("nhc", {"timestep_fs": 2.0, "tau_fs": 1.0}, ValueError, "tau_fs must be >= 2 fs"),
        ("npt", {"state": _slab()}, ValueError, "periodic in x, y and z"),
        ("npt", {"pressure_GPa": None}, ValueError, "exactly one of pressure_GPa or pressure_bar"),
        ("npt", {"pressure_bar": 1.0}, ValueError, "exactly one of pressure_GPa or pressure_bar"),
        ("npt", {"compressibility_per_GPa": 0.0}, ValueError, "compressibility_per_GPa must be >"),
        ("npt", {"barostat_tau_fs": 0.5}, ValueError, "barostat_tau_fs must be >= 1 fs"),
        ("npt", {"cell_mode": "anisotropic"}, ValueError, "cell_mode must be one of"),
        ("npt", {"compute": _without_stress}, ValueError, "returned no stress"),
        ("langevin", {"state": State.from_atoms([crystal(1)[:1], crystal(1)])}, ValueError,
         "at least 2 atoms per system"),
    ],
)  # fmt: skip
def test_bad_inputs_are_refused_with_a_clear_message(integrator, changes, error, message):
    init, options = _INTEGRATORS[integrator]
    changes = dict(changes)
    state, compute = changes.pop("state", _WARM), changes.pop("compute", _LJ)
    options = {key: value for key, value in {**options, **changes}.items() if value is not None}
    with pytest.raises(error, match=message):
        init(state, compute, **options)


# --- CUDA graph capture (GPU machine) ----------------------------------------------------------

_CAPTURED = {
    "nve": (nve_init, nve_step, {}),
    "langevin": (langevin_init, langevin_step, {"temperature_K": 40.0, "friction_per_ps": 5.0}),
    "csvr": (csvr_init, csvr_step, {"temperature_K": 40.0}),
    "nhc": (nose_hoover_chain_init, nose_hoover_chain_step, {"temperature_K": 40.0}),
    "npt": (npt_init, npt_step, {"temperature_K": 40.0, "pressure_GPa": 0.2}),
    "npt-full": (npt_init, npt_step, {"temperature_K": 40.0, "pressure_GPa": 0.2,
                                      "cell_mode": "full"}),
}  # fmt: skip


def _tensors(md) -> dict[str, torch.Tensor]:
    """Every tensor of an MD state (its State's too), by name."""
    found = {f"state.{name}": getattr(md.state, name) for name in md.state.__dataclass_fields__}
    for name in md.__dataclass_fields__:
        value = getattr(md, name)
        if isinstance(value, torch.Tensor):
            found[name] = value
    return found


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("which", list(_CAPTURED))
def test_steps_run_without_host_sync_and_replay_in_a_cuda_graph(which):
    """A step never synchronises with the host (CUDA's sync debug mode raises if it does), and
    a block of steps captured in a CUDA graph replays as the same steps run eagerly; the
    random generator, registered with the graph, advances at every replay."""
    init, step, options = _CAPTURED[which]
    stochastic = init not in (nve_init, nose_hoover_chain_init)
    structures = [crystal(2, rattle=0.05, seed=s) for s in range(3)]
    state = batch(structures, 40.0).to("cuda")
    lj = LennardJones(state.system)

    def start():
        extra = {"rng": torch.Generator(device="cuda").manual_seed(5)} if stochastic else {}
        return init(state, lj, timestep_fs=4.0, **options, **extra)

    blocks = 4
    eager = start()
    torch.cuda.set_sync_debug_mode("error")
    try:
        ends = []
        for _ in range(2 * blocks):
            eager = step(eager, lj)
            ends.append(eager)
    finally:
        torch.cuda.set_sync_debug_mode("default")

    md = start()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside the capture, as CUDA graphs require
        step(md, lj)
    torch.cuda.current_stream().wait_stream(stream)
    md = start()  # the warm-up drew random numbers: start again
    graph = torch.cuda.CUDAGraph()
    if stochastic:
        for generator in md.streams.generators:
            graph.register_generator_state(generator)
    with torch.cuda.graph(graph):
        out = md
        for _ in range(blocks):
            out = step(out, lj)
    inputs, outputs = _tensors(md), _tensors(out)
    for block in range(2):
        graph.replay()
        torch.cuda.synchronize()
        expected = _tensors(ends[(block + 1) * blocks - 1])
        for name, tensor in outputs.items():
            if stochastic:  # the replayed noise need not be the eager noise: check sanity
                assert bool(torch.isfinite(tensor.double()).all()), name
            else:
                assert torch.allclose(tensor, expected[name], rtol=1e-12, atol=1e-12), name
        for name, tensor in inputs.items():
            tensor.copy_(outputs[name])
    if stochastic:  # the generator advanced: a third replay from the same input differs
        before = outputs["state.velocities"].clone()
        for name, tensor in inputs.items():
            tensor.copy_(_tensors(ends[blocks - 1])[name])
        graph.replay()
        first = outputs["state.velocities"].clone()
        for name, tensor in inputs.items():
            tensor.copy_(_tensors(ends[blocks - 1])[name])
        graph.replay()
        assert not torch.equal(first, outputs["state.velocities"])
        assert not torch.equal(before, first)
        temperature = out.temperature()
        assert bool(((temperature > 5) & (temperature < 200)).all())
