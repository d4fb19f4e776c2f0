"""Ensembles by name: which integrator, with which of the user's parameters.

The engine and the entry points (``fm.md``, ``fastmace md``, ``fastmace run``) speak of
ensembles ("nve", "nvt", "npt"...); this module turns a name and the user's settings into the
integrator's init and step functions. Parameter checks happen in the integrators' init.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastmace.dynamics import integrators
from fastmace.dynamics.integrators import ComputeFn, MDState, RandomStreams
from fastmace.dynamics.integrators.streams import Seed
from fastmace.dynamics.state import State
from fastmace.vocabulary import (
    ENSEMBLE_TAKES,
    EnsembleError,
    bind_ensemble,
    takes_pressure,
)

__all__ = ["Ensemble", "EnsembleError", "ensemble"]

# name -> (init, step, stochastic); what each takes is in fastmace.vocabulary.ENSEMBLE_TAKES.
_TABLE: dict[str, tuple[Callable, Callable, bool]] = {
    "nve": (integrators.nve_init, integrators.nve_step, False),
    "nvt-langevin": (integrators.langevin_init, integrators.langevin_step, True),
    "nvt-csvr": (integrators.csvr_init, integrators.csvr_step, True),
    "nvt-nose-hoover": (
        integrators.nose_hoover_chain_init, integrators.nose_hoover_chain_step, False,
    ),
    "npt": (integrators.npt_init, integrators.npt_step, True),
}  # fmt: skip


@dataclass(frozen=True)
class Ensemble:
    """A named integrator with the user's settings bound."""

    name: str
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def needs_stress(self) -> bool:
        return takes_pressure(self.name)  # a barostat reads the stress every step

    @property
    def stochastic(self) -> bool:
        return _TABLE[self.name][2]

    def init(
        self, state: State, compute: ComputeFn, timestep_fs: float, rng: Seed | RandomStreams
    ) -> MDState:
        """The integrator's start; ``rng`` (seeds, generators or streams) feeds a stochastic one."""
        init = _TABLE[self.name][0]
        extra = {"rng": rng} if self.stochastic else {}
        return init(state, compute, timestep_fs=timestep_fs, **self.settings, **extra)

    @property
    def step(self) -> Callable[[MDState, ComputeFn], MDState]:
        return _TABLE[self.name][1]

    def resolved_settings(self) -> dict[str, Any]:
        """Every setting the integrator runs with: those given, and its defaults for the rest
        (so that a setting left out and the same setting given at its default compare equal)."""
        parameters = inspect.signature(_TABLE[self.name][0]).parameters
        defaults = {
            name: parameters[name].default
            for name in ENSEMBLE_TAKES[self.name]
            if name in parameters
            and parameters[name].default not in (None, inspect.Parameter.empty)
        }
        return {**defaults, **self.settings}

    def describe(self) -> str:
        settings = ", ".join(f"{key}={value}" for key, value in self.settings.items())
        return f"{self.name}" + (f" ({settings})" if settings else "")


def ensemble(name: str, **settings: Any) -> Ensemble:
    """The ensemble ``name`` (or an alias) with ``settings``; None values are left out."""
    return Ensemble(*bind_ensemble(name, settings))
