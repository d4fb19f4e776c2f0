"""Resuming with other settings (issue 12): a resume that changes the run's physics is refused
before anything in the run directory changes, naming each setting with its saved and requested
value; the timestep may change, and time then continues from the restart's time. Real runs on
the CPU with the demo model, through fm.md and the ``fastmace md --resume`` command line."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import EXAMPLE, copper, run_fastmace

import fastmace as fm
from fastmace.dynamics.ensembles import ensemble
from fastmace.io import Restart, read_trajectory
from fastmace.resuming import ResumeError, canonical_settings, check_resume

RUN = dict(model="demo-emt-cu", temperature_K=300.0, friction_per_ps=5.0, timestep_fs=2.0,
           seed=7, thermo_every=5, trajectory_every=5, restart_every=10, progress=None)  # fmt: skip


def snapshot(run: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(run.iterdir())}


def rows(run: Path) -> list[tuple[int, float]]:
    return [
        (int(r["step"]), float(r["time_fs"])) for r in csv.DictReader((run / "thermo.csv").open())
    ]


@pytest.fixture
def run(tmp_path) -> Path:
    """A finished NVT run of 10 steps of 2 fs, with restarts at steps 0 and 10."""
    fm.md(copper(), steps=10, output=tmp_path / "run", **RUN)
    return tmp_path / "run"


CHANGES = [
    ({"temperature_K": 3000.0}, "temperature_K: saved 300, requested 3000"),
    ({"friction_per_ps": 1.0}, "friction_per_ps: saved 5, requested 1"),
    ({"ensemble": "nvt-csvr"}, "ensemble: saved nvt-langevin, requested nvt-csvr"),
    ({"seed": 8}, "seed: saved 7, requested 8"),
    ({"dtype": "float32"}, "dtype: saved float64, requested float32"),
    ({"model": "template:mp0-small"}, "model: saved demo-emt-cu"),
    # D3 added to a run without it (the force field would change mid-run).
    (
        {"dispersion": "d3bj", "dispersion_functional": "pbe"},
        "dispersion: saved None, requested d3bj (pbe)",
    ),
]


@pytest.mark.parametrize(("change", "named"), CHANGES, ids=[c[1].split(":")[0] for c in CHANGES])
def test_a_resume_that_changes_the_physics_is_refused_and_changes_nothing(run, change, named):
    before = snapshot(run)
    arguments = {**RUN, **change}
    if arguments.get("ensemble") == "nvt-csvr":
        del arguments["friction_per_ps"]
    with pytest.raises(ResumeError) as caught:
        fm.md(copper(), steps=20, output=run, resume=True, **arguments)
    message = str(caught.value)
    assert named in message and "a resume continues the same physics" in message
    assert "start a new run from a frame of its trajectory" in message
    assert snapshot(run) == before  # nothing cut back, no metadata rewritten


def test_several_differences_are_named_together(run):
    with pytest.raises(ResumeError, match=r"temperature_K: saved 300, requested 500; .*seed"):
        fm.md(copper(), steps=20, output=run, resume=True, **{**RUN, "temperature_K": 500.0,
                                                              "seed": 1})  # fmt: skip


def test_settings_equal_to_the_saved_ones_resume_bit_for_bit(run, tmp_path):
    straight = fm.md(copper(), steps=20, **RUN)
    resumed = fm.md(copper(), steps=20, output=run, resume=True, **RUN)
    assert np.array_equal(resumed.structures[0].positions, straight.structures[0].positions)
    assert rows(run) == [(0, 0.0), (5, 10.0), (10, 20.0), (15, 30.0), (20, 40.0)]


def test_a_resume_without_a_timestep_keeps_the_saved_one(run):
    arguments = {name: value for name, value in RUN.items() if name != "timestep_fs"}
    fm.md(copper(), steps=20, output=run, resume=True, **arguments)
    assert rows(run)[-1] == (20, 40.0)
    assert json.loads((run / "metadata.json").read_text())["settings"]["timestep_fs"] == 2.0


def test_a_smaller_timestep_applies_and_time_continues(run):
    fm.md(copper(), steps=20, output=run, resume=True, **{**RUN, "timestep_fs": 1.0})
    assert rows(run) == [(0, 0.0), (5, 10.0), (10, 20.0), (15, 25.0), (20, 30.0)]
    frames = read_trajectory(run / "trajectory.extxyz")
    assert [f.info["time_fs"] for f in frames] == [0.0, 10.0, 20.0, 25.0, 30.0]
    metadata = json.loads((run / "metadata.json").read_text())
    assert metadata["status"] == "finished" and metadata["settings"]["timestep_fs"] == 1.0
    # A second resume continues from the new time, with the new timestep.
    fm.md(copper(), steps=30, output=run, resume=True, **{**RUN, "timestep_fs": 1.0})
    assert rows(run)[-1] == (30, 40.0)


def test_settings_are_compared_as_the_integrator_runs_them():
    """A setting left out equals its default given; one value equals the same per system; a
    pressure in bar equals the same in GPa."""
    plain = canonical_settings(ensemble("nvt", temperature_K=300), 2)
    spelled = canonical_settings(ensemble("nvt", temperature_K=[300, 300], friction_per_ps=1), 2)
    assert plain == spelled
    bar = canonical_settings(ensemble("npt", temperature_K=300, pressure_bar=1.0), 1)
    gpa = canonical_settings(ensemble("npt", temperature_K=300, pressure_GPa=1e-4), 1)
    assert bar == gpa


def test_other_elements_are_refused():
    saved = np.array([29, 29, 29])
    restart = Restart(step=10, payload={"tensors": {"state.atomic_numbers": saved}})
    requested = {
        "ensemble": "nve", "ensemble_settings": {}, "model": "m", "model_content_hash": "0" * 64,
        "head": "default", "dtype": "float64", "seed": 0,
    }  # fmt: skip
    match = r"elements differ at 1 atoms \(first atom 2: saved Cu, requested Ag\)"
    with pytest.raises(ResumeError, match=match):
        check_resume(restart, requested, np.array([29, 29, 47]), "run", describe="nve")
    with pytest.raises(ResumeError, match="saved 3 atoms, requested 4"):
        check_resume(restart, requested, np.array([29] * 4), "run", describe="nve")
    old = Restart(step=10, payload={"ensemble": "nvt-langevin (temperature_K=300.0)"})
    with pytest.raises(ResumeError, match=r"ensemble: saved nvt-langevin \(temperature_K=300.0\)"):
        check_resume(old, requested, saved, "run", describe="nve")


def test_the_command_line_refuses_a_changed_temperature_and_resumes_an_unchanged_run(
    clean_env, tmp_path
):
    run = tmp_path / "run"
    common = ["md", str(EXAMPLE), "--output", str(run), "--thermo-every", "5", "--traj-every",
              "0", "--restart-every", "5"]  # fmt: skip
    first = run_fastmace([*common, "--temperature", "300", "--timestep", "2", "--steps", "5"],
                         clean_env)  # fmt: skip
    assert first.returncode == 0, first.stderr[-2000:]
    before = snapshot(run)
    hotter = run_fastmace(
        [*common, "--resume", "--temperature", "3000", "--timestep", "2", "--steps", "10"],
        clean_env,
    )
    assert hotter.returncode == 1 and "Traceback" not in hotter.stderr
    assert "temperature_K: saved 300, requested 3000" in hotter.stderr
    assert snapshot(run) == before
    # Without --timestep a resume keeps the saved 2 fs: time goes on from 10 fs, no jump.
    same = run_fastmace([*common, "--resume", "--temperature", "300", "--steps", "10"], clean_env)
    assert same.returncode == 0, same.stderr[-2000:]
    assert rows(run) == [(0, 0.0), (5, 10.0), (10, 20.0)]
