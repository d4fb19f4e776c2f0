"""torch.compile of the model (EngineConfig.compile): the same dynamics, caches in the cache root,
one compilation for every list capacity, and a failed compilation the planner chose runs on
uncompiled.

Compilation is real (Inductor's C++ backend on the CPU, about a minute cold on two cores for
conftest's one-interaction copper model, two for the demo model), so the first test is one run
that checks everything at once.
"""

from __future__ import annotations

import os

import ase.build
import numpy as np
import pytest
import torch._dynamo
import torch._inductor.config
from torch._dynamo.utils import counters

from fastmace.dynamics.ensembles import ensemble
from fastmace.dynamics.neighbours import NeighbourList
from fastmace.dynamics.potential import Potential
from fastmace.dynamics.species_linear import SpeciesLinear
from fastmace.dynamics.state import State
from fastmace.io import OutputSchedule
from fastmace.machine import probe_availabilities
from fastmace.models.load import load
from fastmace.planner import EngineConfig, EngineSettings, Workload, make_plan
from fastmace.runtime import environment
from fastmace.runtime.compile_costs import recorded_cost_s
from fastmace.simulation import RunSettings, Simulation, compile_identity


def test_compiled_model_runs_the_same_dynamics(
    tmp_path, monkeypatch, one_interaction_copper, header_precompiles
):
    monkeypatch.setenv("FASTMACE_CACHE", str(tmp_path / "cache"))
    for name in (environment.TORCHINDUCTOR_CACHE_DIR.name, environment.TRITON_CACHE_DIR.name,
                 *environment.COMPILE_CACHE_FLAGS):  # fmt: skip
        monkeypatch.delenv(name, raising=False)  # restored afterwards: compiling sets them
    # What is checked is how any model is compiled: the smaller one compiles in half the time.
    model = load(one_interaction_copper)
    atoms = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 1, 1))
    atoms.rattle(0.02, seed=3)

    # The compiled run is planned, as fm.md's runs are: a planned run that compiles keeps what
    # its compilation cost in the cache, for the next plan of the same model and size.
    workload = Workload.from_structures(
        [atoms], temperature_K=300.0, steps=10, timestep_fs=2.0, device="cpu"
    )
    plan = make_plan(workload, EngineConfig(compile=True, block_steps=5), probe_availabilities())
    identity = compile_identity(model, plan)
    assert recorded_cost_s(identity) is None

    def run(compile: bool) -> Simulation:
        settings = RunSettings(
            ensemble=ensemble("nvt", temperature_K=300.0), steps=10, timestep_fs=2.0, seed=7,
            schedule=OutputSchedule(0, 0, 0), initial_temperature_K=300.0,
        )  # fmt: skip
        engine = EngineSettings(block_steps=5, compile=compile)  # how fm.md's plan says it
        simulation = Simulation(
            model, [atoms], settings, engine=None if compile else engine,
            plan=plan if compile else None,
        )  # fmt: skip
        simulation.result = simulation.run()
        return simulation

    eager = run(False)
    # Random weights: a real trajectory, not NaNs (which assert_allclose takes as equal).
    assert np.isfinite(eager.result.structures[0].positions).all()
    torch._dynamo.reset()
    counters.clear()
    compiled = run(True)
    assert compiled.potential.compiled and not eager.potential.compiled
    assert counters["stats"]["unique_graphs"] == 1
    # The first compiled call (its compilation included) is what the record says it cost.
    seconds = compiled.potential.first_compiled_call_s
    assert seconds is not None and seconds > 0
    assert recorded_cost_s(identity) == pytest.approx(seconds, abs=1e-3)
    assert eager.potential.first_compiled_call_s is None
    # Edges of another capacity, as after a regrowth, run on the same compiled graph: the
    # number of edges is a symbolic size.
    state, potential = compiled.engine.md.state, compiled.potential
    larger = NeighbourList(
        state, potential.r_max, 0.5, cutoff_capacity=2 * compiled.neighbours.cutoff_capacity
    )
    edges = larger.cutoff_edges(state, larger.build(state))
    assert edges.capacity == 2 * compiled.neighbours.cutoff_capacity
    np.testing.assert_allclose(
        potential(state, edges).forces.numpy(),
        eager.potential(state, edges).forces.numpy(),
        atol=1e-10,
    )
    assert counters["stats"]["unique_graphs"] == 1
    # The stress for output (thermo rows) of a run whose steps need none is evaluated
    # uncompiled: no second graph, with the strain, compiled for it.
    np.testing.assert_allclose(
        compiled.engine.force_field.stress_at(state).numpy(),
        eager.engine.force_field.stress_at(state).numpy(),
        atol=1e-12,
    )
    assert counters["stats"]["unique_graphs"] == 1
    np.testing.assert_allclose(
        compiled.result.structures[0].positions, eager.result.structures[0].positions, atol=1e-10
    )
    # The caller's model is left as it was (the potential runs a specialised copy, and
    # compilation works on a rebuilt copy of that, with its replaced skip_tp carried over).
    assert compiled.potential.model is not model.module
    assert not any(isinstance(m, SpeciesLinear) for m in model.module.modules())
    assert any(isinstance(m, SpeciesLinear) for m in compiled.potential.model.modules())
    # Inductor's caches went to the cache root, as docs/environment.md says.
    assert (tmp_path / "cache" / "inductor").is_dir()
    assert os.environ[environment.TORCHINDUCTOR_CACHE_DIR.name] == str(
        tmp_path / "cache" / "inductor"
    )
    # No precompiled header: nothing was locked in Inductor's shared default directory.
    assert header_precompiles == []


def test_failed_compilation_the_planner_chose_runs_uncompiled(
    tmp_path, monkeypatch, one_interaction_copper
):
    """A compute node without a C++ compiler: Inductor's CPU backend fails for real."""
    monkeypatch.setenv("FASTMACE_CACHE", str(tmp_path / "cache"))
    for name in (environment.TORCHINDUCTOR_CACHE_DIR.name, environment.TRITON_CACHE_DIR.name,
                 *environment.COMPILE_CACHE_FLAGS):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    torch._dynamo.reset()
    model = load(one_interaction_copper)  # smaller than the demo: less to trace before failing
    atoms = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True)
    atoms.rattle(0.02, seed=4)
    state = State.from_atoms(atoms)
    uncompiled = Potential.from_loaded(model, state.atomic_numbers)
    neighbours = NeighbourList(state, uncompiled.r_max, 0.5)
    edges = neighbours.cutoff_edges(state, neighbours.build(state))
    eager = uncompiled(state, edges)
    chosen = Potential.from_loaded(model, state.atomic_numbers, compile=True, compile_fallback=True)
    missing_compiler = {"cpp.cxx": (str(tmp_path / "no-such-c++"),)}
    with (
        torch._inductor.config.patch(missing_compiler),
        pytest.warns(RuntimeWarning, match="could not compile this model.*runs uncompiled"),
    ):
        output = chosen(state, edges)
    assert not chosen.compiled and "no-such-c++" in (chosen.compile_failure or "")
    np.testing.assert_allclose(output.forces.numpy(), eager.forces.numpy(), atol=1e-12)
    # Once given up, compilation is not tried again.
    np.testing.assert_allclose(chosen(state, edges).energy.numpy(), eager.energy.numpy())
