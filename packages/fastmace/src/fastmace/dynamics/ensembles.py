"""Ensembles by name: which integrator, with which of the user's parameters.

The engine and the entry points (``fm.md``, ``fastmace md``, ``fastmace run``) speak of
ensembles ("nve", "nvt", "npt"...); this module turns a name and the user's settings into the
integrator's init and step functions, as its descriptor (:mod:`fastmace.ensemble_catalog`)
names them. Parameter checks happen in the integrators' init.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastmace.dynamics.integrators import ComputeFn, MDState, RandomStreams
from fastmace.dynamics.integrators.streams import Seed
from fastmace.dynamics.state import State
from fastmace.ensemble_catalog import (
    EnsembleDescriptor,
    EnsembleError,
    bind_ensemble,
    descriptor,
)

__all__ = ["Ensemble", "EnsembleError", "ensemble"]


def _function(reference: str | Callable[..., Any]) -> Callable[..., Any]:
    """The function a descriptor names as ``"module:function"`` (or holds itself)."""
    if callable(reference):
        return reference
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Ensemble:
    """A named integrator with the user's settings bound."""

    name: str
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def descriptor(self) -> EnsembleDescriptor:
        return descriptor(self.name)

    @property
    def needs_stress(self) -> bool:
        return self.descriptor.barostat  # a barostat reads the stress every step

    @property
    def stochastic(self) -> bool:
        return self.descriptor.stochastic

    def init(
        self, state: State, compute: ComputeFn, timestep_fs: float, rng: Seed | RandomStreams
    ) -> MDState:
        """The integrator's start; ``rng`` (seeds, generators or streams) feeds a stochastic one."""
        init = _function(self.descriptor.init)
        extra = {"rng": rng} if self.stochastic else {}
        return init(state, compute, timestep_fs=timestep_fs, **self.settings, **extra)

    @property
    def step(self) -> Callable[[MDState, ComputeFn], MDState]:
        return _function(self.descriptor.step)

    def resolved_settings(self) -> dict[str, Any]:
        """Every setting the integrator runs with: those given, and the defaults for the rest
        (so that a setting left out and the same setting given at its default compare equal)."""
        return {**self.descriptor.defaults(), **self.settings}

    def describe(self) -> str:
        settings = ", ".join(f"{key}={value}" for key, value in self.settings.items())
        return f"{self.name}" + (f" ({settings})" if settings else "")


def ensemble(name: str, **settings: Any) -> Ensemble:
    """The ensemble ``name`` (or an alias) with ``settings``; None values are left out."""
    return Ensemble(*bind_ensemble(name, settings))
