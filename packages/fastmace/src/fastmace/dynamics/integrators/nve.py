"""Constant energy (NVE): velocity Verlet.

Swope, Andersen, Berens and Wilson, J. Chem. Phys. 76, 637 (1982). Symplectic and time
reversible: with exact arithmetic, negating the velocities retraces the trajectory.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from fastmace.dynamics.fusion import fusible
from fastmace.dynamics.integrators.common import (
    ComputeFn,
    MDState,
    drift,
    evaluate,
    half_kick,
    initial_md_state,
    with_velocities,
)
from fastmace.dynamics.state import State


@dataclass
class NVEState(MDState):
    """Velocity Verlet needs nothing beyond the positions, velocities and forces."""

    def conserved_energy(self) -> torch.Tensor:
        """(S,) total energy in eV: constant up to the integration error."""
        return self.total_energy()


def nve_init(state: State, compute: ComputeFn, *, timestep_fs: float) -> NVEState:
    """Start velocity Verlet: removes each system's COM momentum, computes the first forces.

    Args:
        state: the batch to integrate; it is not modified.
        compute: the potential.
        timestep_fs: timestep in fs, in (0, 10].
    """
    return NVEState(**vars(initial_md_state(state, compute, timestep_fs)))


def nve_step(md: NVEState, compute: ComputeFn) -> NVEState:
    """One velocity Verlet step: half kick, drift, new forces, half kick."""
    dt, masses = md.timestep, md.state.masses
    md = evaluate(md, _kick_and_drift(md.state, md.forces, dt), compute)
    return with_velocities(md, half_kick(md.state.velocities, md.forces, masses, dt))


@fusible
def _kick_and_drift(state: State, forces: torch.Tensor, dt: float) -> State:
    """The half kick and the drift before the forces (one fused computation when compiled)."""
    velocities = half_kick(state.velocities, forces, state.masses, dt)
    return replace(state, positions=drift(state.positions, velocities, dt), velocities=velocities)
