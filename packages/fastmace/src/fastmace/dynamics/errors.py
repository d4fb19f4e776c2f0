"""The errors that stop a run because its dynamics went wrong."""

from __future__ import annotations

from dataclasses import dataclass


class SimulationError(RuntimeError):
    """The dynamics blew up (a non-finite energy, force or position) or collapsed (a neighbour
    list that would not stop growing)."""


@dataclass(frozen=True)
class Breach:
    """One bound of the guard that one system crossed."""

    quantity: str
    """What was out of bounds: "temperature", "energy", "force", "volume" or "displacement"."""
    system: int
    value: float
    bound: float
    unit: str
    why: str
    """Where the bound comes from, e.g. "10 x 300 K (temperature_factor)"."""


class GuardError(SimulationError):
    """A system left the guard's physical bounds (fastmace.dynamics.guard); ``breaches`` says
    which quantity of which system, with its value and the bound."""

    def __init__(self, message: str, breaches: list[Breach]) -> None:
        super().__init__(message)
        self.breaches = breaches
