"""The captured engine on a GPU (marked ``gpu``; run on the GPU test machine).

Captured (CUDA graph) and uncaptured runs must give the same trajectory within rounding, a
neighbour-list overflow inside a captured block must be recovered, and the physical guard must
run inside the graph without host synchronisation and stop a blow-up.
"""

from __future__ import annotations

import ase.build
import numpy as np
import pytest
import torch

from fastmace.dynamics.ensembles import ensemble
from fastmace.dynamics.neighbours import NeighbourList
from fastmace.io import OutputSchedule
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


# --- The guard inside the captured block -------------------------------------------------------


def test_the_guard_runs_inside_the_graph_without_host_synchronisation():
    """Warm-up and replays of a guarded block raise under CUDA's sync debug mode if anything
    in them synchronises; the guard's values after a replay are those of the block's end."""
    from fastmace.dynamics.guard import QUANTITIES

    model = load("template:mp0-small", backend="cueq", device="cuda", dtype="float32")
    simulation = Simulation(model, [nacl()], settings("nvt"), engine=engine(True))
    run, guard = simulation.engine, simulation.guard
    torch.cuda.set_sync_debug_mode("error")
    try:
        run._launch(run.block_steps)  # the eager warm-up
    finally:
        torch.cuda.set_sync_debug_mode("default")
    run._launch(run.block_steps)  # the capture (capturing itself synchronises)
    for _ in range(2):
        torch.cuda.set_sync_debug_mode("error")
        try:
            run._launch(run.block_steps)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert run.last_launch == "replay"
        torch.cuda.synchronize()
        assert torch.allclose(guard.values[:, 0], run.md.temperature())
    guard.check(guard.values.cpu(), steps=(0, run.block_steps))  # a sound run: no breach
    assert guard.values.shape == (1, len(QUANTITIES))


def test_a_blow_up_inside_captured_blocks_stops_the_run():
    from fastmace.dynamics.errors import GuardError

    model = load("demo-emt-cu", device="cuda")
    copper = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat(2)
    hot = RunSettings(
        ensemble=ensemble("nvt", temperature_K=20_000.0), steps=400, timestep_fs=10.0, seed=3,
        schedule=OutputSchedule(0, 0, 0),
        initial_temperature_K=300.0,  # heated by the thermostat: blows up after a few blocks
    )  # fmt: skip
    blocks = EngineSettings(device="cuda", block_steps=10)
    simulation = Simulation(model, [copper], hot, engine=blocks)
    with pytest.raises(GuardError, match="system 0's temperature"):
        simulation.run()
    assert simulation.engine.capture and simulation.engine.last_launch == "replay"


def test_a_failed_capture_hands_its_pool_back_before_the_eager_blocks(monkeypatch):
    """A capture that runs out of memory gives graphs up for the run; the eager blocks that
    follow must not run beside the failed graph's pool (at a million atoms it held 131 GiB)."""
    model = load("template:mp0-small", backend="cueq", device="cuda", dtype="float32")
    simulation = Simulation(model, [nacl()], settings("nvt"), engine=engine(True))
    run_engine = simulation.engine
    pool_bytes = 2**30

    def capture_out_of_memory(long_search: bool) -> None:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            held = torch.empty(pool_bytes, dtype=torch.uint8, device="cuda")  # in the pool
            raise torch.cuda.OutOfMemoryError(f"the graph's pool is full ({held.numel()} B)")

    allocated_at_eager_blocks: list[int] = []
    eager = run_engine._run_eager

    def eager_measured(*args, **kwargs) -> None:
        allocated_at_eager_blocks.append(torch.cuda.memory_allocated())
        eager(*args, **kwargs)

    monkeypatch.setattr(run_engine, "_capture", capture_out_of_memory)
    monkeypatch.setattr(run_engine, "_run_eager", eager_measured)
    result = simulation.run()
    assert result.structures[0].positions.shape == (len(nacl()), 3)
    assert not run_engine.capture
    assert "graph's pool is full" in run_engine.capture_failure
    warm_up, after_failure = allocated_at_eager_blocks[0], allocated_at_eager_blocks[1:]
    assert after_failure, "no eager block ran after the failed capture"
    assert max(after_failure) < warm_up + pool_bytes // 2, (warm_up, after_failure)


def test_a_block_whose_graph_would_not_fit_runs_eagerly_and_says_why(monkeypatch):
    from fastmace.dynamics import engine as engine_module

    # As if the graph's pool needed far more than the device has (a million atoms on an H200).
    monkeypatch.setattr(engine_module, "CAPTURE_POOL_FACTOR", 1e12)
    model = load("template:mp0-small", backend="cueq", device="cuda", dtype="float32")
    simulation = Simulation(model, [nacl()], settings("nvt"), engine=engine(True))
    simulation.run()
    assert not simulation.engine.capture and not simulation.engine.graphs
    assert simulation.engine.capture_failure.startswith("not captured: a block's graph")
