"""The error that stops a run because its dynamics went wrong."""

from __future__ import annotations


class SimulationError(RuntimeError):
    """The dynamics blew up (a non-finite energy, force or position) or collapsed (a neighbour
    list that would not stop growing)."""
