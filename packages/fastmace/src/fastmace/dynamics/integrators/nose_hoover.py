"""Constant temperature (NVT) with a Nosé-Hoover chain, deterministic and time reversible.

Equations of motion: Martyna, Klein and Tuckerman, J. Chem. Phys. 97, 2635 (1992). Integrator:
Martyna, Tuckerman, Tobias and Klein, Mol. Phys. 87, 1117 (1996), the Trotter factorisation

    exp(iL_NHC dt/2) exp(iL_v dt/2) exp(iL_x dt) exp(iL_v dt/2) exp(iL_NHC dt/2)

where each chain propagator exp(iL_NHC dt/2) is split into ``n_substeps`` equal substeps, each
of them a Suzuki-Yoshida composition of order 1, 3, 5 or 7 (Yoshida, Phys. Lett. A 150, 262
(1990)), and within each the chain is swept from its end to the particles and back, with the
friction of thermostat j+1 on thermostat j applied as exact exponentials.

Each system has its own chain of ``M`` thermostats, with masses ``Q_1 = N_f kT τ²`` and
``Q_j = kT τ²`` (Martyna et al. 1992), so that τ sets the time scale of the thermostat's
oscillation (its period near equilibrium is about 4.4 τ). ``N_f = 3N - 3``: the COM momentum
is removed at init, and once a step against round-off in the net force (the chain only
rescales velocities, which keeps it at zero).

The conserved quantity is ``K + U + Σ Q_j v_j²/2 + N_f kT η_1 + kT Σ_{j>1} η_j``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from fastmace.dynamics.integrators.common import (
    ComputeFn,
    MDState,
    drift,
    evaluate,
    half_kick,
    initial_md_state,
    kinetic_energy,
    remove_com_momentum,
    with_velocities,
)
from fastmace.dynamics.integrators.units import KB_EV_PER_K
from fastmace.dynamics.integrators.validation import (
    PerSystem,
    check_positive_int,
    check_thermostatted,
    check_timestep,
    per_system_tensor,
)
from fastmace.dynamics.state import State
from fastmace.ensemble_catalog import CHAIN_LENGTH, TAU

_W3 = 1.0 / (2.0 - 2.0 ** (1.0 / 3.0))
_W5 = 1.0 / (4.0 - 4.0 ** (1.0 / 3.0))
_W7 = (0.784513610477560, 0.235573213359357, -1.17767998417887)  # Yoshida (1990), solution A

SUZUKI_YOSHIDA_WEIGHTS: dict[int, tuple[float, ...]] = {
    1: (1.0,),
    3: (_W3, 1.0 - 2.0 * _W3, _W3),
    5: (_W5, _W5, 1.0 - 4.0 * _W5, _W5, _W5),
    7: (*_W7, 1.0 - 2.0 * sum(_W7), *reversed(_W7)),
}
"""Weights of the symmetric Suzuki-Yoshida compositions, by order; each set sums to one."""


@dataclass
class NoseHooverChainState(MDState):
    """A Nosé-Hoover chain per system.

    Attributes:
        kT: (S,) target temperature times k_B, in eV.
        chain_positions: (S, M) thermostat positions η_j (dimensionless).
        chain_velocities: (S, M) thermostat velocities dη_j/dt in 1/fs.
        chain_masses: (S, M) thermostat masses Q_j in eV fs².
        n_substeps: substeps of each half-step chain propagator.
        weights: the Suzuki-Yoshida weights of each substep.
    """

    kT: torch.Tensor
    chain_positions: torch.Tensor
    chain_velocities: torch.Tensor
    chain_masses: torch.Tensor
    n_substeps: int
    weights: tuple[float, ...]

    def conserved_energy(self) -> torch.Tensor:
        """(S,) the extended-system energy in eV; constant up to the integration error."""
        chain_kinetic = 0.5 * (self.chain_masses * self.chain_velocities**2).sum(dim=1)
        coupling = self.degrees_of_freedom * self.chain_positions[:, 0]
        coupling = coupling + self.chain_positions[:, 1:].sum(dim=1)
        return self.total_energy() + chain_kinetic + self.kT * coupling


def nose_hoover_chain_init(
    state: State,
    compute: ComputeFn,
    *,
    timestep_fs: float,
    temperature_K: PerSystem,
    tau_fs: PerSystem = TAU.default,
    chain_length: int = CHAIN_LENGTH.default,
    n_substeps: int = 1,
    suzuki_yoshida_order: int = 1,
) -> NoseHooverChainState:
    """Start Nosé-Hoover chain dynamics; removes each system's COM momentum.

    Args:
        state: the batch; not modified. Draw velocities first (``maxwell_boltzmann_velocities``):
            a chain heats a cold system only slowly.
        compute: the potential.
        timestep_fs: timestep in fs, in (0, 10].
        temperature_K: target temperature in K (> 0), one or one per system.
        tau_fs: thermostat time constant τ in fs, at least the timestep; ~100 fs is typical.
        chain_length: thermostats per chain, M >= 1 (3 is usual; 1 is plain Nosé-Hoover).
        n_substeps: substeps of the chain propagator per half step, >= 1.
        suzuki_yoshida_order: 1, 3, 5 or 7. Each order and substep multiplies the chain's
            small per-system kernels (about 40 per half step for M = 3 at order 1); with
            ``tau`` of many timesteps, order 1 conserves the extended energy as well as the
            timestep allows (as in ASE's and LAMMPS's defaults).
    """
    check_thermostatted(state, "The Nosé-Hoover chain")
    temperature = per_system_tensor(temperature_K, state, "temperature_K", "K", strictly_above=0.0)
    tau = per_system_tensor(tau_fs, state, "tau_fs", "fs", minimum=check_timestep(timestep_fs))
    chain_length = check_positive_int(chain_length, "chain_length")
    n_substeps = check_positive_int(n_substeps, "n_substeps")
    if suzuki_yoshida_order not in SUZUKI_YOSHIDA_WEIGHTS:
        raise ValueError(
            f"suzuki_yoshida_order must be one of {sorted(SUZUKI_YOSHIDA_WEIGHTS)}; "
            f"got {suzuki_yoshida_order!r}"
        )
    md = initial_md_state(state, compute, timestep_fs)
    kT = KB_EV_PER_K * temperature
    masses = (kT * tau * tau)[:, None].repeat(1, chain_length)
    masses[:, 0] *= md.degrees_of_freedom
    zeros = torch.zeros_like(masses)
    return NoseHooverChainState(
        **vars(md),
        kT=kT,
        chain_positions=zeros,
        chain_velocities=zeros.clone(),
        chain_masses=masses,
        n_substeps=n_substeps,
        weights=SUZUKI_YOSHIDA_WEIGHTS[suzuki_yoshida_order],
    )


def nose_hoover_chain_step(md: NoseHooverChainState, compute: ComputeFn) -> NoseHooverChainState:
    """One step: chain for dt/2, velocity Verlet, chain for dt/2."""
    dt, masses = md.timestep, md.state.masses
    md = propagate_chain(md, dt / 2)
    velocities = half_kick(md.state.velocities, md.forces, masses, dt)
    positions = drift(md.state.positions, velocities, dt)
    md = evaluate(md, replace(md.state, positions=positions, velocities=velocities), compute)
    md = with_velocities(md, half_kick(velocities, md.forces, masses, dt))
    md = replace(md, state=remove_com_momentum(md.state, md.system_mass))
    return propagate_chain(md, dt / 2)


def propagate_chain(md: NoseHooverChainState, duration: float) -> NoseHooverChainState:
    """exp(iL_NHC duration): the chains and the particle velocities they scale.

    Martyna et al. (1996), the NHC propagator with multiple time steps and Suzuki-Yoshida
    weights. The particles enter only through their kinetic energy, which is scaled along
    with the velocities; the velocities are scaled once at the end.
    """
    kinetic = kinetic_energy(md.state)
    eta = list(md.chain_positions.unbind(dim=1))
    v = list(md.chain_velocities.unbind(dim=1))
    q = list(md.chain_masses.unbind(dim=1))
    kT, dof, last = md.kT, md.degrees_of_freedom, len(v) - 1

    def force(j: int) -> torch.Tensor:
        """G_j: the excess kinetic energy driving thermostat j, over its mass."""
        driving = 2.0 * kinetic - dof * kT if j == 0 else q[j - 1] * v[j - 1] ** 2 - kT
        return driving / q[j]

    def kick(j: int, length: float) -> None:
        """v_j over ``length``/2: friction of v_{j+1} (exact, split in two), force in between."""
        if j == last:
            v[j] = v[j] + 0.5 * length * force(j)
            return
        damping = torch.exp(-0.25 * length * v[j + 1])
        v[j] = (v[j] * damping + 0.5 * length * force(j)) * damping

    scale = torch.ones_like(kinetic)
    for weight in md.weights:
        length = weight * duration / md.n_substeps
        for _ in range(md.n_substeps):
            for j in reversed(range(last + 1)):
                kick(j, length)
            factor = torch.exp(-length * v[0])
            scale, kinetic = scale * factor, kinetic * factor * factor
            eta = [eta_j + length * v_j for eta_j, v_j in zip(eta, v, strict=True)]
            for j in range(last + 1):
                kick(j, length)
    velocities = md.state.velocities * scale[md.state.system, None]
    return replace(
        with_velocities(md, velocities),
        chain_positions=torch.stack(eta, dim=1),
        chain_velocities=torch.stack(v, dim=1),
    )
