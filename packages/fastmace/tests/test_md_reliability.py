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
from conftest import copper
from conftest import settings as shared_settings

from fastmace.dynamics.checks import StructureError
from fastmace.dynamics.engine import SimulationError
from fastmace.io import OutputSchedule, read_trajectory
from fastmace.simulation import RunSettings, Simulation

# Restarts far apart: a run killed early only has the restart of step 0.
SCHEDULE = OutputSchedule(trajectory_every=5, thermo_every=5, restart_every=100_000)


def settings(steps: int, **changes) -> RunSettings:
    return shared_settings(steps, **{"schedule": SCHEDULE, **changes})


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


def _with_velocity(value: float, atom: int = 2) -> ase.Atoms:
    atoms = copper()
    velocities = np.zeros((len(atoms), 3))
    velocities[atom, 1] = value
    atoms.set_velocities(velocities)
    return atoms


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (np.nan, r"non-finite velocities \(atoms \[2\]"),
        (np.inf, r"non-finite velocities \(atoms \[2\]"),
        (1e160 / ase.units.fs, r"kinetic temperature inf K.*atom 2 .*1e\+160 Å/fs"),
        (1.0 / ase.units.fs, r"kinetic temperature [0-9.e+]+ K, above the bound of 1e\+06 K"),
    ],
    ids=["nan", "inf", "1e160-A-per-fs", "1-A-per-fs"],
)
def test_bad_input_velocities_are_refused_before_anything_is_created(demo, tmp_path, value, match):
    with pytest.raises(StructureError, match=match):
        Simulation(demo, [_with_velocity(value)], settings(5), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_hot_but_physical_input_velocities_run(demo):
    atoms = _with_velocity(0.05 / ase.units.fs)  # 0.05 Å/fs on one atom: thousands of K
    result = Simulation(demo, [atoms], settings(5, initial_temperature_K=None)).run()
    assert np.isfinite(result.structures[0].positions).all()


def _overflowing(demo, output: Path | None, steps: int = 20) -> Simulation:
    """A run whose neighbour list is far too small: every block overflows at first."""
    from fastmace.dynamics.neighbours import NeighbourList

    simulation = Simulation(demo, [copper()], settings(steps), output)
    state = simulation.engine.md.state
    tiny = NeighbourList(state, simulation.potential.r_max, 0.5, 8)
    simulation.engine.force_field.neighbours = tiny
    simulation.engine.force_field.edges = tiny.build(state)
    return simulation


def test_a_list_denser_than_the_bound_stops_the_run_and_says_failed(demo, tmp_path):
    simulation = _overflowing(demo, tmp_path / "run")
    simulation.engine.max_edges_per_atom = 2.0  # copper has dozens: as if it had collapsed
    started = time.monotonic()
    with pytest.raises(SimulationError, match=r"collapsing.*edges.*atoms/Å\^3.*bound of 2 per"):
        simulation.run()
    assert time.monotonic() - started < 60
    metadata = json.loads((tmp_path / "run" / "metadata.json").read_text())
    assert metadata["status"] == "failed" and "collapsing" in metadata["error"]


def test_the_physical_bound_lets_an_ordinary_overflow_recover(demo):
    simulation = _overflowing(demo, None, steps=10)
    simulation.run()
    assert simulation.engine.regrowths >= 1


def test_regrow_refuses_a_list_above_the_bound(demo):
    """Copper is far below the physical bound; a bound below copper's edges is refused."""
    from fastmace.dynamics.overflow import max_edges_per_atom, regrow

    simulation = Simulation(demo, [copper()], settings(5), None)
    neighbours = simulation.engine.force_field.neighbours
    state = simulation.engine.md.state
    copper_edges = neighbours.peak_count / state.n_atoms
    assert copper_edges < max_edges_per_atom(neighbours.radius) / 4  # copper is far from it
    with pytest.raises(SimulationError, match="collapsing"):
        regrow(neighbours, state, max_edges_per_atom=copper_edges / 2)


def test_a_block_that_keeps_overflowing_stops_the_run(demo, tmp_path):
    simulation = _overflowing(demo, tmp_path / "run")
    simulation.engine.max_regrowths_per_block = 0  # the first overflow is one too many
    with pytest.raises(SimulationError, match=r"overflowed 1 times in one block.*collapsing"):
        simulation.run()
    metadata = json.loads((tmp_path / "run" / "metadata.json").read_text())
    assert metadata["status"] == "failed"
