"""The run directory: never overwritten, resumed at the last restart without duplicates or gaps."""

from __future__ import annotations

import csv
import json
import re

import ase
import numpy as np
import pytest
from ase.build import bulk
from conftest import run_python

from fastmace.io import OutputSchedule, RunDirectory, RunDirectoryError, read_trajectory
from fastmace.runtime.atomic import create_exclusive


def batch(step: int, n_systems: int = 2) -> list[ase.Atoms]:
    structures = []
    for system in range(n_systems):
        atoms = bulk("Ar", "fcc", a=5.3) * (2, 1, 1)
        atoms.positions += 0.01 * step + 0.1 * system
        atoms.set_velocities(np.full((len(atoms), 3), 0.001 * step) / ase.units.fs)
        structures.append(atoms)
    return structures


def run_block(output, steps, n_systems: int = 2) -> None:
    """What the engine does at each output step: frames, thermo rows, sometimes a restart."""
    for step in steps:
        output.write_frames(step, 2.0 * step, batch(step, n_systems), [-float(step)] * n_systems)
        output.write_thermo(
            {"step": step, "system": s, "time_fs": 2.0 * step, "temperature_K": 300.0 + s}
            for s in range(n_systems)
        )
        if output.schedule.restart_due(step):
            output.write_restart(step, {"step": step, "positions": np.full(3, float(step))})


def thermo_steps(directory: RunDirectory) -> list[tuple[int, int]]:
    with open(directory.thermo_path, newline="") as stream:
        return [(int(row["step"]), int(row["system"])) for row in csv.DictReader(stream)]


SCHEDULE = OutputSchedule(trajectory_every=10, thermo_every=10, restart_every=20)


@pytest.mark.parametrize("trajectory_format", ["extxyz", "h5md"])
def test_resume_continues_without_duplicates_or_gaps(tmp_path, trajectory_format):
    path = tmp_path / "run"
    output = RunDirectory.create(
        path, n_atoms=4, n_systems=2, schedule=SCHEDULE, trajectory_format=trajectory_format
    )
    run_block(output, range(0, 60, 10))  # restarts at 0, 20 and 40; then 50 and a crash
    output.close()

    resumed = RunDirectory.resume(path)
    assert resumed.restart.step == 40
    assert resumed.restart.payload["step"] == 40
    assert resumed.trajectory_format == trajectory_format
    assert resumed.schedule == SCHEDULE
    steps = [atoms.info["step"] for atoms in read_trajectory(resumed.trajectory_path)]
    assert steps == [0, 0, 10, 10, 20, 20, 30, 30, 40, 40]  # step 50 is gone
    assert thermo_steps(resumed.directory)[-1] == (40, 1)
    with pytest.raises(ValueError, match="not after the last one"):
        resumed.write_frames(40, 80.0, batch(40))
    with pytest.raises(ValueError, match="after step 40"):
        resumed.write_thermo([{"step": 40, "system": 0}])

    run_block(resumed, range(50, 80, 10))
    resumed.write_report("done\n")
    resumed.close()
    frames = read_trajectory(resumed.trajectory_path)
    assert [atoms.info["step"] for atoms in frames[::2]] == list(range(0, 80, 10))
    np.testing.assert_allclose(frames[-1].positions, batch(70)[1].positions, atol=1e-7)
    expected = [(step, system) for step in range(0, 80, 10) for system in (0, 1)]
    assert thermo_steps(resumed.directory) == expected
    assert resumed.directory.report_path.read_text() == "done\n"


def test_create_refuses_a_directory_with_output(tmp_path):
    output = RunDirectory.create(tmp_path / "run", n_atoms=2)
    output.write_restart(0, {})
    output.close()
    with pytest.raises(RunDirectoryError, match=r"choose another directory.*resume"):
        RunDirectory.create(tmp_path / "run", n_atoms=2)
    # Stopped before its step-0 restart: nothing to resume, so no advice to resume.
    RunDirectory.create(tmp_path / "unstarted", n_atoms=2).close()
    with pytest.raises(RunDirectoryError, match=r"wrote no restart yet.*remove the directory"):
        RunDirectory.create(tmp_path / "unstarted", n_atoms=2)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(RunDirectoryError, match=r"already holds output \(notes.txt\)"):
        RunDirectory.create(tmp_path / "other", n_atoms=2)
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"


def test_create_accepts_an_empty_or_missing_directory(tmp_path):
    (tmp_path / "empty").mkdir()
    RunDirectory.create(tmp_path / "empty", n_atoms=2).close()
    output = RunDirectory.create(tmp_path / "a" / "b", n_atoms=2, n_steps=100)
    settings = json.loads(output.directory.settings_path.read_text())
    assert settings["trajectory_format"] == "extxyz"
    # While open, the directory is this process's (run.lock); closing gives it up.
    assert sorted(p.name for p in output.directory.path.iterdir()) == ["run.json", "run.lock"]
    output.close()
    assert sorted(p.name for p in output.directory.path.iterdir()) == ["run.json"]


def test_bad_input_gives_clear_errors(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(RunDirectoryError, match="is a file"):
        RunDirectory.create(tmp_path / "file", n_atoms=2)
    with pytest.raises(ValueError, match="unknown trajectory format 'pdb'"):
        RunDirectory.create(tmp_path / "x", n_atoms=2, trajectory_format="pdb")
    with pytest.raises(ValueError, match=r"trajectory_every must be a non-negative.*-5"):
        OutputSchedule(trajectory_every=-5)
    with pytest.raises(ValueError, match="n_systems=3, n_atoms=2"):
        RunDirectory.create(tmp_path / "x", n_atoms=2, n_systems=3)
    assert not (tmp_path / "x").exists()  # nothing created for a refused request
    with pytest.raises(RunDirectoryError, match="not a FastMACE run directory"):
        RunDirectory.resume(tmp_path)
    with pytest.raises(RunDirectoryError, match="not a directory"):
        RunDirectory.resume(tmp_path / "missing")


def test_resume_without_a_restart_says_so(tmp_path):
    output = RunDirectory.create(tmp_path / "run", n_atoms=2, n_systems=1)
    output.write_frames(0, 0.0, batch(0, 1))
    output.close()
    with pytest.raises(RunDirectoryError, match="wrote no restart yet"):
        RunDirectory.resume(tmp_path / "run")


def test_a_finished_run_whose_restart_was_deleted_is_not_advised_away(demo, tmp_path):
    """Issue 33: the advice for a run that never started (remove the directory) would delete
    a finished run's output; a run that wrote past step 0 is told to keep it."""
    from conftest import copper, settings

    from fastmace.simulation import Simulation

    Simulation(demo, [copper()], settings(10), tmp_path / "run").run()
    (tmp_path / "run" / "restart.npz").unlink()
    with pytest.raises(RunDirectoryError, match=r"restart\.npz is missing") as raised:
        RunDirectory.resume(tmp_path / "run")
    assert "remove the directory" not in str(raised.value)
    assert "Keep this directory" in str(raised.value)


@pytest.mark.parametrize("cut", ["thermo.csv", "trajectory.extxyz"])
def test_output_cut_by_hand_before_the_restart_is_refused(demo, tmp_path, cut):
    """Issue 33: a thermo log or trajectory cut back past the restart's step would resume with
    a silent gap of steps; the resume says what is missing and changes nothing."""
    from conftest import copper, settings

    from fastmace.simulation import Simulation

    Simulation(demo, [copper()], settings(10), tmp_path / "run").run()  # rows, frames every 5
    path = tmp_path / "run" / cut
    lines = path.read_text().splitlines(keepends=True)
    keep = 2 if cut == "thermo.csv" else 2 * (8 + 2)  # header and step 0; frames 0 and 5
    path.write_text("".join(lines[:keep]))
    before = path.read_bytes()
    with pytest.raises(RunDirectoryError, match=rf"{re.escape(cut)} holds .* gap of steps"):
        RunDirectory.resume(tmp_path / "run")
    assert path.read_bytes() == before


def test_a_run_json_whose_trajectory_format_was_edited_is_refused(demo, tmp_path):
    """Issue 33: the resumed run would have started a second trajectory file in the new
    format beside the first."""
    from conftest import copper, settings

    from fastmace.simulation import Simulation

    Simulation(demo, [copper()], settings(10), tmp_path / "run").run()
    run_json = tmp_path / "run" / "run.json"
    described = json.loads(run_json.read_text())
    assert described["trajectory_format"] == "extxyz"
    run_json.write_text(json.dumps({**described, "trajectory_format": "h5md"}))
    with pytest.raises(RunDirectoryError, match=r"run\.json was edited.*\"extxyz\" back"):
        RunDirectory.resume(tmp_path / "run")
    assert not (tmp_path / "run" / "trajectory.h5md").exists()


def test_resume_removes_temporaries_of_a_killed_writer(tmp_path):
    output = RunDirectory.create(tmp_path / "run", n_atoms=2, n_systems=1)
    output.write_restart(0, {"x": np.zeros(2)})
    output.close()
    stale = tmp_path / "run" / ".restart.npz.0123456789abcdef.tmp"
    stale.write_bytes(b"PK half")
    RunDirectory.resume(tmp_path / "run").close()
    assert not stale.exists()


def test_output_checks_its_input_and_state(tmp_path):
    output = RunDirectory.create(tmp_path / "run", n_atoms=4, n_systems=2)
    with pytest.raises(ValueError, match="expected 2 systems, got 1"):
        output.write_frames(0, 0.0, batch(0, 1))
    output.write_frames(0, 0.0, batch(0))
    with pytest.raises(ValueError, match="steps must increase"):
        output.write_frames(0, 0.0, batch(0))
    with pytest.raises(ValueError, match="system 2 is outside the batch of 2"):
        output.write_thermo([{"step": 0, "system": 2}])
    output.write_metadata({"fastmace": "0.1", "model": "demo"})
    output.close()
    with pytest.raises(RunDirectoryError, match="already closed"):
        output.write_report("late")
    assert json.loads(output.directory.metadata_path.read_text())["model"] == "demo"


def test_no_trajectory_when_switched_off(tmp_path):
    schedule = OutputSchedule(trajectory_every=0)
    output = RunDirectory.create(tmp_path / "run", n_atoms=2, schedule=schedule)
    assert output.trajectory_format == "none" and output.trajectory_path is None
    with pytest.raises(RunDirectoryError, match="writes no trajectory"):
        output.write_frames(0, 0.0, batch(0, 1))
    output.close()


def test_schedule():
    schedule = OutputSchedule(trajectory_every=10, thermo_every=0, restart_every=25)
    assert schedule.trajectory_due(0) and schedule.trajectory_due(30)
    assert not schedule.trajectory_due(5)
    assert not schedule.thermo_due(0)
    assert schedule.restart_due(50)
    assert schedule.expected_frames(100) == 11


def test_io_imports_no_torch(clean_env):
    code = "import sys, fastmace.io; print('torch' in sys.modules, 'h5py' in sys.modules)"
    result = run_python(code, clean_env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]


def test_resume_with_a_damaged_trajectory_says_so(tmp_path):
    output = RunDirectory.create(tmp_path / "run", n_atoms=2, trajectory_format="h5md")
    output.write_frames(0, 0.0, batch(0, 1))
    output.write_restart(0, {})
    output.close()
    (tmp_path / "run" / "trajectory.h5md").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 64)
    with pytest.raises(RunDirectoryError, match=r"trajectory.h5md cannot be read"):
        RunDirectory.resume(tmp_path / "run")


def test_exclusive_creation_loses_no_race(tmp_path):
    create_exclusive(tmp_path / "run.json", b"first")
    with pytest.raises(FileExistsError):
        create_exclusive(tmp_path / "run.json", b"second")
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]
    assert (tmp_path / "run.json").read_bytes() == b"first"
