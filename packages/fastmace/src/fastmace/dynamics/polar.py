"""PolarMACE's input dictionary (MACE-POLAR-1), built from a State and Edges.

PolarMACE (mace-torch 0.3.16, ``mace/modules/extensions.py``) adds to the local MACE energy a
long-range part from graph-longrange: self-consistent atomic charges and spins, their Coulomb
energy by Ewald-like sums in k-space (periodic systems) or in real space (open ones), and a
local electron energy. That part reads what the local model does not: the atoms' real
positions, the cell, its reciprocal and volume, the periodicity, and each system's total
charge and spin multiplicity. So this graph differs from the local models' one
(``Potential._graph``) in three ways:

- positions are the atoms' own, not zeros with the edge vectors passed as shifts;
- only the real edges are kept (boolean indexing: a host synchronisation), with no padding
  node, so the batch is exactly the one mace-torch's calculator builds: a padding node's
  extra open "system" would turn graph-longrange's all-periodic path into its mixed one.
  Fixed shapes here would not make a step capturable: graph-longrange 0.4.0 and mace-torch
  0.3.16 themselves read device values on the host in the forward pass (the k-grid's
  extent and selection, branches on ``pbc``; docs/validation/polar.md#capture, measured by
  tools/validation/polar_sync_ops.py);
- the cell the long-range part sees is mace-torch's: each non-periodic direction replaced by
  a long axis (``mace/data/neighborhood.py``'s rule), its reciprocal ``2π (cellᵀ)⁻¹`` and
  signed volume ``det(cell)``.

Stress as mace-torch computes it: the strain reaches the local edge vectors only; the
long-range part sees the unstrained positions and cell (mace-torch's ``prepare_graph`` hands
it the positions from before the strain). docs/validation/polar.md measures what this leaves
out of the stress.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from fastmace.dynamics.edges import per_system_matmul, systems_of
from fastmace.dynamics.state import State
from fastmace.vocabulary import LONG_RANGE_MODEL_TYPES

# mace-torch's long axis for a non-periodic direction: (max |position| + 1) * 5 * r_max.
_OPEN_AXIS_FACTOR = 5.0

PerSystem = torch.Tensor | float | list[float] | None
"""One value for all systems, one per system, or None (the default)."""


def is_long_range(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a mace-torch model with a long-range part (PolarMACE)."""
    return type(model).__name__ in LONG_RANGE_MODEL_TYPES


def per_system_values(
    values: PerSystem,
    default: float,
    n_systems: int,
    name: str,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """(S,) ``values`` (one for all systems, or one per system), ``default`` when None."""
    if values is None:
        values = default
    tensor = torch.as_tensor(values, dtype=dtype, device=device).reshape(-1)
    if tensor.numel() == 1:
        return tensor.expand(n_systems)
    if tensor.numel() != n_systems:
        raise ValueError(f"{name} has {tensor.numel()} values for {n_systems} systems")
    return tensor


def charge_tensors(
    charges: Sequence[float] | None, spins: Sequence[float] | None, device: torch.device
) -> dict[str, torch.Tensor]:
    """A ForceField's ``charge`` and ``spin``: (S,) float64 tensors on ``device``, made once
    per run (none for a local model, which reads neither)."""
    if charges is None or spins is None:
        return {}
    return {
        "charge": torch.tensor(charges, dtype=torch.float64, device=device),
        "spin": torch.tensor(spins, dtype=torch.float64, device=device),
    }


def long_range_cell(state: State, r_max: float) -> torch.Tensor:
    """(S, 3, 3) float64 cells as mace-torch's data pipeline gives them to PolarMACE.

    A zero cell becomes the identity, and each non-periodic direction is replaced by an axis
    of length ``(max |position| + 1) * 5 * r_max`` (the largest coordinate of the system),
    so an open molecule has a finite cell and its k-space grid is well defined (unused: open
    systems are summed in real space).
    """
    cell = state.cell
    zero = (cell == 0).flatten(1).all(1).view(-1, 1, 1)
    eye = torch.eye(3, dtype=cell.dtype, device=cell.device).expand_as(cell)
    cell = torch.where(zero, eye, cell)
    largest = state.positions.detach().abs().amax(1)
    extent = torch.zeros(state.n_systems, dtype=cell.dtype, device=cell.device)
    extent = extent.scatter_reduce(0, state.system, largest, "amax", include_self=True)
    open_axis = eye * ((extent + 1.0) * _OPEN_AXIS_FACTOR * r_max).view(-1, 1, 1)
    return torch.where(state.pbc.unsqueeze(-1), cell, open_axis)


def polar_graph(
    state: State,
    edge_index: torch.Tensor,
    unit_shifts: torch.Tensor,
    real: torch.Tensor,
    node_attrs: torch.Tensor,
    head_index: torch.Tensor,
    r_max: float,
    positions: torch.Tensor,
    strained: tuple[torch.Tensor, torch.Tensor] | None,
    charge: torch.Tensor,
    spin: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """PolarMACE's input dictionary for ``state``.

    ``edge_index``, ``unit_shifts`` and ``real`` are ``_real_edges``'s; ``node_attrs`` the
    (N, elements) one-hot rows in the model's dtype; ``positions`` the (N, 3) leaf forces are
    taken against, in that dtype; ``strained`` the positions and cells under the strain leaf
    when stress is asked for; ``charge`` and ``spin`` (S,) total charge and spin multiplicity.
    """
    dtype = node_attrs.dtype
    device = state.device
    n_systems = state.n_systems
    edge_index = edge_index[:, real]
    unit_shifts = unit_shifts[real].to(dtype)
    edge_systems = systems_of(state, edge_index[0])
    if strained is not None:
        moved, cell_moved = strained
        shifts = per_system_matmul(unit_shifts, cell_moved, edge_systems)
        # mace adds receiver - sender of the unstrained positions; this brings the strain
        # into the edge vectors alone. At zero strain the added difference is exactly zero.
        receiver, sender = edge_index[1], edge_index[0]
        shifts = (
            shifts + (moved[receiver] - moved[sender]) - (positions[receiver] - positions[sender])
        )
    else:
        shifts = per_system_matmul(unit_shifts, state.cell.to(dtype), edge_systems)
    # The long-range cell as mace-torch builds it: float64, then the model's dtype, and its
    # volume and reciprocal in that dtype.
    lr_cell = long_range_cell(state, r_max).to(dtype)
    volume = torch.linalg.det(lr_cell)
    rcell = torch.zeros_like(lr_cell)
    finite = volume.abs() > 0
    rcell[finite] = 2 * math.pi * torch.linalg.inv(lr_cell[finite].mT)
    batch = state.system
    boundaries = torch.arange(n_systems + 1, dtype=torch.int64, device=device)
    return {
        "positions": positions,
        "node_attrs": node_attrs,
        "edge_index": edge_index,
        "shifts": shifts,
        "unit_shifts": unit_shifts,
        "cell": lr_cell.reshape(-1, 3),
        "rcell": rcell.reshape(-1, 3),
        "volume": volume,
        "pbc": state.pbc,
        "batch": batch,
        "ptr": torch.searchsorted(batch, boundaries),
        "head": head_index.expand(n_systems),
        "total_charge": charge.to(dtype),
        "total_spin": spin.to(dtype),
        "fermi_level": torch.zeros(n_systems, dtype=dtype, device=device),
        "external_field": torch.zeros(n_systems, 3, dtype=dtype, device=device),
    }
