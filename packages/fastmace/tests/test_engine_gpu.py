"""The captured engine on a GPU (marked ``gpu``; run on the GPU test machine).

Captured (CUDA graph) and uncaptured runs must give the same trajectory within rounding, and a
neighbour-list overflow inside a captured block must be recovered.
"""

from __future__ import annotations

import ase.build
import numpy as np
import pytest
import torch

from fastmace.dynamics.ensembles import ensemble
from fastmace.dynamics.neighbours import NeighbourList
from fastmace.models.load import load
from fastmace.planner import EngineSettings
from fastmace.simulation import RunSettings, Simulation

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def nacl() -> ase.Atoms:
    atoms = ase.build.bulk("NaCl", "rocksalt", a=5.64, cubic=True).repeat(3)
    atoms.rattle(0.02, seed=2)
    return atoms


def engine(capture: bool) -> EngineSettings:
    return EngineSettings(device="cuda", block_steps=20, graphs=capture)


def settings(ensemble_name: str = "nvt") -> RunSettings:
    from fastmace.io import OutputSchedule

    chosen = ensemble("nve") if ensemble_name == "nve" else ensemble("nvt", temperature_K=600.0)
    return RunSettings(
        ensemble=chosen,
        steps=200,
        timestep_fs=2.0,
        seed=3,
        schedule=OutputSchedule(0, 0, 0),
        initial_temperature_K=600.0,
    )


@pytest.mark.parametrize("backend", ["cueq", "hybrid"])
@pytest.mark.parametrize("ensemble_name", ["nve", "nvt"])
def test_captured_and_uncaptured_runs_agree(backend, ensemble_name):
    model = load("template:mp0-small", backend=backend, device="cuda", dtype="float32")
    runs = [
        Simulation(model, [nacl()], settings(ensemble_name), engine=engine(capture)).run()
        for capture in (True, False)
    ]
    captured, eager = (r.structures[0] for r in runs)
    difference = np.abs(captured.positions - eager.positions).max()
    # 200 steps of float32 forces: trajectories separate slowly through rounding only.
    assert difference < 1e-6, difference


def test_overflow_inside_a_captured_block_is_recovered():
    model = load("template:mp0-small", backend="cueq", device="cuda", dtype="float32")
    reference = Simulation(model, [nacl()], settings("nve"), engine=engine(True)).run()
    small = Simulation(model, [nacl()], settings("nve"), engine=engine(True))
    state = small.engine.md.state
    # Exactly the edges of the start and a thin skin: with atoms moving at 600 K the list is
    # rebuilt every few steps, and one of those rebuilds finds more pairs than there is room.
    exact = NeighbourList(state, small.potential.r_max, 0.1).required_capacity(state)
    tight = NeighbourList(state, small.potential.r_max, 0.1, exact)
    small.engine.force_field.neighbours = tight
    small.engine.force_field.edges = tight.build(state)
    result = small.run()
    assert small.engine.regrowths >= 1
    difference = np.abs(result.structures[0].positions - reference.structures[0].positions).max()
    assert difference < 1e-6, difference
