"""Thermostats sample the canonical kinetic energy; the barostat holds the target pressure.

Each test runs one batch of many small independent crystals (the Lennard-Jones potential
of test_integrators.py), half of them at one temperature and half at another, so the batch
gives the statistics quickly and checks that per-system targets reach the right atoms. Error
bars come from the spread between systems, which are independent, so they include the time
correlation of each trajectory. Every run is seeded: the tests are deterministic.
"""

from __future__ import annotations

import ase.units
import pytest
import torch
from helpers.lennard_jones import LennardJones, batch, crystal, run

from fastmace.dynamics.integrators import (
    csvr_init,
    csvr_step,
    langevin_init,
    langevin_step,
    nose_hoover_chain_init,
    nose_hoover_chain_step,
    npt_init,
    npt_step,
)
from fastmace.dynamics.integrators.common import cell_volume

# Small tensors: one thread each avoids oversubscribing a busy 2-core machine.
pytestmark = pytest.mark.usefixtures("one_thread")

N_SYSTEMS = 32  # 32 atoms each: N_f = 93, so K/<K> has a relative spread of sqrt(2/93) = 15%
TEMPERATURES_K = [20.0] * (N_SYSTEMS // 2) + [40.0] * (N_SYSTEMS // 2)  # melting is near 70 K
TIMESTEP_FS = 8.0  # a vibration period is about 50 steps
EQUILIBRATION_STEPS = 200
SAMPLED_STEPS = 1000


def _crystals(n_systems: int, temperatures: list[float], seed: int):
    """Crystals at their lattice sites with velocities at twice the temperature: equipartition
    then halves the kinetic energy, so they start close to equilibrium."""
    structures = [crystal(2, rattle=0.03, seed=seed + index) for index in range(n_systems)]
    return batch(structures, [2 * temperature for temperature in temperatures], seed=seed)


def _pressure_and_temperature(md) -> tuple[torch.Tensor, torch.Tensor]:
    """(S, 3, 3) pressure tensor in GPa and (S,) temperature in K, from ASE's constants and
    the potential's stress (independent of the integrators' own helpers)."""
    state = md.state
    v, masses = state.velocities, state.masses[:, None, None]
    per_atom = masses * v[:, :, None] * v[:, None, :] / ase.units.fs**2  # eV
    kinetic = torch.zeros(state.n_systems, 3, 3, dtype=torch.float64)
    kinetic = kinetic.index_add_(0, state.system, per_atom)
    volume = torch.linalg.det(state.cell).abs()
    dof = 3.0 * state.atoms_per_system().to(torch.float64) - 3.0
    temperature = kinetic.diagonal(dim1=1, dim2=2).sum(dim=1) / (dof * ase.units.kB)
    return (kinetic / volume[:, None, None] - md.stress) / ase.units.GPa, temperature


def _mean_and_error(per_system: torch.Tensor) -> tuple[float, float]:
    """Mean over independent systems and its standard error."""
    return float(per_system.mean()), float(per_system.std() / per_system.numel() ** 0.5)


@pytest.mark.parametrize("thermostat", ["langevin", "csvr", "nose-hoover-chain"])
def test_thermostats_give_the_canonical_kinetic_energy_distribution(thermostat):
    """<K> = N_f kT/2 and var K = N_f (kT)²/2 for every system, within statistical error.

    Measured as x = K / (N_f kT/2): its mean must be 1 and ``(x - 1)² N_f/2`` must average to 1.
    A wrong number of degrees of freedom shifts the mean by 3%, about 10 error bars; a
    thermostat that suppresses fluctuations (Berendsen) fails the variance outright.
    """
    state = _crystals(N_SYSTEMS, TEMPERATURES_K, seed=100)
    lj = LennardJones(state.system)
    common = {"timestep_fs": TIMESTEP_FS, "temperature_K": TEMPERATURES_K}
    if thermostat == "langevin":
        md = langevin_init(state, lj, **common, friction_per_ps=20.0, rng=1)
        step = langevin_step
    elif thermostat == "csvr":
        md = csvr_init(state, lj, **common, tau_fs=50.0, rng=2)
        step = csvr_step
    else:
        md = nose_hoover_chain_init(state, lj, **common, tau_fs=50.0, chain_length=3)
        step = nose_hoover_chain_step
    md, _ = run(md, step, lj, EQUILIBRATION_STEPS)
    md, kinetic = run(md, step, lj, SAMPLED_STEPS, every=2, observe=lambda m: m.kinetic_energy())
    # expected values from the structures and ASE's k_B, not from the integrator's own numbers
    dof = 3.0 * state.atoms_per_system().to(torch.float64) - 3.0
    kT = ase.units.kB * torch.tensor(TEMPERATURES_K, dtype=torch.float64)
    x = torch.stack(kinetic) / (dof * kT / 2)  # (samples, systems)
    mean, mean_error = _mean_and_error(x.mean(dim=0))
    variance, variance_error = _mean_and_error(((x - 1) ** 2).mean(dim=0) * dof / 2)
    assert mean_error < 0.004 and variance_error < 0.05  # enough samples to mean something
    assert abs(mean - 1) < 5 * mean_error + 0.003  # 0.3%: the timestep's own bias
    assert abs(variance - 1) < 5 * variance_error
    # per-system targets: each half of the batch sits at its own temperature
    temperatures = (2 * torch.stack(kinetic) / (dof * ase.units.kB)).mean(dim=0)
    assert float(temperatures[: N_SYSTEMS // 2].mean()) == pytest.approx(20.0, rel=0.03)
    assert float(temperatures[N_SYSTEMS // 2 :].mean()) == pytest.approx(40.0, rel=0.03)


@pytest.mark.parametrize("cell_mode", ["isotropic", "per_axis", "full"])
def test_npt_holds_the_target_pressure(cell_mode):
    """The mean instantaneous pressure tensor is the target (hydrostatic: P_0 on the diagonal,
    zero off it, for the components the mode controls) within 5 error bars, after the
    crystals, which start above 0.4 GPa, have expanded; the temperature holds too.

    The barostat's compressibility is close to the crystal's (bulk modulus about 10 GPa), so
    the volume relaxes within a few barostat times (200 fs) of the 1.6 ps equilibration."""
    n_systems, temperature_K, target_GPa = 16, [20.0] * 8 + [40.0] * 8, 0.2
    state = _crystals(n_systems, temperature_K, seed=200)
    lj = LennardJones(state.system)
    md = npt_init(
        state, lj, timestep_fs=TIMESTEP_FS, temperature_K=temperature_K,
        pressure_GPa=target_GPa, thermostat_tau_fs=50.0, barostat_tau_fs=200.0,
        compressibility_per_GPa=0.1, cell_mode=cell_mode, rng=3,
    )  # fmt: skip
    start_volume = cell_volume(md.state.cell)
    start_pressure = _pressure_and_temperature(md)[0].diagonal(dim1=1, dim2=2).mean()
    md, _ = run(md, npt_step, lj, EQUILIBRATION_STEPS)

    def observe(m):
        return *_pressure_and_temperature(m), torch.linalg.det(m.state.cell).abs()

    md, samples = run(md, npt_step, lj, SAMPLED_STEPS, every=2, observe=observe)
    means = [torch.stack(series).mean(dim=0) for series in zip(*samples, strict=True)]
    pressure, temperature, volume = means  # (systems, 3, 3) GPa, (systems,) K and Å^3
    assert float(start_pressure) > 0.4  # far from the target at the start

    if cell_mode == "isotropic":
        controlled = {"trace/3": pressure.diagonal(dim1=1, dim2=2).mean(dim=1)}
    else:
        controlled = {f"P{'xyz'[a]}{'xyz'[a]}": pressure[:, a, a] for a in range(3)}
    if cell_mode == "full":
        shear = [(0, 1), (1, 2), (0, 2)]
        controlled |= {f"P{'xyz'[a]}{'xyz'[b]}": pressure[:, a, b] for a, b in shear}
    for name, values in controlled.items():
        mean, error = _mean_and_error(values)
        expected = 0.0 if name in ("Pxy", "Pyz", "Pxz") else target_GPa
        assert error < 0.01, name
        assert abs(mean - expected) < 5 * error + 0.002, (name, mean, error)
    assert bool(torch.all(volume > start_volume * 1.02))  # expanded by about 3.5%
    assert float(temperature[:8].mean()) == pytest.approx(20.0, rel=0.03)
    assert float(temperature[8:].mean()) == pytest.approx(40.0, rel=0.03)
    if cell_mode != "full":  # a cubic cell scaled along its axes stays orthorhombic
        off_diagonal = md.state.cell - torch.diag_embed(md.state.cell.diagonal(dim1=1, dim2=2))
        assert float(off_diagonal.abs().max()) < 1e-12
