"""Constant pressure and temperature (NPT): stochastic cell rescaling with a CSVR thermostat.

Bernetti and Bussi's barostat (J. Chem. Phys. 153, 114107, 2020; anisotropic forms after Del
Tatto et al., Appl. Sci. 12, 1139, 2022) with cell modes ``"isotropic"``, ``"per_axis"`` and
``"full"``. A step: CSVR dt/2, half kick, drift, cell rescaling, forces, half kick, CSVR dt/2.
The equations, the modes and what is exact: docs/design/integrators.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

import torch

from fastmace.dynamics.integrators.common import (
    ComputeFn,
    MDState,
    cell_volume,
    drift,
    evaluate,
    half_kick,
    initial_md_state,
    kinetic_tensor,
    remove_com_momentum,
    with_velocities,
)
from fastmace.dynamics.integrators.csvr import check_can_rescale, rescale_velocities
from fastmace.dynamics.integrators.streams import RandomStreams, Seed, random_streams
from fastmace.dynamics.integrators.units import (
    EV_PER_A3_PER_BAR,
    EV_PER_A3_PER_GPA,
    KB_EV_PER_K,
    per_gpa_to_a3_per_ev,
)
from fastmace.dynamics.integrators.validation import (
    PerSystem,
    check_periodic,
    check_thermostatted,
    check_timestep,
    per_system_tensor,
)
from fastmace.dynamics.state import State
from fastmace.ensemble_catalog import (
    BAROSTAT_TAU,
    CELL_MODE,
    CELL_MODES,
    COMPRESSIBILITY,
    THERMOSTAT_TAU,
)

CellMode = Literal["isotropic", "per_axis", "full"]


@dataclass
class NPTState(MDState):
    """Stochastic cell rescaling plus CSVR: targets per system and the random streams.

    Attributes:
        kT: (S,) target temperature times k_B, in eV.
        thermostat_tau: (S,) CSVR time constant in fs.
        pressure: (S,) target pressure in eV/Å^3.
        barostat_tau: (S,) barostat time constant τ_p in fs.
        compressibility: (S,) the barostat's β in Å^3/eV.
        cell_mode: "isotropic", "per_axis" or "full" (see the module's docstring).
        streams: the random generators, one per system (advanced in place by every step).
        thermostat_energy: (S,) energy in eV taken out by the thermostat so far.
    """

    kT: torch.Tensor
    thermostat_tau: torch.Tensor
    pressure: torch.Tensor
    barostat_tau: torch.Tensor
    compressibility: torch.Tensor
    cell_mode: CellMode
    streams: RandomStreams
    thermostat_energy: torch.Tensor

    def pressure_tensor(self) -> torch.Tensor:
        """(S, 3, 3) instantaneous pressure tensor in eV/Å^3: ``Σ m v⊗v / V - stress``."""
        return pressure_tensor(self.state, self.stress)


def npt_init(
    state: State,
    compute: ComputeFn,
    *,
    timestep_fs: float,
    temperature_K: PerSystem,
    pressure_GPa: PerSystem | None = None,
    pressure_bar: PerSystem | None = None,
    thermostat_tau_fs: PerSystem = THERMOSTAT_TAU.default,
    barostat_tau_fs: PerSystem = BAROSTAT_TAU.default,
    compressibility_per_GPa: PerSystem = COMPRESSIBILITY.default,
    cell_mode: CellMode = CELL_MODE.default,
    rng: Seed | RandomStreams,
) -> NPTState:
    """Start NPT dynamics; removes each system's COM momentum, computes forces and stress.

    Args:
        state: the batch, every system periodic in x, y and z; not modified. Velocities must
            not be all zero in a system (use ``maxwell_boltzmann_velocities``).
        compute: the potential; it must return the stress.
        timestep_fs: timestep in fs, in (0, 10].
        temperature_K: target temperature in K (>= 0), one or one per system.
        pressure_GPa: target pressure in GPa; or give ``pressure_bar`` instead (exactly one).
        pressure_bar: target pressure in bar.
        thermostat_tau_fs: CSVR time constant in fs (> 0).
        barostat_tau_fs: barostat time constant τ_p in fs, at least the timestep; 1000 fs
            is a common choice.
        compressibility_per_GPa: the barostat's β in 1/GPa (> 0). The default, 0.01/GPa, is
            that of a metal or oxide; water is about 0.45/GPa. A β larger than the material's
            shortens the volume's relaxation time below τ_p and, far too large, destabilises.
        cell_mode: "isotropic", "per_axis" or "full".
        rng: an int seed (system ``s`` draws from ``seed + s``), one seed or generator per
            system, or one torch.Generator for the batch (integrators/streams.py).
    """
    check_thermostatted(state, "NPT")
    check_periodic(state, "NPT")
    if cell_mode not in CELL_MODES:
        raise ValueError(f"cell_mode must be one of {CELL_MODES}; got {cell_mode!r}")
    pressure = _target_pressure(state, pressure_GPa, pressure_bar)
    kT = KB_EV_PER_K * per_system_tensor(temperature_K, state, "temperature_K", "K", minimum=0.0)
    thermostat_tau = per_system_tensor(
        thermostat_tau_fs, state, "thermostat_tau_fs", "fs", strictly_above=0.0
    )
    barostat_tau = per_system_tensor(
        barostat_tau_fs, state, "barostat_tau_fs", "fs", minimum=check_timestep(timestep_fs)
    )
    beta = per_system_tensor(
        compressibility_per_GPa, state, "compressibility_per_GPa", "1/GPa", strictly_above=0.0
    )
    streams = random_streams(rng, state)
    md = initial_md_state(state, compute, timestep_fs, need_stress=True)
    check_can_rescale(md, kT)
    return NPTState(
        **vars(md),
        kT=kT,
        thermostat_tau=thermostat_tau,
        pressure=pressure,
        barostat_tau=barostat_tau,
        compressibility=per_gpa_to_a3_per_ev(beta),
        cell_mode=cell_mode,
        streams=streams,
        thermostat_energy=torch.zeros_like(kT),
    )


def npt_step(md: NPTState, compute: ComputeFn) -> NPTState:
    """One step: CSVR dt/2, half kick, drift, cell rescaling, forces, half kick, CSVR dt/2."""
    dt, masses = md.timestep, md.state.masses
    strain = cell_strain(md)  # from the pressure at the start of the step
    velocities, heat_before = _thermostat(md, md.state, dt / 2)
    velocities = half_kick(velocities, md.forces, masses, dt)
    positions = drift(md.state.positions, velocities, dt)
    state = deform(replace(md.state, positions=positions, velocities=velocities), strain)
    md = evaluate(md, state, compute)
    md = with_velocities(md, half_kick(md.state.velocities, md.forces, masses, dt))
    state = remove_com_momentum(md.state, md.system_mass)
    velocities, heat_after = _thermostat(md, state, dt / 2)
    md = with_velocities(md, velocities)
    return replace(md, thermostat_energy=md.thermostat_energy + heat_before + heat_after)


def pressure_tensor(state: State, stress: torch.Tensor) -> torch.Tensor:
    """(S, 3, 3) instantaneous pressure tensor in eV/Å^3, kinetic part included."""
    volume = cell_volume(state.cell)[:, None, None]
    return kinetic_tensor(state) / volume - stress


def cell_strain(md: NPTState) -> torch.Tensor:
    """(S, 3, 3) symmetric strain increment ε of one step of stochastic cell rescaling."""
    state, dt = md.state, md.timestep
    volume = cell_volume(state.cell)
    # Bernetti and Bussi's kT/V on the diagonal: the kinetic pressure counts the 3N - 3 degrees
    # of freedom left with the COM momentum removed, while the positions scale as V^N; without
    # it the volume samples V^(N-1) exp(-PV/kT) (an ideal gas: <V> = N kT/P, not (N + 1) kT/P).
    eye = torch.eye(3, dtype=torch.float64, device=state.device)
    pressure = pressure_tensor(state, md.stress) + (md.kT / volume)[:, None, None] * eye
    # per component: relaxation with beta/3, noise of variance 2 kT (beta/3) dt / (V tau_p)
    rate = md.compressibility * dt / (3.0 * md.barostat_tau)
    noise = torch.sqrt(2.0 * md.kT * rate / volume)
    options = {"dtype": torch.float64, "device": state.device}
    if md.cell_mode == "isotropic":
        scalar = pressure.diagonal(dim1=1, dim2=2).mean(dim=1)
        xi = md.streams.per_system(**options)
        strain = rate * (scalar - md.pressure) + noise / math.sqrt(3.0) * xi
        return strain[:, None, None] * eye
    if md.cell_mode == "per_axis":
        diagonal = pressure.diagonal(dim1=1, dim2=2)
        xi = md.streams.per_system(3, **options)
        strain = rate[:, None] * (diagonal - md.pressure[:, None]) + noise[:, None] * xi
        return torch.diag_embed(strain)
    xi = md.streams.per_system(3, 3, **options)
    symmetric_noise = 0.5 * (xi + xi.transpose(1, 2))
    symmetric_pressure = 0.5 * (pressure + pressure.transpose(1, 2))
    target = md.pressure[:, None, None] * eye
    return rate[:, None, None] * (symmetric_pressure - target) + noise[:, None, None] * (
        symmetric_noise
    )


def deform(state: State, strain: torch.Tensor) -> State:
    """Positions and cells multiplied by ``exp(strain)``, velocities by its inverse."""
    scale, inverse = _expm_small(strain), _expm_small(-strain)
    system = state.system
    return replace(
        state,
        positions=torch.einsum("ni,nij->nj", state.positions, scale[system]),
        velocities=torch.einsum("ni,nij->nj", state.velocities, inverse[system]),
        cell=state.cell @ scale,
    )


def _expm_small(strain: torch.Tensor) -> torch.Tensor:
    """exp of (S, 3, 3) matrices of small norm (per-step strains, ~1e-4) by its Taylor series
    to fourth order: error below 1e-18 there, and plain tensor ops (capturable, no sync)."""
    eye = torch.eye(3, dtype=strain.dtype, device=strain.device).expand_as(strain)
    result, term = eye + strain, strain
    for order in (2, 3, 4):
        term = term @ strain / order
        result = result + term
    return result


def _thermostat(md: NPTState, state: State, duration: float) -> tuple[torch.Tensor, torch.Tensor]:
    return rescale_velocities(
        state, md.kT, md.thermostat_tau, md.degrees_of_freedom, duration, md.streams
    )


def _target_pressure(
    state: State, pressure_GPa: PerSystem | None, pressure_bar: PerSystem | None
) -> torch.Tensor:
    """(S,) target pressure in eV/Å^3 from exactly one of the two units."""
    if (pressure_GPa is None) == (pressure_bar is None):
        raise ValueError(
            "give the target pressure as exactly one of pressure_GPa or pressure_bar "
            f"(got pressure_GPa={pressure_GPa!r}, pressure_bar={pressure_bar!r})"
        )
    if pressure_GPa is not None:
        return EV_PER_A3_PER_GPA * per_system_tensor(pressure_GPa, state, "pressure_GPa", "GPa")
    return EV_PER_A3_PER_BAR * per_system_tensor(pressure_bar, state, "pressure_bar", "bar")
