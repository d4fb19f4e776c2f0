"""The engine's parts built from the plan's EngineSettings, in one place for every caller.

:class:`~fastmace.simulation.Simulation`, :class:`~fastmace.relaxation.Relaxation` and the ASE
calculator build their potential and neighbour list here, so that a setting of
:class:`~fastmace.planner.EngineSettings` reaches all of them or none (a setting accepted and
then dropped by one of two copies is how ``fm.relax(compile=True)`` once ran uncompiled).
``tests/test_assembly.py`` reads each setting back from what they built.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from fastmace.dynamics.neighbours import NeighbourList
from fastmace.dynamics.potential import Potential
from fastmace.dynamics.state import State
from fastmace.models.load import LoadedModel
from fastmace.planner import EngineSettings


def potential(
    model: LoadedModel, atomic_numbers: Iterable[int] | torch.Tensor, settings: EngineSettings
) -> Potential:
    """The potential of ``model`` for these elements, with every setting of ``settings`` that
    concerns it (compilation, GEMM precision, radial tables, edge chunks)."""
    return Potential.from_loaded(
        model,
        atomic_numbers,
        compile=settings.compile,
        compile_fallback=settings.compile_fallback,
        matmul_precision=settings.matmul_precision,
        radial_table=settings.radial_table,
        radial_table_fallback=settings.radial_table_fallback,
        edge_chunk_rows=settings.edge_chunk_rows,
    )


def neighbour_list(
    state: State, potential: Potential, settings: EngineSettings, **kept: Any
) -> NeighbourList:
    """A neighbour list for ``state`` at the potential's cutoff with the settings' skin, edge
    capacity and headroom; ``kept`` overrides sizes a restart recorded (capacity included)."""
    capacity = kept.pop("capacity", settings.edge_capacity)
    return NeighbourList(
        state, potential.r_max, settings.skin_A, capacity, headroom=settings.headroom, **kept
    )
