"""A run started from rest at an energy minimum reaches its temperature in a few vibrations.

Velocities drawn at T into a crystal at its minimum share their energy with the lattice: in a
harmonic solid, equipartition moves half of the kinetic energy into potential energy within a
vibration period, the temperature falls to about T/2, and a gentle thermostat (Langevin at its
default 1/ps) takes picoseconds to bring it back. A newcomer's first short run then ends near
150-200 K at a requested 300 K.

So when FastMACE draws the velocities itself (the structure has none and no initial
temperature was given), each system whose first forces show it at rest at a minimum (its
largest force below :data:`AT_MINIMUM_FMAX_EV_PER_A`, the force a relaxation converges to by
default) starts at twice the target: velocities scaled by sqrt(2), which is the same draw at
2T. Equipartition then leaves it near T. A system away from a minimum (a rattled crystal, a
liquid snapshot) already holds potential energy and keeps the draw at T.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch

from fastmace.dynamics.relax import FireSettings

AT_MINIMUM_FMAX_EV_PER_A = FireSettings.fmax
"""Largest force (eV/Å) below which a system counts as at an energy minimum: fastmace relax's
default convergence threshold, 0.05 eV/Å."""


@dataclass(frozen=True)
class ThermalStart:
    """Which systems started at twice their target, and the largest first force of each."""

    doubled: tuple[bool, ...]
    fmax_eV_per_A: tuple[float, ...]

    def describe(self) -> str | None:
        """One line for the report (None when no system was doubled)."""
        count = sum(self.doubled)
        if not count:
            return None
        total = len(self.doubled)
        which = "the system" if total == 1 else f"{count} of {total} systems"
        largest = max(f for f, d in zip(self.fmax_eV_per_A, self.doubled, strict=True) if d)
        return (
            f"velocities drawn at twice the target for {which} at rest at an energy minimum "
            f"(largest force {largest:.3g} < {AT_MINIMUM_FMAX_EV_PER_A} eV/Å): equipartition "
            "gives half of that energy to the lattice"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": f"twice the target where the largest first force < "
            f"{AT_MINIMUM_FMAX_EV_PER_A} eV/Å",
            "doubled": list(self.doubled),
            "fmax_eV_per_A": list(self.fmax_eV_per_A),
        }


def largest_force(forces: torch.Tensor, system: torch.Tensor, n_systems: int) -> torch.Tensor:
    """(S,) each system's largest per-atom force magnitude."""
    magnitude = torch.linalg.vector_norm(forces.detach(), dim=1)
    out = torch.zeros(n_systems, dtype=magnitude.dtype, device=magnitude.device)
    return out.scatter_reduce(0, system, magnitude, reduce="amax", include_self=True)


def equipartition_start(md: Any) -> tuple[Any, ThermalStart]:
    """``md`` (an integrator's start, first forces computed) with the velocities of each
    system at rest at a minimum scaled by sqrt(2), and what was done. Scaling keeps the
    centre of mass at rest and changes nothing else of the integrator's state."""
    state = md.state
    fmax = largest_force(md.forces, state.system, state.n_systems)
    doubled = fmax < AT_MINIMUM_FMAX_EV_PER_A
    velocities = state.velocities
    # Built in the velocities' dtype: a Python float in torch.where would make float32.
    sqrt2 = torch.full_like(fmax, math.sqrt(2.0), dtype=velocities.dtype)
    factor = torch.where(doubled, sqrt2, torch.ones_like(sqrt2))
    velocities = velocities * factor[state.system, None]
    started = replace(md, state=replace(state, velocities=velocities))
    record = ThermalStart(
        doubled=tuple(bool(d) for d in doubled.tolist()),
        fmax_eV_per_A=tuple(float(f) for f in fmax.tolist()),
    )
    return started, record
