"""Runs end to end on the CPU with the shipped demo model: output, resume, errors, overflow."""

from __future__ import annotations

import csv
import io
import re

import numpy as np
import pytest
import torch
from conftest import copper, settings

import fastmace as fm
from fastmace.dynamics.checks import StructureError
from fastmace.dynamics.engine import SimulationError
from fastmace.dynamics.ensembles import EnsembleError, ensemble
from fastmace.io import OutputSchedule, RunDirectoryError, read_trajectory
from fastmace.planner import EngineSettings
from fastmace.simulation import Simulation


def test_run_writes_a_run_directory(demo, tmp_path):
    result = Simulation(demo, [copper()], settings(20), tmp_path / "run").run()
    run = tmp_path / "run"
    assert {p.name for p in run.iterdir()} >= {
        "run.json", "thermo.csv", "restart.npz", "report.txt", "trajectory.extxyz",
    }  # fmt: skip
    rows = list(csv.DictReader((run / "thermo.csv").open()))
    assert [int(r["step"]) for r in rows] == [0, 5, 10, 15, 20]
    assert all(float(r["temperature_K"]) > 0 and r["pressure_GPa"] for r in rows)
    frames = read_trajectory(run / "trajectory.extxyz")
    assert len(frames) == 5 and len(frames[0]) == 8
    assert result.steps == 20 and "demo-emt-cu" in (run / "report.txt").read_text()
    np.testing.assert_allclose(frames[-1].positions, result.structures[0].positions, atol=1e-7)


def test_resume_continues_bit_for_bit(demo, tmp_path):
    straight = Simulation(demo, [copper()], settings(20)).run()
    Simulation(demo, [copper()], settings(10), tmp_path / "run").run()
    resumed = Simulation(demo, [copper()], settings(20), tmp_path / "run", resume=True).run()
    assert resumed.steps == 20
    assert np.array_equal(resumed.structures[0].positions, straight.structures[0].positions)
    assert np.array_equal(resumed.structures[0].get_velocities(),
                          straight.structures[0].get_velocities())  # fmt: skip
    rows = list(csv.DictReader((tmp_path / "run" / "thermo.csv").open()))
    assert [int(r["step"]) for r in rows] == [0, 5, 10, 15, 20]  # no duplicate, no gap


def test_a_resume_from_a_later_restart_writes_the_unbroken_runs_thermo(demo, tmp_path):
    """Issue 33: resumed from step 10 (not 0), the run has the unbroken run's neighbour list
    (grid, every capacity, peaks), so even the virial, a sum over all the model's edge slots,
    rounds the same, and thermo.csv matches byte for byte (but the wall-clock speed)."""
    hot = dict(initial_temperature_K=900.0, schedule=OutputSchedule(5, 5, 10))
    atoms = copper((2, 2, 1))  # the pairs within the cutoff at step 10 differ from step 0's
    Simulation(demo, [atoms], settings(40, **hot), tmp_path / "straight").run()
    Simulation(demo, [atoms], settings(10, **hot), tmp_path / "resumed").run()
    resumed = Simulation(demo, [atoms], settings(40, **hot), tmp_path / "resumed", resume=True)
    resumed.run()

    def rows(run: str) -> list[dict[str, str]]:
        table = list(csv.DictReader((tmp_path / run / "thermo.csv").open()))
        return [{k: v for k, v in row.items() if k != "ns_per_day"} for row in table]

    assert [int(row["step"]) for row in rows("resumed")] == list(range(0, 41, 5))
    assert rows("resumed") == rows("straight")
    straight = np.load(tmp_path / "straight" / "restart.npz")
    again = np.load(tmp_path / "resumed" / "restart.npz")
    assert all(np.array_equal(straight[name], again[name]) for name in straight.files)


def test_a_full_disk_stops_the_run_with_what_to_do_and_gives_the_directory_up(
    demo, tmp_path, monkeypatch
):
    """Issue 33: a full disk gave a bare [Errno 28] and left run.lock behind (metadata.json
    could not be rewritten either). The disk fills at step 10, after the restart at step 10."""
    import errno

    from fastmace.io import DiskFullError, RunOutput

    full = OSError(errno.ENOSPC, "No space left on device")
    write_frames, write_metadata = RunOutput.write_frames, RunOutput.write_metadata

    def frames_until_full(self, step, *args, **kwargs):
        if step > 10:
            raise full
        return write_frames(self, step, *args, **kwargs)

    def metadata_until_full(self, metadata):
        if metadata.get("status") == "failed":
            raise full
        return write_metadata(self, metadata)

    monkeypatch.setattr(RunOutput, "write_frames", frames_until_full)
    monkeypatch.setattr(RunOutput, "write_metadata", metadata_until_full)
    run = tmp_path / "run"
    with pytest.raises(DiskFullError, match=r"disk holding .* is full .* step 10, is intact"):
        Simulation(demo, [copper()], settings(20), run).run()
    assert not (run / "run.lock").exists()  # a resume after freeing space is not refused
    monkeypatch.undo()
    resumed = Simulation(demo, [copper()], settings(20), run, resume=True).run()
    assert resumed.steps == 20


def test_a_run_directory_is_never_overwritten(demo, tmp_path):
    Simulation(demo, [copper()], settings(5), tmp_path / "run").run()
    before = (tmp_path / "run" / "thermo.csv").read_bytes()
    with pytest.raises(RunDirectoryError, match="resume"):
        Simulation(demo, [copper()], settings(5), tmp_path / "run")
    assert (tmp_path / "run" / "thermo.csv").read_bytes() == before


def test_neighbour_list_overflow_is_recovered(demo):
    reference = Simulation(demo, [copper()], settings(10)).run()
    small = Simulation(demo, [copper()], settings(10))
    # A list far too small for the structure: the first forces and every block must notice.
    from fastmace.dynamics.neighbours import NeighbourList

    state = small.engine.md.state
    tiny = NeighbourList(state, small.potential.r_max, 0.5, 8)
    small.engine.force_field.neighbours = tiny
    small.engine.force_field.edges = tiny.build(state)
    result = small.run()
    assert small.engine.regrowths >= 1
    np.testing.assert_allclose(
        result.structures[0].positions, reference.structures[0].positions, atol=1e-9
    )


NO_OUTPUT = OutputSchedule(0, 0, 0)  # blocks of block_steps: no output step splits them
HOT = dict(initial_temperature_K=900.0)


def every_step_search(simulation: Simulation) -> Simulation:
    simulation.engine.force_field.search_every = 1
    return simulation


def test_searching_every_few_steps_gives_the_every_step_trajectory(demo):
    hot, blocks = settings(24, schedule=NO_OUTPUT, **HOT), EngineSettings(block_steps=8)
    sparse = Simulation(demo, [copper()], hot, engine=blocks)
    assert sparse.engine.block_steps == 8 and sparse.engine.force_field.search_every > 1
    result = sparse.run()
    reference = every_step_search(Simulation(demo, [copper()], hot, engine=blocks)).run()
    # Different rebuild steps change only the order of the sums over edges.
    np.testing.assert_allclose(
        result.structures[0].positions, reference.structures[0].positions, atol=1e-9
    )


def test_a_stale_list_redoes_the_block_with_more_searches(demo):
    # A skin so thin that atoms at 900 K leave it within a few steps: the checks between
    # searches must catch it, and the redone blocks must give the every-step trajectory.
    hot, thin = settings(24, schedule=NO_OUTPUT, **HOT), EngineSettings(block_steps=8, skin_A=0.02)
    sparse = Simulation(demo, [copper()], hot, engine=thin)
    sparse.engine.force_field.search_every = 8
    result = sparse.run()
    assert sparse.engine.search_halvings >= 1
    assert sparse.engine.force_field.search_every < 8
    reference = every_step_search(Simulation(demo, [copper()], hot, engine=thin)).run()
    np.testing.assert_allclose(
        result.structures[0].positions, reference.structures[0].positions, atol=1e-9
    )


def test_resume_keeps_the_search_pattern(demo, tmp_path):
    thin = EngineSettings(skin_A=0.02)  # with blocks of 5 steps, checks trip at 900 K
    straight = Simulation(demo, [copper()], settings(20, **HOT), engine=thin).run()
    first = Simulation(demo, [copper()], settings(10, **HOT), tmp_path / "run", engine=thin)
    first.run()
    halved = first.engine.force_field.search_every
    resumed_run = Simulation(
        demo, [copper()], settings(20, **HOT), tmp_path / "run", engine=thin, resume=True
    )
    assert resumed_run.engine.force_field.search_every == halved
    resumed = resumed_run.run()
    assert np.array_equal(resumed.structures[0].positions, straight.structures[0].positions)


def test_explosion_stops_the_run_and_keeps_the_last_restart(demo, tmp_path):
    run = Simulation(
        demo, [copper()], settings(20, ensemble=ensemble("nve"), initial_temperature_K=None),
        tmp_path / "run",
    )  # fmt: skip
    # Input velocities are checked up front, so the blow-up is made inside the running state.
    run.engine.md.state.velocities[0, 0] = float("inf")
    with pytest.raises(SimulationError, match="blew up"):
        run.run()
    from fastmace.io import load_restart

    assert load_restart(tmp_path / "run" / "restart.npz").step == 0


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (lambda a: a.positions.__setitem__((1,), a.positions[0] + 0.2), StructureError, "apart"),
        (lambda a: a.positions.__setitem__((0, 0), np.nan), StructureError, "non-finite"),
        (lambda a: a.set_chemical_symbols(["H"] + ["Cu"] * 7), StructureError, "H, which"),
        (lambda a: a.set_cell(np.zeros((3, 3))), StructureError, "cell"),
    ],
    ids=["overlap", "nan", "species", "zero-cell"],
)
def test_bad_structures_are_refused_before_anything_runs(demo, tmp_path, change, error, match):
    atoms = copper()
    change(atoms)
    with pytest.raises(error, match=match):
        Simulation(demo, [atoms], settings(5), tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        ({"ensemble": "nvt", "temperature_K": -5.0}, ValueError, "temperature"),
        ({"ensemble": "nvt", "temperature_K": 300.0, "timestep_fs": 50.0}, ValueError, "timestep"),
        ({"ensemble": "nvt"}, EnsembleError, "needs the target temperature"),
        ({"ensemble": "nve", "temperature_K": 300.0}, EnsembleError, "does not take"),
        ({"ensemble": "nvx", "temperature_K": 300.0}, EnsembleError, "unknown ensemble"),
        ({"ensemble": "nvt", "temperature_K": 300.0, "tmperature": 1}, TypeError, "unknown"),
    ],
)
def test_bad_settings_give_clear_errors(arguments, error, match):
    with pytest.raises(error, match=match):
        fm.md(copper(), model="demo-emt-cu", steps=5, **arguments)


def test_fm_md_runs_and_leaves_the_callers_atoms_alone():
    atoms = copper()
    before = atoms.positions.copy()
    result = fm.md(atoms, model="demo-emt-cu", temperature_K=300.0, steps=10, timestep_fs=2.0)
    assert np.array_equal(atoms.positions, before)
    assert result.steps == 10 and result.thermo[0]["temperature_K"] > 0
    assert torch.get_default_dtype() == torch.float32


def test_a_run_says_how_start_up_went_and_which_path_runs(demo):
    """One line after the first block: start-up by part, then the path (docs/md.md)."""
    shown = io.StringIO()
    fm.md(copper(), model="demo-emt-cu", steps=10, temperature_K=300, progress=shown)
    lines = [line for line in shown.getvalue().splitlines() if line.startswith("start-up")]
    assert len(lines) == 1, shown.getvalue()
    assert re.fullmatch(
        r"start-up [\d.]+ s to the first step: (process before the run \(Python, imports, "
        r"input\) [\d.]+ s, )?request check [\d.]+ s, plan [\d.]+ s, model [\d.]+ s, "
        r"set-up [\d.]+ s, "
        r"first block [\d.]+ s(, other [\d.]+ s)?; running e3nn float64 on cpu, uncompiled, "
        r"no CUDA graphs, K=\d+",
        lines[0],
    ), lines[0]
