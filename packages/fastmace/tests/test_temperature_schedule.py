"""Temperature schedules (anneal, quench, heat): the schedule's values, its checks before a run,
and a run whose thermostat follows it block by block."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import fastmace as fm
from fastmace.dynamics.ensembles import ensemble
from fastmace.preflight import RequestError
from fastmace.protocol import ScheduleError, TemperatureSchedule
from fastmace.runs import RunSettings

EXAMPLE = Path(__file__).parents[3] / "examples" / "cu-fcc-32.extxyz"


def test_linear_and_stepwise_values():
    ramp = TemperatureSchedule([(0, 300), (1000, 1300), (2000, 300)])
    assert ramp.temperature_at(0) == 300 and ramp.temperature_at(500) == 800
    assert ramp.temperature_at(1500) == 800 and ramp.temperature_at(5000) == 300
    assert ramp.block_temperature(100, 50) == ramp.temperature_at(125)  # a block's middle
    stairs = TemperatureSchedule([(0, 300), (1000, 600)], mode="step")
    assert stairs.temperature_at(999) == 300 and stairs.temperature_at(1000) == 600
    assert stairs.block_temperature(950, 50) == 300
    assert stairs.hottest_K() == 600 and stairs.change_steps() == (1000,)
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
        ("hot", "linear", "list of (step, temperature_K) pairs"),
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
    assert "step schedule" in result.report


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
