"""What every integrator shares: the potential's interface, the base MD state, per-system sums.

Everything here that a step calls is device work on fixed shapes: per-system quantities are
sums over atoms with ``index_add_`` over ``State.system``, and per-system parameters reach the
atoms by indexing with ``State.system``. Nothing reads a tensor's value on the host. The
arithmetic of a step is marked ``fusible`` (dynamics/fusion.py): in a run that compiles its
model on CUDA, Inductor fuses it into a few kernels.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

import torch

from fastmace.dynamics.fusion import fusible
from fastmace.dynamics.integrators.streams import RandomStreams, Seed, random_streams
from fastmace.dynamics.integrators.units import EV_PER_AMU_A2_PER_FS2, KB_EV_PER_K
from fastmace.dynamics.integrators.validation import (
    PerSystem,
    check_force_result,
    check_state,
    check_timestep,
    per_system_tensor,
)
from fastmace.dynamics.state import ComputeFn, ForceResult, State

# ComputeFn and ForceResult live beside State.
__all__ = ["Barostatted", "ComputeFn", "ForceResult", "MDState", "Thermostatted"]


@dataclass
class MDState:
    """A State with the potential's output at its positions, and what every integrator needs.

    The step functions return a new MDState and never modify the tensors of the one they are
    given, so a captured block of steps reads its inputs and writes fresh outputs (only the
    random generators of a stochastic integrator advance in place).

    Attributes:
        state: positions (Å), velocities (Å/fs), masses, cells of the batch.
        energy: (S,) potential energy in eV at ``state``.
        forces: (N, 3) forces in eV/Å at ``state``.
        stress: (S, 3, 3) configurational stress in eV/Å^3 at ``state``, or None.
        timestep: the timestep in fs, a Python float fixed for the run.
        degrees_of_freedom: (S,) float64, ``3 N_s - 3`` per system: the centre-of-mass
            momentum of each system is removed at init and kept at zero (see ``integrators``).
        system_mass: (S,) float64 total mass of each system in amu.
    """

    state: State
    energy: torch.Tensor
    forces: torch.Tensor
    stress: torch.Tensor | None
    timestep: float
    degrees_of_freedom: torch.Tensor
    system_mass: torch.Tensor

    def kinetic_energy(self) -> torch.Tensor:
        """(S,) kinetic energy in eV."""
        return kinetic_energy(self.state)

    def temperature(self) -> torch.Tensor:
        """(S,) instantaneous temperature in K, ``2 K / (dof k_B)`` (0 for one-atom systems)."""
        dof = self.degrees_of_freedom.clamp(min=1.0)
        return 2.0 * self.kinetic_energy() / (dof * KB_EV_PER_K)

    def total_energy(self) -> torch.Tensor:
        """(S,) potential plus kinetic energy in eV."""
        return self.energy + self.kinetic_energy()


@dataclass
class HeatBathState(MDState):
    """An MDState coupled to a stochastic heat bath (Langevin, CSVR).

    Attributes:
        kT: (S,) target temperature times k_B, in eV.
        streams: the random generators, one per system (integrators/streams.py); every step
            draws from them (they advance in place).
        thermostat_energy: (S,) energy in eV the thermostat has taken out of each system so
            far; total energy plus this is conserved up to the integration error.
    """

    kT: torch.Tensor
    streams: RandomStreams
    thermostat_energy: torch.Tensor

    def conserved_energy(self) -> torch.Tensor:
        """(S,) total energy plus the energy given to the bath, in eV."""
        return self.total_energy() + self.thermostat_energy


@runtime_checkable
class Thermostatted(Protocol):
    """The state of an ensemble whose descriptor has a "temperature" target: temperature
    schedules fill ``kT``, replica exchange swaps it and the guard takes it as a reference."""

    kT: torch.Tensor
    """(S,) target temperature times k_B, in eV."""


@runtime_checkable
class Barostatted(Protocol):
    """The state of an ensemble whose descriptor has a "pressure" target: pressure schedules
    fill ``pressure``; the guard watches its enthalpy and volume."""

    pressure: torch.Tensor
    """(S,) target pressure in eV/Å³."""
    thermostat_energy: torch.Tensor


def system_sum(values: torch.Tensor, system: torch.Tensor, n_systems: int) -> torch.Tensor:
    """Sum per-atom rows into one row per system (``index_add_``: fixed shape, no sync)."""
    out = torch.zeros((n_systems, *values.shape[1:]), dtype=values.dtype, device=values.device)
    return out.index_add_(0, system, values)


@fusible
def kinetic_energy(state: State) -> torch.Tensor:
    """(S,) kinetic energy ``sum 1/2 m v²`` of each system in eV."""
    per_atom = state.masses * (state.velocities * state.velocities).sum(dim=1)
    return 0.5 * EV_PER_AMU_A2_PER_FS2 * system_sum(per_atom, state.system, state.n_systems)


def kinetic_tensor(state: State) -> torch.Tensor:
    """(S, 3, 3) ``sum m v ⊗ v`` of each system in eV: twice the kinetic energy tensor."""
    v = state.velocities
    per_atom = state.masses[:, None, None] * v[:, :, None] * v[:, None, :]
    return EV_PER_AMU_A2_PER_FS2 * system_sum(per_atom, state.system, state.n_systems)


def cell_volume(cell: torch.Tensor) -> torch.Tensor:
    """(S,) volume of each cell in Å^3, as the triple product (no linear-algebra kernel)."""
    a, b, c = cell[:, 0], cell[:, 1], cell[:, 2]
    return torch.linalg.cross(a, b).mul(c).sum(dim=1).abs()


@fusible
def remove_com_momentum(state: State, system_mass: torch.Tensor | None = None) -> State:
    """A State whose every system has zero total momentum (velocities shifted per system)."""
    if system_mass is None:
        system_mass = system_sum(state.masses, state.system, state.n_systems)
    momentum = system_sum(state.masses[:, None] * state.velocities, state.system, state.n_systems)
    com_velocity = momentum / system_mass[:, None]
    return replace(state, velocities=state.velocities - com_velocity[state.system])


def count_degrees_of_freedom(state: State) -> torch.Tensor:
    """(S,) float64 ``3 N_s - 3``: kinetic degrees of freedom with the COM momentum fixed.

    Uses ``bincount``, which reads a size on the host: call it at init, not in a step.
    """
    atoms = state.atoms_per_system().to(torch.float64)
    return 3.0 * atoms - 3.0


@fusible
def half_kick(
    velocities: torch.Tensor, forces: torch.Tensor, masses: torch.Tensor, timestep: float
) -> torch.Tensor:
    """Velocities after half a step of the forces: ``v + (dt/2) F/m`` (the Verlet "B")."""
    return velocities + (0.5 * timestep / EV_PER_AMU_A2_PER_FS2) * forces / masses[:, None]


@fusible
def drift(positions: torch.Tensor, velocities: torch.Tensor, duration: float) -> torch.Tensor:
    """Positions after moving at constant velocity for ``duration`` fs (the Verlet "A")."""
    return positions + duration * velocities


def evaluate(md: MDState, state: State, compute: ComputeFn) -> MDState:
    """``md`` moved to ``state``, with the potential's energy, forces and stress there."""
    result = compute(state)
    return replace(
        md, state=state, energy=result.energy, forces=result.forces, stress=result.stress
    )


def with_velocities(md: MDState, velocities: torch.Tensor) -> MDState:
    """``md`` with new velocities; positions and forces unchanged."""
    return replace(md, state=replace(md.state, velocities=velocities))


def initial_md_state(
    state: State, compute: ComputeFn, timestep_fs: float, *, need_stress: bool = False
) -> MDState:
    """The common start of every ``*_init``: checks, COM momentum removed, first forces.

    Runs on the host once (it reads sizes and checks the potential's output); not for a step.
    """
    check_state(state)
    timestep = check_timestep(timestep_fs)
    system_mass = system_sum(state.masses, state.system, state.n_systems)
    state = remove_com_momentum(state, system_mass)
    result = compute(state)
    check_force_result(result, state, need_stress=need_stress)
    return MDState(
        state=state,
        energy=result.energy,
        forces=result.forces,
        stress=result.stress,
        timestep=timestep,
        degrees_of_freedom=count_degrees_of_freedom(state),
        system_mass=system_mass,
    )


def maxwell_boltzmann_velocities(
    state: State, temperature_K: PerSystem, rng: Seed | RandomStreams
) -> State:
    """A State with velocities drawn from the Maxwell-Boltzmann distribution at each system's
    temperature, then with each system's centre-of-mass momentum removed.

    The kinetic energy is not rescaled to hit the temperature exactly: it is a fair draw of
    the canonical distribution of the ``3 N_s - 3`` remaining degrees of freedom.
    """
    kT = KB_EV_PER_K * per_system_tensor(temperature_K, state, "temperature_K", "K", minimum=0.0)
    streams = random_streams(rng, state)
    noise = streams.per_atom(3, dtype=torch.float64, device=state.device)
    scale = torch.sqrt(kT[state.system] / (state.masses * EV_PER_AMU_A2_PER_FS2))
    return remove_com_momentum(replace(state, velocities=noise * scale[:, None]))
