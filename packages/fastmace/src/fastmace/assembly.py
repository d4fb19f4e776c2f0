"""The engine's parts built from the plan's EngineSettings, in one place for every caller.

:class:`~fastmace.simulation.Simulation`, :class:`~fastmace.relaxation.Relaxation` and the ASE
calculator build their potential and neighbour list here (and the first two their dispersion
term, force field and first forces), so that a setting of
:class:`~fastmace.planner.EngineSettings` reaches all of them or none (a setting accepted and
then dropped by one of two copies is how ``fm.relax(compile=True)`` once ran uncompiled).
``tests/test_assembly.py`` reads each setting back from what they built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import torch

from fastmace.dynamics.dispersion import DispersionTerm
from fastmace.dynamics.engine import ForceField
from fastmace.dynamics.neighbours import NeighbourList
from fastmace.dynamics.overflow import overflowed, regrow
from fastmace.dynamics.polar import charge_tensors
from fastmace.dynamics.potential import Potential
from fastmace.dynamics.state import State
from fastmace.models.load import LoadedModel
from fastmace.planner import EngineSettings


def potential(
    model: LoadedModel, atomic_numbers: Iterable[int] | torch.Tensor, settings: EngineSettings
) -> Potential:
    """The potential of ``model`` for these elements, with every setting of ``settings`` that
    concerns it (compilation, GEMM precision, radial tables, the product basis, the
    convolution, edge chunks). FastMACE's own product basis and convolution fall back to
    cuEquivariance's when they fail their checks, forced or not: a kernel that disagrees must
    not stop a run that has a checked one."""
    return Potential.from_loaded(
        model,
        atomic_numbers,
        compile=settings.compile,
        compile_fallback=settings.compile_fallback,
        matmul_precision=settings.matmul_precision,
        radial_table=settings.radial_table,
        radial_table_fallback=settings.radial_table_fallback,
        product_basis=settings.product_basis,
        product_basis_fallback=True,
        fused_convolution=settings.fused_convolution,
        fused_convolution_fallback=True,
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


def dispersion(
    state: State, functional: str | None, settings: EngineSettings, *, three_body: bool
) -> DispersionTerm | None:
    """D3(BJ) for ``functional`` on a neighbour list of its own with the settings' skin (None:
    no dispersion asked). ``three_body`` adds the Axilrod-Teller-Muto term."""
    if functional is None:
        return None
    return DispersionTerm.for_state(state, functional, settings.skin_A, three_body=three_body)


def force_field(
    state: State,
    potential: Potential,
    neighbours: NeighbourList,
    *,
    stress: bool,
    dispersion: DispersionTerm | None = None,
    charges: Sequence[float] | None = None,
    spins: Sequence[float] | None = None,
    edges: Any = None,
) -> ForceField:
    """The force field the engine evaluates: the potential on ``neighbours``' edges (built
    from ``state`` unless ``edges`` are given, as a restart's are), the dispersion term, and
    each system's charge and spin for a long-range model."""
    return ForceField(
        potential, neighbours, neighbours.build(state) if edges is None else edges,
        stress=stress, dispersion=dispersion,
        **charge_tensors(charges, spins, state.device),
    )  # fmt: skip


Start = TypeVar("Start")


def first_forces(start: Callable[[], Start], field: ForceField, state: State) -> Start:
    """``start()``, which computes the first forces (an integrator's or FIRE's initial
    state), repeated with a larger list until the list holds every edge: a list sized by
    estimate may be too small for the structure, and only an evaluation finds out. The
    overflow flag is read on the host once per attempt, outside the hot path."""
    while True:
        started = start()
        if not overflowed(field.edges):
            return started
        field.neighbours, field.edges = regrow(field.neighbours, state)
