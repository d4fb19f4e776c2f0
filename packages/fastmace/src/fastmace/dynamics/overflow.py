"""After a neighbour-list overflow: the one place that grows the list and builds it again.

The engine (a block that overflowed), the run's set-up (the first forces) and the ASE
calculator (a call) all recover the same way, through :func:`regrow`. It reads back to the
host, so it runs between blocks, never inside a captured one.
"""

from __future__ import annotations

from fastmace.dynamics.edges import Edges
from fastmace.dynamics.neighbours import NeighbourList
from fastmace.dynamics.state import State


def overflowed(edges: Edges) -> bool:
    """Whether ``edges`` overflowed since they were built (one host read)."""
    return bool(edges.overflow)


def regrow(neighbours: NeighbourList, state: State) -> tuple[NeighbourList, Edges]:
    """A list planned again for ``state`` with the exceeded capacities enlarged, and its edges.

    Raises RuntimeError if even the new list cannot hold ``state``'s pairs: that is a bug,
    since it is sized from them.
    """
    grown = neighbours.grown(state)
    edges = grown.build(state)
    if overflowed(edges):
        raise RuntimeError(
            f"a neighbour list planned for this state overflowed (capacity {grown.capacity}, "
            f"bin capacity {grown.bin_capacity}); please report this with the structure"
        )
    return grown, edges
