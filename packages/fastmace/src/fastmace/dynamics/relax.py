"""FIRE relaxation on the device: positions, and optionally the cell, for a batch of systems.

The algorithm is FIRE as ASE's ``FIRE`` runs it (Bitzek et al., Phys. Rev. Lett. 97, 170201
(2006), with unit masses and a largest step per iteration), with every scalar of it kept per
system: each system has its own time step, mixing and convergence, and a converged system
stops moving while the others go on. With ``cell=True`` the optimised coordinates are those of
ASE's ``FrechetCellFilter``: the atoms' positions in the undeformed cell and ``c log F`` for
the deformation gradient F of the cell (c = the system's number of atoms), whose generalised
forces are the atoms' forces mapped by F and the Fréchet derivative of ``exp`` applied to the
virial, so that energy (plus pressure times volume) is minimised over positions and cell.

A step is device work on fixed shapes, like an MD step: the engine runs K of them per launch
(captured as a CUDA graph on the GPU) and the host reads convergence once per block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from fastmace.dynamics.integrators.common import (
    ComputeFn,
    MDState,
    cell_volume,
    evaluate,
    system_sum,
)
from fastmace.dynamics.integrators.validation import check_force_result, check_state
from fastmace.dynamics.matrix_exp import matrix_exp, matrix_exp_frechet
from fastmace.dynamics.state import State
from fastmace.vocabulary import EV_PER_A3_PER_GPA


@dataclass(frozen=True)
class FireSettings:
    """FIRE's parameters, with ASE's defaults; lengths in Å, forces in eV/Å.

    ``fmax`` is the convergence threshold on the largest generalised force of a system (with
    ``cell=True`` the cell's rows count too, as in ASE with a cell filter); ``max_step_A`` bounds
    each system's move per iteration; ``dt``, ``dt_max`` are FIRE's (unit-mass) time steps.
    """

    fmax: float = 0.05
    cell: bool = False
    pressure_GPa: float = 0.0
    max_step_A: float = 0.2
    dt: float = 0.1
    dt_max: float = 1.0
    n_min: int = 5
    f_inc: float = 1.1
    f_dec: float = 0.5
    alpha_start: float = 0.1
    f_alpha: float = 0.99

    def __post_init__(self) -> None:
        positive = ("fmax", "max_step_A", "dt", "dt_max", "f_inc", "f_dec", "alpha_start")
        for name in positive:
            value = getattr(self, name)
            if not (isinstance(value, int | float) and not isinstance(value, bool) and value > 0):
                raise ValueError(f"FIRE's {name} must be a positive number, got {value!r}")
        if not self.dt <= self.dt_max:
            raise ValueError(f"FIRE's dt ({self.dt}) must not exceed dt_max ({self.dt_max})")
        if not (0 < self.f_dec < 1 < self.f_inc and 0 < self.f_alpha <= 1):
            raise ValueError("FIRE needs 0 < f_dec < 1 < f_inc and 0 < f_alpha <= 1")
        if not (isinstance(self.n_min, int) and self.n_min >= 0):
            raise ValueError(f"FIRE's n_min must be a whole number >= 0, got {self.n_min!r}")
        if not isinstance(self.cell, bool):
            raise ValueError(f"cell must be True or False, got {self.cell!r}")
        pressure = self.pressure_GPa
        if not (isinstance(pressure, int | float) and not isinstance(pressure, bool)) or not (
            math.isfinite(pressure)
        ):
            raise ValueError(f"pressure_GPa must be a finite number, got {pressure!r}")
        if pressure and not self.cell:
            raise ValueError("a pressure needs cell=True: only the cell responds to it")


@dataclass
class FireState(MDState):
    """An MDState with FIRE's per-system scalars and, with a cell, the cell's coordinates.

    ``state.velocities`` hold FIRE's velocities of the atoms' coordinates (unit masses, not
    physical); the state's ``timestep`` and degrees of freedom are not used.

    Attributes:
        cell_velocities: (S, 3, 3) FIRE's velocities of the cell coordinates (zero without).
        log_deformation: (S, 3, 3) ``log F``; the cell is ``reference_cell @ F^T``.
        reference_cell: (S, 3, 3) the cell at the start.
        dt, alpha, positive_steps: (S,) FIRE's step, mixing and count of downhill steps.
        iterations: (S,) FIRE steps taken by each system (it stops counting when converged).
        fmax: (S,) the largest generalised force at the current positions.
        threshold, max_step, pressure, cell_factor: (S,) the settings each system runs with
            (pressure in eV/Å^3; ``cell_factor`` is c above).
        history: (H, S, 6) each system's energy, enthalpy, fmax, volume, converged (0 or 1)
            and iterations after each of the batch's last H steps, in a ring (relax.csv's
            rows: the host reads a block's worth once per block).
        steps: () int64, the batch's steps so far (where the next history row goes).
    """

    cell_velocities: torch.Tensor
    log_deformation: torch.Tensor
    reference_cell: torch.Tensor
    dt: torch.Tensor
    alpha: torch.Tensor
    positive_steps: torch.Tensor
    iterations: torch.Tensor
    fmax: torch.Tensor
    threshold: torch.Tensor
    max_step: torch.Tensor
    pressure: torch.Tensor
    cell_factor: torch.Tensor
    history: torch.Tensor
    steps: torch.Tensor
    settings: FireSettings

    def converged(self) -> torch.Tensor:
        """(S,) bool: the system's largest generalised force is below ``fmax``."""
        return self.fmax < self.threshold

    def enthalpy(self) -> torch.Tensor:
        """(S,) potential energy plus pressure times volume, in eV (what is minimised)."""
        return self.energy + self.pressure * cell_volume(self.state.cell)


def _row_norm_max(rows: torch.Tensor, system: torch.Tensor, n_systems: int) -> torch.Tensor:
    """(S,) the largest Euclidean norm of the rows belonging to each system."""
    norms = rows.norm(dim=1)
    out = torch.zeros(n_systems, dtype=norms.dtype, device=norms.device)
    return out.scatter_reduce(0, system, norms, reduce="amax", include_self=True)


def generalised_forces(md: FireState) -> tuple[torch.Tensor, torch.Tensor]:
    """The forces on FIRE's coordinates: (N, 3) for the atoms, (S, 3, 3) for the cell.

    Without a cell these are the atoms' forces and zero. With one, for positions
    ``r = r0 F^T``: the atoms' rows are ``f F``, and the cell's are ``L(log F^T, W F^-T) / c``
    with ``W = -V (stress + p I)`` the virial, L the Fréchet derivative of ``exp`` (by the
    adjoint identity ``<L(A, E), U> = <E, L(A^T, U)>`` one derivative gives all nine entries).
    """
    if not md.settings.cell:
        return md.forces, torch.zeros_like(md.reference_cell)
    state = md.state
    deformation = matrix_exp(md.log_deformation)
    atoms = torch.einsum("ni,nij->nj", md.forces, deformation[state.system])
    identity = torch.eye(3, dtype=md.forces.dtype, device=md.forces.device)
    volume = cell_volume(state.cell)[:, None, None]
    virial = -volume * (md.stress + md.pressure[:, None, None] * identity)
    gradient = virial @ inverse_3x3(deformation).transpose(1, 2)
    cell = matrix_exp_frechet(md.log_deformation.transpose(1, 2), gradient)
    return atoms, cell / md.cell_factor[:, None, None]


def largest_force(md: FireState) -> torch.Tensor:
    """(S,) the largest generalised force row of each system (ASE's ``fmax`` criterion)."""
    atoms, cell = generalised_forces(md)
    state = md.state
    largest = _row_norm_max(atoms, state.system, state.n_systems)
    return torch.maximum(largest, cell.norm(dim=2).amax(dim=1))


def fire_init(
    state: State, compute: ComputeFn, settings: FireSettings, history: int = 1
) -> FireState:
    """FIRE's start: zero velocities, the first forces (and stress with a cell), FIRE's scalars,
    and room for the last ``history`` steps' values (one block's, for relax.csv).

    Runs on the host once (it checks the potential's output); not for a step.
    """
    check_state(state)
    state = replace(state, velocities=torch.zeros_like(state.positions))
    result = compute(state)
    check_force_result(result, state, need_stress=settings.cell)
    n, dtype, device = state.n_systems, state.positions.dtype, state.device

    def per_system(value: float) -> torch.Tensor:
        return torch.full((n,), float(value), dtype=dtype, device=device)

    atoms = state.atoms_per_system().to(dtype)
    md = FireState(
        state=state,
        energy=result.energy,
        forces=result.forces,
        stress=result.stress,
        timestep=settings.dt,
        degrees_of_freedom=3.0 * atoms,
        system_mass=system_sum(state.masses, state.system, n),
        cell_velocities=torch.zeros_like(state.cell),
        log_deformation=torch.zeros_like(state.cell),
        reference_cell=state.cell.clone(),
        dt=per_system(settings.dt),
        alpha=per_system(settings.alpha_start),
        positive_steps=per_system(0.0),
        iterations=per_system(0.0),
        fmax=per_system(0.0),
        threshold=per_system(settings.fmax),
        max_step=per_system(settings.max_step_A),
        pressure=per_system(settings.pressure_GPa * EV_PER_A3_PER_GPA),
        cell_factor=atoms,
        history=torch.zeros(
            (max(int(history), 1), n, len(HISTORY_COLUMNS)), dtype=dtype, device=device
        ),
        steps=torch.zeros((), dtype=torch.int64, device=device),
        settings=settings,
    )
    return replace(md, fmax=largest_force(md))


# What FireState.history holds for each system after each step, in this order.
HISTORY_COLUMNS = ("energy", "enthalpy", "fmax", "volume", "converged", "iterations")


def _recorded(md: FireState) -> FireState:
    """``md`` with this step's values in its history ring (device work only)."""
    row = torch.stack([
        md.energy.to(md.history.dtype), md.enthalpy().to(md.history.dtype),
        md.fmax.to(md.history.dtype), cell_volume(md.state.cell).to(md.history.dtype),
        md.converged().to(md.history.dtype), md.iterations.to(md.history.dtype),
    ], dim=1)  # fmt: skip
    slot = torch.remainder(md.steps, md.history.shape[0]).view(1)
    return replace(md, history=md.history.index_copy(0, slot, row.unsqueeze(0)), steps=md.steps + 1)


def fire_step(md: FireState, compute: ComputeFn) -> FireState:
    """One FIRE iteration of every system that has not converged; the others stay put."""
    settings, state = md.settings, md.state
    system, n = state.system, state.n_systems
    force_atoms, force_cell = generalised_forces(md)
    velocity_atoms, velocity_cell = state.velocities, md.cell_velocities

    def dot(a_atoms: torch.Tensor, a_cell: torch.Tensor, b_atoms: torch.Tensor,
            b_cell: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """(S,) the dot product over a system's atoms' and cell's coordinates."""
        return system_sum((a_atoms * b_atoms).sum(dim=1), system, n) + (a_cell * b_cell).sum(
            dim=(1, 2)
        )

    moving = md.fmax >= md.threshold
    first = md.iterations == 0  # ASE's first iteration has no velocities to mix or reset
    power = dot(force_atoms, force_cell, velocity_atoms, velocity_cell)
    downhill = (power > 0) & ~first
    uphill = (power <= 0) & ~first
    # Mix the velocities towards the force: v <- (1 - a) v + a |v| F / |F|.
    speed = dot(velocity_atoms, velocity_cell, velocity_atoms, velocity_cell).sqrt()
    force = dot(force_atoms, force_cell, force_atoms, force_cell).sqrt().clamp(min=1e-300)
    mix = torch.where(downhill, md.alpha, torch.zeros_like(md.alpha))
    keep = torch.where(uphill, torch.zeros_like(mix), 1.0 - mix)
    towards = mix * speed / force
    velocity_atoms = keep[system, None] * velocity_atoms + towards[system, None] * force_atoms
    velocity_cell = keep[:, None, None] * velocity_cell + towards[:, None, None] * force_cell
    # After n_min downhill steps in a row, larger steps and less mixing; uphill: reset.
    faster = downhill & (md.positive_steps > settings.n_min)
    dt = torch.where(faster, (md.dt * settings.f_inc).clamp(max=settings.dt_max), md.dt)
    dt = torch.where(uphill, md.dt * settings.f_dec, dt)
    alpha = torch.where(faster, md.alpha * settings.f_alpha, md.alpha)
    alpha = torch.where(uphill, torch.full_like(alpha, settings.alpha_start), alpha)
    positive = torch.where(downhill, md.positive_steps + 1, md.positive_steps)
    positive = torch.where(uphill, torch.zeros_like(positive), positive)
    # Euler step of unit-mass dynamics, the move bounded per system; converged systems hold.
    velocity_atoms = velocity_atoms + dt[system, None] * force_atoms
    velocity_cell = velocity_cell + dt[:, None, None] * force_cell
    move_atoms, move_cell = dt[system, None] * velocity_atoms, dt[:, None, None] * velocity_cell
    length = dot(move_atoms, move_cell, move_atoms, move_cell).sqrt()
    scale = torch.where(moving, (md.max_step / length.clamp(min=1e-300)).clamp(max=1.0), 0.0)
    move_atoms, move_cell = scale[system, None] * move_atoms, scale[:, None, None] * move_cell
    md = replace(
        md,
        cell_velocities=torch.where(moving[:, None, None], velocity_cell, md.cell_velocities),
        dt=torch.where(moving, dt, md.dt),
        alpha=torch.where(moving, alpha, md.alpha),
        positive_steps=torch.where(moving, positive, md.positive_steps),
        iterations=md.iterations + moving.to(md.iterations.dtype),
    )
    velocities = torch.where(moving[system, None], velocity_atoms, state.velocities)
    if settings.cell:
        moved, log_deformation = _deformed(md, move_atoms, move_cell)
        md = replace(md, log_deformation=log_deformation)
    else:
        moved = replace(state, positions=state.positions + move_atoms)
    md = evaluate(md, replace(moved, velocities=velocities), compute)
    return _recorded(replace(md, fmax=largest_force(md)))


def _deformed(
    md: FireState, move_atoms: torch.Tensor, move_cell: torch.Tensor
) -> tuple[State, torch.Tensor]:
    """The state after a move in the cell filter's coordinates, and the new ``log F``.

    Positions are ``r = r0 F^T`` (rows), so the undeformed ones are ``r0 = r F^-T``.
    """
    state, system = md.state, md.state.system
    old = inverse_3x3(matrix_exp(md.log_deformation))
    undeformed = torch.einsum("ni,nji->nj", state.positions, old[system])
    log_deformation = md.log_deformation + move_cell / md.cell_factor[:, None, None]
    new = matrix_exp(log_deformation)
    positions = torch.einsum("ni,nji->nj", undeformed + move_atoms, new[system])
    cell = md.reference_cell @ new.transpose(1, 2)
    return replace(state, positions=positions, cell=cell), log_deformation


def inverse_3x3(matrices: torch.Tensor) -> torch.Tensor:
    """The inverse of each (..., 3, 3) matrix from its adjugate: ``torch.linalg.inv`` checks
    for singular input on the host, which a CUDA graph cannot capture."""
    rows = matrices.unbind(dim=-2)
    adjugate_columns = (
        torch.linalg.cross(rows[1], rows[2]),
        torch.linalg.cross(rows[2], rows[0]),
        torch.linalg.cross(rows[0], rows[1]),
    )
    adjugate = torch.stack(adjugate_columns, dim=-1)
    determinant = (rows[0] * adjugate_columns[0]).sum(dim=-1)
    return adjugate / determinant[..., None, None]
