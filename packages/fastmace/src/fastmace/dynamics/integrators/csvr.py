"""Constant temperature (NVT) with stochastic velocity rescaling (the CSVR or Bussi thermostat).

Bussi, Donadio and Parrinello, J. Chem. Phys. 126, 014101 (2007). The kinetic energy K of each
system follows ``dK = (K̄ - K) dt/τ + 2 sqrt(K K̄ / N_f) dW/sqrt(τ)`` with ``K̄ = N_f kT/2``;
its exact solution over a time t (their Appendix, Eq. A7) is sampled here, with
``c = exp(-t/τ)``, R a standard normal and χ² a chi-square variable of ``N_f - 1`` degrees
of freedom::

    K' = (sqrt(c K) + sqrt((1 - c) K̄/N_f) R)² + (1 - c) (K̄/N_f) χ²

and all velocities of the system are multiplied by ``alpha = ±sqrt(K'/K)``, with the sign of
``sqrt(c K) + sqrt((1 - c) K̄/N_f) R``: the sign that makes the update the exact solution also
when ``c`` is small (then it matters, as R can outweigh ``sqrt(c K)``). χ² is drawn on the
device as ``2 Γ((N_f - 1)/2)`` with ``torch._standard_gamma`` (the sampler behind
``torch.distributions.Gamma``, which takes an explicit generator and does not synchronise).

The rescaling is applied for half a step before and after velocity Verlet (a symmetric Trotter
splitting). Rescaling keeps the COM momentum at zero, so ``N_f = 3N - 3``; the COM momentum is
also removed once a step against round-off in the net force.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from fastmace.dynamics.integrators.common import (
    ComputeFn,
    HeatBathState,
    MDState,
    drift,
    evaluate,
    half_kick,
    initial_md_state,
    kinetic_energy,
    remove_com_momentum,
    with_velocities,
)
from fastmace.dynamics.integrators.streams import RandomStreams, Seed, random_streams
from fastmace.dynamics.integrators.units import KB_EV_PER_K
from fastmace.dynamics.integrators.validation import (
    PerSystem,
    check_thermostatted,
    per_system_tensor,
)
from fastmace.dynamics.state import State
from fastmace.ensemble_catalog import TAU


@dataclass
class CSVRState(HeatBathState):
    """Stochastic velocity rescaling's state: the bath (target, generator, energy; total energy
    plus the bath's share is Bussi's "effective energy") and the time constant.

    Attributes:
        tau: (S,) thermostat time constant in fs.
    """

    tau: torch.Tensor


def csvr_init(
    state: State,
    compute: ComputeFn,
    *,
    timestep_fs: float,
    temperature_K: PerSystem,
    tau_fs: PerSystem = TAU.default,
    rng: Seed | RandomStreams,
) -> CSVRState:
    """Start CSVR dynamics; removes each system's COM momentum, computes the forces.

    Args:
        state: the batch; not modified. Its velocities must not be all zero in a system with a
            temperature above 0 K: rescaling cannot create motion (use
            ``maxwell_boltzmann_velocities``).
        compute: the potential.
        timestep_fs: timestep in fs, in (0, 10].
        temperature_K: target temperature in K (>= 0), one or one per system.
        tau_fs: thermostat time constant in fs (> 0); 100 fs is a common choice, and the
            sampling is canonical for any τ.
        rng: an int seed (system ``s`` draws from ``seed + s``), one seed or generator per
            system, or one torch.Generator for the batch (integrators/streams.py).
    """
    check_thermostatted(state, "The CSVR thermostat")
    kT = KB_EV_PER_K * per_system_tensor(temperature_K, state, "temperature_K", "K", minimum=0.0)
    tau = per_system_tensor(tau_fs, state, "tau_fs", "fs", strictly_above=0.0)
    streams = random_streams(rng, state)
    md = initial_md_state(state, compute, timestep_fs)
    check_can_rescale(md, kT)
    return CSVRState(
        **vars(md), kT=kT, tau=tau, streams=streams, thermostat_energy=torch.zeros_like(kT)
    )


def csvr_step(md: CSVRState, compute: ComputeFn) -> CSVRState:
    """One step: rescale for dt/2, velocity Verlet, rescale for dt/2."""
    dt, masses = md.timestep, md.state.masses
    velocities, heat_before = _thermostat(md, md.state, dt / 2)
    velocities = half_kick(velocities, md.forces, masses, dt)
    positions = drift(md.state.positions, velocities, dt)
    md = evaluate(md, replace(md.state, positions=positions, velocities=velocities), compute)
    md = with_velocities(md, half_kick(velocities, md.forces, masses, dt))
    state = remove_com_momentum(md.state, md.system_mass)
    velocities, heat_after = _thermostat(md, state, dt / 2)
    md = with_velocities(md, velocities)
    return replace(md, thermostat_energy=md.thermostat_energy + heat_before + heat_after)


def _thermostat(md: CSVRState, state: State, duration: float) -> tuple[torch.Tensor, torch.Tensor]:
    return rescale_velocities(state, md.kT, md.tau, md.degrees_of_freedom, duration, md.streams)


def rescale_velocities(
    state: State,
    kT: torch.Tensor,
    tau: torch.Tensor,
    degrees_of_freedom: torch.Tensor,
    duration: float,
    streams: RandomStreams,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact CSVR update of ``state``'s velocities over ``duration`` fs.

    ``kT`` (eV), ``tau`` (fs) and ``degrees_of_freedom`` are (S,). Returns the new velocities
    and the (S,) kinetic energy given to the bath.
    """
    kinetic = kinetic_energy(state)
    new_kinetic, sign = resample_kinetic_energy(
        kinetic, kT, degrees_of_freedom, tau, duration, streams
    )
    # A system at rest stays at rest (alpha is irrelevant there); avoid 0/0.
    safe = torch.where(kinetic > 0, kinetic, torch.ones_like(kinetic))
    alpha = sign * torch.sqrt(new_kinetic / safe)
    return state.velocities * alpha[state.system, None], kinetic - alpha * alpha * kinetic


def resample_kinetic_energy(
    kinetic: torch.Tensor,
    kT: torch.Tensor,
    degrees_of_freedom: torch.Tensor,
    tau: torch.Tensor,
    duration: float,
    streams: RandomStreams,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(S,) kinetic energies after ``duration`` fs of the CSVR process, and the sign of alpha.

    Bussi, Donadio and Parrinello (2007), Eq. (A7), written as a sum of squares so it is never
    negative. Every argument is (S,) except ``duration``.
    """
    c = torch.exp(-duration / tau)
    per_dof = (1.0 - c) * kT / 2.0  # (1 - c) K̄ / N_f
    first = streams.per_system(dtype=kinetic.dtype, device=kinetic.device)
    # chi-square of N_f - 1 degrees of freedom (N_f >= 3 with at least 2 atoms per system)
    chi2 = 2.0 * streams.gamma((degrees_of_freedom - 1.0) / 2.0)
    amplitude = torch.sqrt(c * kinetic) + torch.sqrt(per_dof) * first
    sign = torch.ones_like(amplitude).copysign(amplitude)
    return amplitude * amplitude + per_dof * chi2, sign


def check_can_rescale(md: MDState, kT: torch.Tensor) -> None:
    """Refuse systems with zero kinetic energy but a positive target: rescaling keeps them cold."""
    cold = (md.kinetic_energy() <= 0) & (kT > 0)
    if bool(cold.any()):
        systems = torch.nonzero(cold).flatten().tolist()
        raise ValueError(
            f"systems {systems} have no kinetic energy, and velocity rescaling cannot heat a "
            "system at rest; draw velocities first with maxwell_boltzmann_velocities"
        )
