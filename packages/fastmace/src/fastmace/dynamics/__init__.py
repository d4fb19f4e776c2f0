"""The MD engine: batched device state, neighbour list, potential, integrators, captured step.

Users run it through :func:`fastmace.md` (:mod:`fastmace.api`); docs/architecture.md traces
one step through these modules.
"""
