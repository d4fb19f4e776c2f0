"""Reliability on the CPU with the demo model: a run killed before its first scheduled restart
resumes bit for bit, bad input velocities are refused up front, and a neighbour list that keeps
overflowing stops the run instead of growing without bound."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import ase.build
import numpy as np
import pytest

from fastmace.dynamics.checks import StructureError
from fastmace.dynamics.engine import SimulationError
from fastmace.dynamics.ensembles import ensemble
from fastmace.io import OutputSchedule, read_trajectory
from fastmace.models.load import load
from fastmace.simulation import RunSettings, Simulation

# Restarts far apart: a run killed early only has the restart of step 0.
SCHEDULE = OutputSchedule(trajectory_every=5, thermo_every=5, restart_every=100_000)


@pytest.fixture(scope="module")
def demo():
    return load("demo-emt-cu")


def copper() -> ase.Atoms:
    atoms = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 1, 1))
    atoms.rattle(0.02, seed=3)
    return atoms


def settings(steps: int, **changes) -> RunSettings:
    values = dict(
        ensemble=ensemble("nvt", temperature_K=300.0, friction_per_ps=5.0),
        steps=steps,
        timestep_fs=2.0,
        seed=7,
        schedule=SCHEDULE,
        initial_temperature_K=300.0,
    )
    values.update(changes)
    return RunSettings(**values)


_CHILD = """
import ase.build
from fastmace.dynamics.ensembles import ensemble
from fastmace.io import OutputSchedule
from fastmace.models.load import load
from fastmace.simulation import RunSettings, Simulation

atoms = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 1, 1))
atoms.rattle(0.02, seed=3)
settings = RunSettings(
    ensemble=ensemble("nvt", temperature_K=300.0, friction_per_ps=5.0), steps=10_000_000,
    timestep_fs=2.0, seed=7, initial_temperature_K=300.0,
    schedule=OutputSchedule(trajectory_every=5, thermo_every=5, restart_every=100_000),
)
Simulation(load("demo-emt-cu"), [atoms], settings, {run!r}).run()
"""


def _data_rows(path: Path) -> int:
    try:
        return max(0, len(path.read_text().splitlines()) - 1)
    except FileNotFoundError:
        return 0


def _run_and_kill(run: Path, rows: int) -> None:
    """Start a long run in a child process and SIGKILL it once ``rows`` thermo rows exist."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p])
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_CHILD.format(run=str(run)))],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + 240
    try:
        while _data_rows(run / "thermo.csv") < rows:
            if child.poll() is not None:
                raise AssertionError(f"the run ended early: {child.stderr.read().decode()}")
            assert time.monotonic() < deadline, "the run wrote no thermo rows in time"
            time.sleep(0.05)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stderr.close()


def test_a_run_killed_before_its_first_restart_resumes_bit_for_bit(demo, tmp_path):
    run = tmp_path / "run"
    _run_and_kill(run, rows=6)  # steps 0 to 25 written, and maybe more; only restart: step 0
    from fastmace.io import load_restart

    assert load_restart(run / "restart.npz").step == 0
    assert json.loads((run / "metadata.json").read_text())["status"] == "running"
    assert _data_rows(run / "thermo.csv") >= 6

    straight = Simulation(demo, [copper()], settings(20)).run()
    resumed = Simulation(demo, [copper()], settings(20), run, resume=True).run()
    assert resumed.steps == 20
    assert np.array_equal(resumed.structures[0].positions, straight.structures[0].positions)
    assert np.array_equal(resumed.structures[0].get_velocities(),
                          straight.structures[0].get_velocities())  # fmt: skip
    rows = list(csv.DictReader((run / "thermo.csv").open()))
    assert [int(r["step"]) for r in rows] == [0, 5, 10, 15, 20]  # cut back, no duplicate
    (trajectory,) = run.glob("trajectory.*")
    frames = read_trajectory(trajectory)
    assert len(frames) == 5  # frames after step 0 cut back, step 0's frame not written twice
    np.testing.assert_allclose(frames[-1].positions, resumed.structures[0].positions, atol=1e-7)
    assert json.loads((run / "metadata.json").read_text())["status"] == "finished"


def test_fm_md_resumes_from_the_step_zero_restart(tmp_path):
    import fastmace as fm

    run = tmp_path / "run"
    _run_and_kill(run, rows=3)
    arguments = dict(
        model="demo-emt-cu", ensemble="nvt", temperature_K=300.0, friction_per_ps=5.0,
        steps=10, timestep_fs=2.0, seed=7, initial_temperature_K=300.0,
        trajectory_every=5, thermo_every=5, restart_every=100_000,
    )  # fmt: skip
    straight = fm.md(copper(), **arguments)
    resumed = fm.md(copper(), output=run, resume=True, **arguments)
    assert np.array_equal(resumed.structures[0].positions, straight.structures[0].positions)
    rows = list(csv.DictReader((run / "thermo.csv").open()))
    assert [int(r["step"]) for r in rows] == [0, 5, 10]
