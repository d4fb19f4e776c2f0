"""The MD engine: batched device state, neighbour list, potential, integrators, captured step."""
