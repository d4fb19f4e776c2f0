"""Fixed-capacity edge buffers: what the neighbour list produces and the potential consumes.

Edges follow mace-torch's convention: ``edge_index[0]`` is the sender, ``edge_index[1]`` the
receiver, and the edge vector is ``positions[receiver] - positions[sender] + unit_shifts @
cell[system]``. Buffers have a fixed capacity so a step can be captured as a CUDA graph; slots
past the real edges are padding, marked False in ``mask``, and must contribute exactly zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fastmace.dynamics.state import State


@dataclass
class Edges:
    """Edge buffers of fixed capacity E.

    Attributes:
        edge_index: (2, E) int64 sender and receiver atom indices; padding slots hold valid
            atom indices (so gathers never go out of range) but are masked out.
        unit_shifts: (E, 3) float64 integer lattice-vector multiples of each edge's image.
        mask: (E,) bool, True for real edges.
        count: () int64 device tensor, the number of real edges (may exceed E on overflow).
        overflow: () bool device tensor, set when edges or bins did not fit; never cleared
            silently: the engine reads it once per block and rebuilds with a larger capacity.
        mirrored: the layout `NeighbourList.cutoff_edges` gives the model: E is even and slot
            ``e + E/2`` holds slot ``e``'s pair the other way round (receiver and sender
            swapped, shift negated, same mask), so per-pair quantities are computed once
            (dynamics/pair_radials.py). A host-side flag, fixed for a buffer's lifetime.
    """

    edge_index: torch.Tensor
    unit_shifts: torch.Tensor
    mask: torch.Tensor
    count: torch.Tensor
    overflow: torch.Tensor
    mirrored: bool = False

    @property
    def capacity(self) -> int:
        return int(self.edge_index.shape[1])


def per_system_matmul(
    rows: torch.Tensor, matrices: torch.Tensor, system: torch.Tensor | None
) -> torch.Tensor:
    """``rows[i] @ matrices[system[i]]`` for rows of 3 (any leading dims after ``system``'s).

    ``rows`` is (M, ..., 3), ``matrices`` (S, 3, 3) and ``system`` (M,), which may be None when
    there is one system. With one system this is one GEMM; otherwise a broadcast product and
    sum. Not an einsum over per-row matrices:
    that becomes cuBLAS batched GEMV, launched once per 65,535 rows (27 launches and 1.4 ms
    per MD step at 13,824 atoms on an H200).
    """
    if matrices.shape[0] == 1:
        return rows @ matrices[0]
    if system is None:
        raise ValueError(f"{matrices.shape[0]} systems need the system index of every row")
    gathered = matrices.index_select(0, system)
    gathered = gathered.view(system.shape + (1,) * (rows.dim() - 1 - system.dim()) + (3, 3))
    return (rows.unsqueeze(-1) * gathered).sum(-2)


def edge_vectors(state: State, edge_index: torch.Tensor, unit_shifts: torch.Tensor) -> torch.Tensor:
    """(E, 3) edge vectors in the state's dtype (float64): receiver - sender + shift @ cell."""
    return vectors_of_edges(
        state.positions, state.cell, systems_of_atoms(state), edge_index, unit_shifts
    )


def vectors_of_edges(
    positions: torch.Tensor,
    cell: torch.Tensor,
    system: torch.Tensor | None,
    edge_index: torch.Tensor,
    unit_shifts: torch.Tensor,
) -> torch.Tensor:
    """:func:`edge_vectors` on tensors (``system``: every atom's, None for a batch of one)."""
    sender, receiver = edge_index[0], edge_index[1]
    edge_system = None if system is None else system.index_select(0, sender)
    shifts = per_system_matmul(unit_shifts.to(cell.dtype), cell, edge_system)
    return positions.index_select(0, receiver) - positions.index_select(0, sender) + shifts


def systems_of(state: State, atoms: torch.Tensor) -> torch.Tensor | None:
    """The system index of each of ``atoms`` (None for a batch of one: every row is system 0)."""
    return state.system.index_select(0, atoms) if state.n_systems > 1 else None


def systems_of_atoms(state: State) -> torch.Tensor | None:
    """Every atom's system index (None for a batch of one), for `per_system_matmul`."""
    return state.system if state.n_systems > 1 else None
