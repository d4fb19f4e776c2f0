"""Temperature schedules (anneal, quench, heat): the schedule's values, its checks before a run,
and a run whose thermostat follows it block by block."""

from __future__ import annotations

import re
from pathlib import Path

import ase.io
import pytest

import fastmace as fm
from fastmace.dynamics.ensembles import ensemble
from fastmace.dynamics.integrators.units import EV_PER_A3_PER_GPA
from fastmace.io import OutputSchedule
from fastmace.models.load import load
from fastmace.preflight import RequestError
from fastmace.protocol import PressureSchedule, ScheduleError, TemperatureSchedule
from fastmace.runs import RunSettings
from fastmace.simulation import Simulation

EXAMPLE = Path(__file__).parents[3] / "examples" / "cu-fcc-32.extxyz"


def test_linear_and_stepwise_values():
    ramp = TemperatureSchedule([(0, 300), (1000, 1300), (2000, 300)])
    assert ramp.value_at(0) == 300 and ramp.value_at(500) == 800
    assert ramp.value_at(1500) == 800 and ramp.value_at(5000) == 300
    assert ramp.block_value(100, 50) == ramp.value_at(125)  # a block's middle
    stairs = TemperatureSchedule([(0, 300), (1000, 600)], mode="step")
    assert stairs.value_at(999) == 300 and stairs.value_at(1000) == 600
    assert stairs.block_value(950, 50) == 300
    assert stairs.largest() == 600 and stairs.change_steps() == (1000,)
    assert TemperatureSchedule.coerce(stairs.to_dict()) == stairs
    assert TemperatureSchedule.coerce([[0, 300], [10, 400]]).mode == "linear"


@pytest.mark.parametrize(
    ("points", "mode", "words"),
    [
        ([(10, 300)], "linear", "starts at step 0"),
        ([(0, 300), (0, 400)], "linear", "steps must increase"),
        ([(0, 300), (100, -5)], "linear", "not a temperature"),
        ([(0, 300), (1.5, 400)], "linear", "not a whole number"),
        ([(0, 300)], "cubic", "mode 'cubic' is not allowed"),
        ("hot", "linear", "list of (step, temperature) pairs"),
    ],
)
def test_bad_schedules_say_what_is_wrong(points, mode, words):
    with pytest.raises(ScheduleError, match=re.escape(words)):
        TemperatureSchedule.coerce(points, mode)


def test_a_stepwise_schedule_changes_on_block_starts():
    stairs = TemperatureSchedule([(0, 300), (130, 600)], mode="step")
    settings = RunSettings(ensemble("nvt", temperature_K=300.0), 400, temperature_schedule=stairs)
    assert settings.block_steps_for(50) == 10  # gcd(50, 130): the change falls on a block start


def test_requests_a_schedule_cannot_serve_are_refused_before_anything_is_written(tmp_path):
    output = tmp_path / "run"
    cases = [
        ({"ensemble": "nve"}, "the nve ensemble cannot follow one"),
        ({"ensemble": "nvt-nose-hoover"}, "the nvt-nose-hoover ensemble cannot follow one"),
        ({"temperature_K": 500.0}, "starts at 300 K"),
    ]
    for settings, words in cases:
        with pytest.raises(RequestError, match=words):
            fm.md(EXAMPLE, steps=10, output=output,
                  temperature_schedule=[(0, 300.0), (10, 400.0)], **settings)  # fmt: skip
        assert not output.exists()


def test_the_thermostat_follows_a_stepwise_schedule(tmp_path):
    """300 K, then 900 K from step 100: with a strong thermostat the run is at each target
    within its fluctuations (32 atoms: about 14 % of T) by the end of each stage."""
    schedule = TemperatureSchedule([(0, 300.0), (100, 900.0)], mode="step")
    result = fm.md(
        EXAMPLE, steps=200, timestep_fs=2.0, friction_per_ps=50.0, thermo_every=10,
        trajectory_every=0, temperature_schedule=schedule, output=tmp_path / "run", seed=3,
    )  # fmt: skip
    rows = (tmp_path / "run" / "thermo.csv").read_text().splitlines()
    header = rows[0].split(",")
    temperature = {
        int(row.split(",")[header.index("step")]): float(
            row.split(",")[header.index("temperature_K")]
        )
        for row in rows[1:]
    }
    first = [temperature[step] for step in range(60, 101, 10)]
    second = [temperature[step] for step in range(160, 201, 10)]
    assert 200 < sum(first) / len(first) < 400
    assert 700 < sum(second) / len(second) < 1100
    assert "step temperature schedule 300 K @ 0 -> 900 K @ 100" in result.report


def test_a_run_config_takes_a_schedule_and_names_the_file_when_it_is_wrong(tmp_path):
    from fastmace.cli.md import read_config

    good = tmp_path / "anneal.toml"
    good.write_text(
        f'structure = "{EXAMPLE}"\nsteps = 100\n'
        'temperature_schedule = {points = [[0, 300.0], [50, 600.0]], mode = "step"}\n'
    )
    config = read_config(good)
    assert TemperatureSchedule.coerce(config["temperature_schedule"]).mode == "step"
    bad = tmp_path / "bad.toml"
    bad.write_text(f'structure = "{EXAMPLE}"\ntemperature_schedule = [[5, 300.0]]\n')
    with pytest.raises(RequestError, match=f"{bad}: a temperature schedule starts at step 0"):
        read_config(bad)


def test_pressure_schedules_take_negative_pressures_and_only_npt(tmp_path):
    tension = PressureSchedule([(0, 0.0), (100, -2.0)])
    assert tension.value_at(50) == -1.0 and tension.describe().startswith("linear pressure")
    with pytest.raises(ScheduleError, match="a pressure schedule is needed"):
        PressureSchedule.coerce(TemperatureSchedule([(0, 300.0)]))
    with pytest.raises(RequestError, match="the nvt-langevin ensemble cannot follow one"):
        fm.md(EXAMPLE, steps=10, temperature_K=300.0, pressure_schedule=[(0, 0.0), (10, 1.0)],
              output=tmp_path / "run")  # fmt: skip
    with pytest.raises(RequestError, match=re.escape("pressure_GPa=1.0 and a pressure schedule")):
        fm.md(EXAMPLE, ensemble="npt", steps=10, temperature_K=300.0, pressure_GPa=1.0,
              pressure_schedule=[(0, 0.0), (10, 1.0)], output=tmp_path / "run")  # fmt: skip
    assert not (tmp_path / "run").exists()


def test_the_barostat_target_follows_a_pressure_schedule(tmp_path):
    """Two blocks of NPT: the target pressure of each block is the schedule's, on the device."""
    schedule = PressureSchedule([(0, 0.0), (10, 3.0)], mode="step")
    settings = RunSettings(
        ensemble("npt", temperature_K=300.0, pressure_GPa=0.0), 20, timestep_fs=2.0,
        schedule=OutputSchedule(10, 10, 0), pressure_schedule=schedule, initial_temperature_K=300.0,
    )  # fmt: skip
    simulation = Simulation(load("demo-emt-cu"), [ase.io.read(EXAMPLE)], settings)
    assert simulation.block_steps == 10
    result = simulation.run()
    target = simulation.engine.md.pressure / EV_PER_A3_PER_GPA
    assert target.tolist() == pytest.approx([3.0])
    assert "step pressure schedule 0 GPa @ 0 -> 3 GPa @ 10" in result.report
