"""Fixed-capacity edge buffers: what the neighbour list produces and the potential consumes.

Edges follow mace-torch's convention: ``edge_index[0]`` is the sender, ``edge_index[1]`` the
receiver, and the edge vector is ``positions[receiver] - positions[sender] + unit_shifts @
cell[system]``. Buffers have a fixed capacity so a step can be captured as a CUDA graph; slots
past the real edges are padding, marked False in ``mask``, and must contribute exactly zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fastmace.md.state import State


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
    """

    edge_index: torch.Tensor
    unit_shifts: torch.Tensor
    mask: torch.Tensor
    count: torch.Tensor
    overflow: torch.Tensor

    @property
    def capacity(self) -> int:
        return int(self.edge_index.shape[1])


def edge_vectors(state: State, edge_index: torch.Tensor, unit_shifts: torch.Tensor) -> torch.Tensor:
    """(E, 3) edge vectors in the state's dtype (float64): receiver - sender + shift @ cell."""
    sender, receiver = edge_index[0], edge_index[1]
    shifts = torch.einsum(
        "ei,eij->ej", unit_shifts.to(state.cell.dtype), state.cell[state.system[sender]]
    )
    return state.positions[receiver] - state.positions[sender] + shifts
