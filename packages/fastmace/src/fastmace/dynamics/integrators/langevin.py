"""Constant temperature (NVT) with Langevin dynamics, integrated by the BAOAB splitting.

Leimkuhler and Matthews, Appl. Math. Res. Express 2013, 34 (2013): B is a half kick, A half a
drift, O the exact Ornstein-Uhlenbeck update of the velocities,
``v <- c1 v + sqrt((1 - c1²) kT/m) ξ`` with ``c1 = exp(-gamma dt)``. BAOAB samples configurations
with very small timestep error, which is why it is preferred over BBK or Vanden-Eijnden-
Ciccotti orderings.

Centre of mass: the noise would make each system's centre of mass diffuse. It is projected out
after every O step (removing the COM momentum is an orthogonal projection in mass-weighted
velocities, so the projected O step samples the Maxwell-Boltzmann distribution of the
remaining ``3N - 3`` degrees of freedom exactly). Temperatures therefore use ``3N - 3``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from fastmace.dynamics.fusion import fusible
from fastmace.dynamics.integrators.common import (
    ComputeFn,
    HeatBathState,
    drift,
    evaluate,
    half_kick,
    initial_md_state,
    kinetic_energy,
    remove_com_momentum,
    with_velocities,
)
from fastmace.dynamics.integrators.streams import RandomStreams, Seed, random_streams
from fastmace.dynamics.integrators.units import EV_PER_AMU_A2_PER_FS2, FS_PER_PS, KB_EV_PER_K
from fastmace.dynamics.integrators.validation import (
    PerSystem,
    check_thermostatted,
    per_system_tensor,
)
from fastmace.dynamics.state import State
from fastmace.ensemble_catalog import FRICTION


@dataclass
class LangevinState(HeatBathState):
    """Langevin dynamics' state: the bath (target, random streams, energy) and the friction.

    Attributes:
        friction: (S,) friction gamma in 1/fs.
    """

    friction: torch.Tensor


def langevin_init(
    state: State,
    compute: ComputeFn,
    *,
    timestep_fs: float,
    temperature_K: PerSystem,
    friction_per_ps: PerSystem = FRICTION.default,
    rng: Seed | RandomStreams,
) -> LangevinState:
    """Start Langevin dynamics; removes each system's COM momentum, computes the forces.

    Args:
        state: the batch; it is not modified. Velocities are kept as given (draw them with
            ``maxwell_boltzmann_velocities`` for a quick start).
        compute: the potential.
        timestep_fs: timestep in fs, in (0, 10].
        temperature_K: target temperature in K (>= 0), one or one per system.
        friction_per_ps: friction gamma in 1/ps (>= 0; 0 gives NVE), one or one per system.
            1/ps perturbs dynamics little; 10/ps thermalises within a few hundred fs.
        rng: an int seed (system ``s`` draws from ``seed + s``), one seed or generator per
            system, or one torch.Generator for the batch (integrators/streams.py).
    """
    check_thermostatted(state, "Langevin dynamics")
    kT = KB_EV_PER_K * per_system_tensor(temperature_K, state, "temperature_K", "K", minimum=0.0)
    friction = per_system_tensor(friction_per_ps, state, "friction_per_ps", "1/ps", minimum=0.0)
    streams = random_streams(rng, state)
    md = initial_md_state(state, compute, timestep_fs)
    return LangevinState(
        **vars(md),
        kT=kT,
        friction=friction / FS_PER_PS,
        streams=streams,
        thermostat_energy=torch.zeros_like(kT),
    )


def langevin_step(md: LangevinState, compute: ComputeFn) -> LangevinState:
    """One BAOAB step: half kick, half drift, friction and noise, half drift, half kick."""
    noise = md.streams.per_atom(3, dtype=torch.float64, device=md.state.device)
    state, heat = _before_forces(
        md.state, md.forces, md.friction, md.kT, md.system_mass, noise, md.timestep
    )
    md = evaluate(md, state, compute)
    md = with_velocities(md, half_kick(state.velocities, md.forces, state.masses, md.timestep))
    return replace(md, thermostat_energy=md.thermostat_energy + heat)


@fusible
def _before_forces(
    state: State,
    forces: torch.Tensor,
    friction: torch.Tensor,
    kT: torch.Tensor,
    system_mass: torch.Tensor,
    noise: torch.Tensor,
    dt: float,
) -> tuple[State, torch.Tensor]:
    """B, A, O and A of BAOAB (one fused computation in a compiled run): the state where the
    forces are evaluated next, and the (S,) kinetic energy given to the bath."""
    velocities = half_kick(state.velocities, forces, state.masses, dt)
    state = replace(state, positions=drift(state.positions, velocities, dt / 2))
    velocities, heat = ornstein_uhlenbeck(
        replace(state, velocities=velocities), noise, friction, kT, system_mass, dt
    )
    return replace(state, positions=drift(state.positions, velocities, dt / 2),
                   velocities=velocities), heat  # fmt: skip


def ornstein_uhlenbeck(
    state: State,
    noise: torch.Tensor,
    friction: torch.Tensor,
    kT: torch.Tensor,
    system_mass: torch.Tensor,
    duration: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The O step: exact friction and ``noise`` (N, 3) standard normal numbers over
    ``duration`` fs, then the COM projected out.

    Returns the new velocities and the (S,) kinetic energy given to the bath.
    """
    system = state.system
    c1 = torch.exp(-friction * duration)[system, None]
    sigma = torch.sqrt((1.0 - c1 * c1) * kT[system, None])
    sigma = sigma / torch.sqrt(state.masses[:, None] * EV_PER_AMU_A2_PER_FS2)
    new = remove_com_momentum(
        replace(state, velocities=c1 * state.velocities + sigma * noise), system_mass
    )
    return new.velocities, kinetic_energy(state) - kinetic_energy(new)
