"""How many padding nodes a batch gets: the nodes that take a neighbour list's unused slots.

The padding edges are spread over one node per :data:`ATOMS_PER_PADDING_NODE` atoms (one node
summed about a million padding messages by atomic adds at a million atoms). A module of its
own so that the potential and its ahead-of-time trace (dynamics/aot_potential.py, which
imports nothing of potential.py) count them alike.
"""

from __future__ import annotations

# Atoms per padding node: an atom has tens to a hundred edge slots, a few tens of percent of
# them headroom, so a node takes a few hundred to a thousand padding edges; under 1 % more
# nodes. Counted from atoms, not edge slots, so the node count is fixed for a run: a regrown
# list changes only the number of edges, which a compiled model has symbolic (a new node
# count recompiled the model, 13 s at 13,824 atoms on an H200).
ATOMS_PER_PADDING_NODE = 128


def padding_nodes(n_atoms: int) -> int:
    """How many padding nodes a batch of ``n_atoms`` (at least one) atoms gets: one per 128
    atoms begun. The ahead-of-time trace takes the count as a size of its own
    (aot_potential._inputs), so that no condition on the atoms enters its graph."""
    return (n_atoms + ATOMS_PER_PADDING_NODE - 1) // ATOMS_PER_PADDING_NODE
