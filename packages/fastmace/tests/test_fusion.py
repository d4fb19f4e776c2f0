"""The step's own arithmetic fused by Inductor (dynamics/fusion.py), compiled for real on the CPU.

The engine with ``fuse=True`` runs the integrator, the skin test, the list's compaction and
the guard's running maximum through torch.compile; the trajectory must be the one the same
engine computes eagerly, up to the rounding of a reordered sum. The launches this saves are
measured on the GPU (docs/validation/performance.md), not here.
"""

from __future__ import annotations

import ase.build
import pytest
import torch
from conftest import model_edges
from torch._dynamo.utils import counters

from fastmace.dynamics import fusion
from fastmace.dynamics.engine import Engine, ForceField
from fastmace.dynamics.guard import Guard
from fastmace.dynamics.integrators import (
    langevin_init,
    langevin_step,
    maxwell_boltzmann_velocities,
    nve_init,
    nve_step,
)
from fastmace.dynamics.neighbours import NeighbourList
from fastmace.dynamics.potential import Potential
from fastmace.dynamics.state import State
from fastmace.planner.guard import GuardConfig


def _engine(demo, integrator: str, fuse: bool) -> Engine:
    atoms = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat(2)
    atoms.rattle(0.05, seed=4)
    state = maxwell_boltzmann_velocities(State.from_atoms(atoms), 600.0, 2)
    potential = Potential.from_loaded(demo, state.atomic_numbers)
    neighbours = NeighbourList(state, potential.r_max, 0.5)
    field = ForceField(potential, neighbours, neighbours.build(state), stress=False)
    if integrator == "langevin":
        md = langevin_init(state, field, timestep_fs=2.0, temperature_K=300.0, rng=7)
        step = langevin_step
    else:
        md = nve_init(state, field, timestep_fs=2.0)
        step = nve_step
    guard = Guard(md, GuardConfig(), skin_A=neighbours.skin)
    return Engine(md, step, field, block_steps=8, guard=guard, fuse=fuse)


@pytest.mark.parametrize("integrator", ["langevin", "nve"])
def test_fused_steps_follow_the_eager_trajectory(demo, integrator):
    compiled_before = counters["stats"]["unique_graphs"]
    eager, fused = _engine(demo, integrator, False), _engine(demo, integrator, True)
    for _ in range(2):  # a block has a search step and seven skin checks
        eager.run_block()
        fused.run_block()
    step_failures = {k: v for k, v in fusion.fusion_failures().items() if "<locals>" not in k}
    assert step_failures == {}  # (the tests' own local functions may fail on purpose)
    # Compiled for real: Dynamo made graphs of the step's functions.
    assert counters["stats"]["unique_graphs"] > compiled_before
    for mine, theirs in [
        (fused.md.state.positions, eager.md.state.positions),
        (fused.md.state.velocities, eager.md.state.velocities),
        (fused.md.forces, eager.md.forces),
        (fused.guard.values, eager.guard.values),
        (fused.force_field.neighbours.largest_move, eager.force_field.neighbours.largest_move),
    ]:
        assert torch.allclose(mine, theirs, rtol=1e-10, atol=1e-12), (mine - theirs).abs().max()
    assert torch.equal(fused.force_field.edges.edge_index, eager.force_field.edges.edge_index)
    moved = (fused.md.state.positions - fused.force_field.neighbours.reference()[0]).abs()
    assert moved.max() > 0  # the atoms moved since the last search: the checks had work
    if integrator == "langevin":
        assert torch.allclose(fused.md.thermostat_energy, eager.md.thermostat_energy, rtol=1e-10)


def test_a_fused_evaluation_gives_the_eager_energies_forces_and_stresses(demo):
    """The potential's own arithmetic around the model (edge vectors under strain, padding,
    node inputs, energies per system, forces and stresses) fused, on a batch of a periodic
    cell and a cluster: the eager results up to rounding, and every part compiled."""
    crystal = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat(2)
    crystal.rattle(0.05, seed=5)
    cluster = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True)
    cluster.pbc, cluster.cell = False, None
    state = State.from_atoms([crystal, cluster])
    potential = Potential.from_loaded(demo, state.atomic_numbers)
    edges = model_edges(state, potential.r_max)
    eager = potential(state, edges, compute_stress=True)
    compiled_before = counters["stats"]["unique_graphs"]
    with fusion.fusing():
        fused = potential(state, edges, compute_stress=True)
    assert counters["stats"]["unique_graphs"] >= compiled_before + 5  # the potential's parts
    assert not [name for name in fusion.fusion_failures() if "<locals>" not in name]
    for quantity in ("energy", "forces", "virial", "stress"):
        mine, theirs = getattr(fused, quantity), getattr(eager, quantity)
        assert torch.allclose(mine, theirs, rtol=1e-10, atol=1e-12), quantity
    assert fused.stress[0].abs().max() > 0 and not fused.stress[1].any()  # the cluster's is 0


def test_fusible_functions_run_as_written_outside_fusing():
    calls = counters["stats"]["calls_captured"]

    @fusion.fusible
    def doubled(x: torch.Tensor) -> torch.Tensor:
        return 2 * x + 1

    assert torch.equal(doubled(torch.ones(3)), torch.full((3,), 3.0))
    with fusion.fusing(False):
        doubled(torch.ones(3))
    assert counters["stats"]["calls_captured"] == calls  # nothing traced


def test_a_function_that_cannot_be_fused_runs_as_written_and_is_named():
    @fusion.fusible
    def reads_the_host(x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # a branch on a value: no single graph (Dynamo refuses it)
            return x
        return -x

    with fusion.fusing(), pytest.warns(RuntimeWarning, match="could not be fused"):
        out = reads_the_host(torch.ones(2))
    assert torch.equal(out, torch.ones(2))
    failures = fusion.fusion_failures()
    assert any("reads_the_host" in name for name in failures), failures
    with fusion.fusing():  # given up: no second attempt, no second warning
        assert torch.equal(reads_the_host(torch.ones(2)), torch.ones(2))
