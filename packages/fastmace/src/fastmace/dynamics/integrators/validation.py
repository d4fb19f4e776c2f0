"""Checks of what users pass to the integrators' init functions, with errors that say what to do.

These run once, on the host, before any step: they may read tensor values. Steps check
nothing.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np
import torch

from fastmace.dynamics.state import POSITION_DTYPE, ForceResult, State
from fastmace.vocabulary import MAX_TIMESTEP_FS

PerSystem = float | Sequence[float] | np.ndarray | torch.Tensor
"""A parameter given once for the whole batch, or once per system."""


def check_timestep(timestep_fs: float) -> float:
    """The timestep in fs as a float, if it is in (0, MAX_TIMESTEP_FS]."""
    value = _as_float(timestep_fs, "timestep_fs")
    if not (math.isfinite(value) and 0.0 < value <= MAX_TIMESTEP_FS):
        raise ValueError(
            f"timestep_fs must be in (0, {MAX_TIMESTEP_FS:g}] fs; got {timestep_fs!r}. "
            "Give the timestep in femtoseconds (typical: 0.5 to 2 fs), not in ASE time units."
        )
    return value


def check_positive_int(value: int, name: str, *, minimum: int = 1) -> int:
    """An int at least ``minimum`` (bool is refused)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}; got {value!r}")
    return value


def per_system_tensor(
    value: PerSystem,
    state: State,
    name: str,
    unit: str,
    *,
    minimum: float | None = None,
    strictly_above: float | None = None,
) -> torch.Tensor:
    """(S,) float64 tensor on the state's device from one value or one value per system.

    Every value must be finite, ``>= minimum`` and ``> strictly_above`` where those are given.
    """
    values = torch.as_tensor(
        value.detach().cpu() if isinstance(value, torch.Tensor) else value, dtype=torch.float64
    ).reshape(-1)
    n_systems = state.n_systems
    if values.numel() == 1:
        values = values.expand(n_systems)
    if values.numel() != n_systems:
        raise ValueError(
            f"{name} must be one value or one per system ({n_systems}); got {values.numel()}"
        )
    for index, item in enumerate(values.tolist()):
        where = f" (system {index})" if n_systems > 1 else ""
        if not math.isfinite(item):
            raise ValueError(f"{name} must be finite; got {item}{where}")
        if minimum is not None and item < minimum:
            raise ValueError(f"{name} must be >= {minimum:g} {unit}; got {item:g} {unit}{where}")
        if strictly_above is not None and item <= strictly_above:
            raise ValueError(
                f"{name} must be > {strictly_above:g} {unit}; got {item:g} {unit}{where}"
            )
    return values.clone().to(state.device)


def check_state(state: State) -> None:
    """Shapes and dtypes the integrators rely on."""
    n_atoms, n_systems = state.n_atoms, state.n_systems
    for name in ("positions", "velocities", "masses", "cell"):
        tensor = getattr(state, name)
        if tensor.dtype != POSITION_DTYPE:
            raise TypeError(f"state.{name} must be float64 for MD; got {tensor.dtype}")
    if state.positions.shape != (n_atoms, 3) or state.velocities.shape != (n_atoms, 3):
        raise ValueError(
            f"state.positions and state.velocities must be ({n_atoms}, 3); got "
            f"{tuple(state.positions.shape)} and {tuple(state.velocities.shape)}"
        )
    if state.system.shape != (n_atoms,) or state.masses.shape != (n_atoms,):
        raise ValueError(f"state.system and state.masses must have one entry per atom ({n_atoms})")
    if state.cell.shape != (n_systems, 3, 3) or state.pbc.shape != (n_systems, 3):
        raise ValueError(f"state.cell must be ({n_systems}, 3, 3) and state.pbc ({n_systems}, 3)")
    if not bool(torch.all(state.masses > 0)):
        raise ValueError("every atom needs a positive mass (amu); some masses are <= 0")
    if n_atoms and not bool(torch.all(state.system.diff() >= 0)):
        raise ValueError("state.system must be non-decreasing (atoms grouped by system)")
    counts = state.atoms_per_system()
    if counts.numel() != n_systems or bool(torch.any(counts == 0)):
        raise ValueError("every system of the batch needs at least one atom")


def check_thermostatted(state: State, what: str) -> None:
    """Thermostats need kinetic degrees of freedom left after the COM momentum is removed."""
    check_state(state)
    counts = state.atoms_per_system().tolist()
    small = [index for index, count in enumerate(counts) if count < 2]
    if small:
        raise ValueError(
            f"{what} needs at least 2 atoms per system (the centre-of-mass momentum is "
            f"removed, leaving 3N-3 degrees of freedom); systems {small} have fewer"
        )


def check_periodic(state: State, what: str) -> None:
    """Constant pressure needs every system periodic in all three directions and a volume."""
    check_state(state)
    not_periodic = [i for i, pbc in enumerate(state.pbc.tolist()) if not all(pbc)]
    if not_periodic:
        raise ValueError(
            f"{what} needs every system periodic in x, y and z (a volume to rescale); systems "
            f"{not_periodic} are not. Use an NVT integrator for molecules, slabs and wires"
        )
    volumes = torch.linalg.det(state.cell.detach().cpu()).abs().tolist()
    flat = [i for i, volume in enumerate(volumes) if not volume > 1e-6]
    if flat:
        raise ValueError(f"{what} needs a cell of non-zero volume; systems {flat} have none")


def check_force_result(result: ForceResult, state: State, *, need_stress: bool) -> None:
    """The potential's output has the documented shapes, dtype and device."""
    expected = {
        "energy": (state.n_systems,),
        "forces": (state.n_atoms, 3),
        "stress": (state.n_systems, 3, 3),
    }
    for name, shape in expected.items():
        tensor = getattr(result, name)
        if tensor is None:
            if name == "stress" and not need_stress:
                continue
            needs = "constant-pressure MD" if name == "stress" else "every integrator"
            raise ValueError(f"the potential returned no {name}; {needs} needs it")
        if tuple(tensor.shape) != shape:
            raise ValueError(f"the potential's {name} is {tuple(tensor.shape)}, expected {shape}")
        if tensor.dtype != torch.float64:
            raise TypeError(f"the potential's {name} must be float64; got {tensor.dtype}")
        if tensor.device != state.device:
            raise ValueError(f"the potential's {name} is on {tensor.device}, not {state.device}")
        if not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"the potential's {name} at the initial positions is not finite")


def _as_float(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number; got {type(value).__name__}")
    return float(value)
