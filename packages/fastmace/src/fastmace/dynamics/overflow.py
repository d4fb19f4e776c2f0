"""After a neighbour-list overflow: the one place that grows the list and builds it again.

The engine (a block that overflowed), the run's set-up (the first forces) and the ASE
calculator (a call) all recover the same way, through :func:`regrow`. It reads back to the
host, so it runs between blocks, never inside a captured one. Growth is bounded: a list that
asks for more edges than any matter holds, or for more memory than the device has, stops the
run with :class:`SimulationError` (docs/faq.md).
"""

from __future__ import annotations

import math
import os

import torch

from fastmace.dynamics.edges import Edges
from fastmace.dynamics.errors import SimulationError
from fastmace.dynamics.neighbours import NeighbourList
from fastmace.dynamics.state import State

# The densest matter a run may reach, in atoms per Å^3: about 5 times diamond's 0.176, the
# densest solid at ambient pressure. Denser than this, atoms are collapsing onto each other.
MAX_NUMBER_DENSITY_PER_A3 = 1.0
# The list's own memory per edge slot (indices, shifts, the cutoff copy, search scratch), in
# bytes, generously: the capacity times this must fit in the memory available.
BYTES_PER_EDGE = 256


def overflowed(edges: Edges) -> bool:
    """Whether ``edges`` overflowed since they were built (one host read)."""
    return bool(edges.overflow)


def max_edges_per_atom(radius_A: float, density_per_A3: float = MAX_NUMBER_DENSITY_PER_A3) -> float:
    """Neighbours within ``radius_A`` of an atom in matter of ``density_per_A3``."""
    return 4.0 / 3.0 * math.pi * radius_A**3 * density_per_A3


def available_memory_bytes(device: torch.device) -> int:
    """Free memory on a CUDA device; on the CPU, the machine's physical memory."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def regrow(
    neighbours: NeighbourList, state: State, *, max_edges_per_atom: float | None = None
) -> tuple[NeighbourList, Edges]:
    """A list planned again for ``state`` with the exceeded capacities enlarged, and its edges.

    Raises SimulationError, before anything is allocated, when the edges found exceed
    ``max_edges_per_atom`` per atom (by default the count at MAX_NUMBER_DENSITY_PER_A3 within
    the list's radius) or the grown list would not fit in the memory available. Raises
    RuntimeError if even the new list cannot hold ``state``'s pairs: that is a bug, since it is
    sized from them.
    """
    _check_growth(neighbours, state, max_edges_per_atom)
    grown = neighbours.grown(state)
    edges = grown.build(state)
    if overflowed(edges):
        raise RuntimeError(
            f"a neighbour list planned for this state overflowed (capacity {grown.capacity}, "
            f"bin capacity {grown.bin_capacity}); please report this with the structure"
        )
    return grown, edges


def _check_growth(neighbours: NeighbourList, state: State, bound: float | None) -> None:
    found = neighbours.peak_count
    n_atoms = state.n_atoms
    if bound is None:
        bound = max_edges_per_atom(neighbours.radius)
    per_atom = found / n_atoms
    if per_atom > bound:
        density = per_atom / (4.0 / 3.0 * math.pi * neighbours.radius**3)
        raise SimulationError(
            f"the atoms are collapsing: the neighbour list found {found} edges, {per_atom:.0f} "
            f"per atom within {neighbours.radius:.2f} Å (a number density of {density:.3g} "
            f"atoms/Å^3), above the bound of {bound:.0f} per atom; the run stops instead of "
            "growing the list further. Lower the pressure or the timestep, check the structure "
            "and its cell, or check that the model covers these elements"
        )
    asked = math.ceil(found * neighbours.headroom)
    needed = asked * BYTES_PER_EDGE
    available = available_memory_bytes(state.device)
    if needed > available:
        raise SimulationError(
            f"the neighbour list asks for {asked} edges ({needed / 2**30:.1f} GiB), more than "
            f"the {available / 2**30:.1f} GiB available on {state.device}; the system is too "
            "large or too dense for this device: run fewer or smaller systems, or on a device "
            "with more memory"
        )
