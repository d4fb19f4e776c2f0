"""The physical guard on the CPU with the demo model: the blow-ups of issue 12 stop the run
with a message that names the quantity, system, value, bound, steps and last good restart;
sound runs at the defaults stay well inside the bounds; the bounds are configurable; and the
guard's device work adds no host synchronisation to a block."""

from __future__ import annotations

import json
import math
import re

import ase
import ase.build
import numpy as np
import pytest
import torch
from conftest import settings as shared_settings
from helpers.host_sync import ForbidHostSync

import fastmace as fm
from fastmace.dynamics.ensembles import ensemble
from fastmace.dynamics.errors import GuardError, SimulationError
from fastmace.dynamics.guard import QUANTITIES
from fastmace.io import OutputSchedule, load_restart
from fastmace.planner import EngineConfig, EngineSettings, GuardConfig
from fastmace.simulation import RunSettings, Simulation

QUIET = dict(trajectory_every=0, thermo_every=10, progress=None)


def copper(repeat=(1, 1, 1)) -> ase.Atoms:
    atoms = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat(repeat)
    atoms.rattle(0.02, seed=3)
    return atoms


def close_pair() -> ase.Atoms:
    """Two atoms 0.6 Å apart in a 7 Å cell: allowed (above 0.5 Å), but no potential holds it."""
    return ase.Atoms("Cu2", positions=[[3, 3, 3], [3.6, 3, 3]], cell=[7, 7, 7], pbc=True)


# The blow-ups of issue 12, which used to finish with exit 0 and status "finished".
BLOW_UPS = {
    "nve-close-pair-10fs": (close_pair, dict(ensemble="nve", timestep_fs=10.0), "temperature"),
    "nvt-20000K-10fs": (copper, dict(temperature_K=20_000.0, timestep_fs=10.0), "temperature"),
    "npt-minus-1e5-GPa": (
        copper, dict(ensemble="npt", temperature_K=300.0, pressure_GPa=-1e5), "volume",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BLOW_UPS))
def test_a_blow_up_stops_the_run_and_names_what_where_and_the_last_restart(case, tmp_path):
    make, arguments, quantity = BLOW_UPS[case]
    run = tmp_path / "run"
    with pytest.raises(GuardError) as caught:
        fm.md(make(), model="demo-emt-cu", steps=200, output=run, restart_every=10, **arguments,
              **QUIET)  # fmt: skip
    error = caught.value
    message = str(error)
    assert error.breaches[0].quantity == quantity, message
    assert all(b.system == 0 for b in error.breaches)
    first, last = map(int, re.search(r"in steps (\d+) to (\d+)", message).groups())
    assert last - first == 10 and last <= 200
    assert f"system 0's {quantity}" in message and "above the bound of" in message
    # The last good restart is the one at the block's start, and the message says so.
    restart = load_restart(run / "restart.npz")
    assert restart.step == first
    assert f"{run / 'restart.npz'} at step {first}" in message and "--resume" in message
    metadata = json.loads((run / "metadata.json").read_text())
    assert metadata["status"] == "failed" and metadata["error"].startswith("GuardError: ")


def test_without_the_guard_the_npt_blow_up_runs_to_the_end(tmp_path):
    """What the guard prevents: the volume grows by orders of magnitude per block, finite."""
    result = fm.md(copper(), model="demo-emt-cu", ensemble="npt", temperature_K=300.0,
                   pressure_GPa=-1e5, steps=20, output=tmp_path / "run", guard=False,
                   **QUIET)  # fmt: skip
    assert result.thermo[0]["volume_A3"] > 1e6 * copper().get_volume()
    metadata = json.loads((tmp_path / "run" / "metadata.json").read_text())
    assert metadata["status"] == "finished" and metadata["engine"]["guard"]["enabled"] is False


def test_only_the_system_that_blew_up_is_named(demo):
    batch = Simulation(demo, [copper(), copper()], settings(10))
    state = batch.engine.md.state
    state.velocities[state.system == 1] *= 30.0  # 900 times hotter: 2.7e5 K
    with pytest.raises(GuardError) as caught:
        batch.run()
    assert {b.system for b in caught.value.breaches} == {1}
    assert "system 1's temperature" in str(caught.value)
    assert "no output directory" in str(caught.value)


def test_a_displacement_beyond_the_skin_stops_the_run(demo):
    """The neighbour list's skin test, reused: an atom that moves over a skin in one step."""
    only_displacement = GuardConfig(
        temperature_factor=math.inf, energy_per_atom_eV=math.inf, max_force_eV_per_A=math.inf
    )
    run = Simulation(demo, [copper((2, 1, 1))], settings(10, ensemble=ensemble("nve")),
                     engine=EngineSettings(guard=only_displacement))  # fmt: skip
    run.engine.md.state.velocities[3] = torch.tensor([1.5, 0.0, 0.0], dtype=torch.float64)
    with pytest.raises(GuardError) as caught:
        run.run()
    (breach,) = caught.value.breaches
    assert breach.quantity == "displacement" and breach.value > 2 * 0.5 == breach.bound
    assert run.engine.force_field.search_every == 1  # the skin test's redone blocks came first


def settings(steps: int, **changes) -> RunSettings:
    return shared_settings(steps, **{"schedule": OutputSchedule(0, 5, 0), **changes})  # K = 5


SOUND = {
    "nve": ensemble("nve"),
    "nvt": ensemble("nvt", temperature_K=300.0),
    "nvt-csvr": ensemble("nvt-csvr", temperature_K=300.0),
    "nvt-nose-hoover": ensemble("nvt-nose-hoover", temperature_K=300.0),
    "npt": ensemble("npt", temperature_K=300.0, pressure_GPa=0.0, cell_mode="full"),
    "nvt-1500K": ensemble("nvt", temperature_K=1500.0, friction_per_ps=10.0),
}


@pytest.mark.parametrize("name", list(SOUND))
def test_a_sound_run_at_the_defaults_stays_far_inside_the_bounds(demo, name):
    """200 fs of each ensemble, a batch of two: every block's worst value is far from its bound."""
    simulation = Simulation(demo, [copper((2, 1, 1)), copper((1, 2, 1))],
                            settings(100, ensemble=SOUND[name]))  # fmt: skip
    guard, worst = simulation.guard, torch.zeros(2, len(QUANTITIES), dtype=torch.float64)
    for _ in range(20):
        simulation.engine.run_block()  # raises if the guard trips
        worst = torch.maximum(worst, simulation.guard.values)
    config = GuardConfig()
    for system, row in enumerate(worst.tolist()):
        values = dict(zip(QUANTITIES, row, strict=True))
        reference = guard.temperature_reference_K[system]
        assert values["temperature"] < reference * config.temperature_factor / 3, values
        assert values["energy"] < guard.energy_bound / 20, values
        assert values["force"] < config.max_force_eV_per_A / 10, values
        assert 0.9 < values["volume"] < 1.1, values
        assert values["displacement"] < guard.max_displacement_A / 2, values


def test_the_guard_is_on_by_default_and_its_bounds_are_recorded(tmp_path):
    fm.md(copper(), model="demo-emt-cu", temperature_K=300.0, steps=5, output=tmp_path / "a",
          guard={"max_force_eV_per_A": 250.0}, **QUIET)  # fmt: skip
    document = json.loads((tmp_path / "a" / "metadata.json").read_text())
    record = document["engine"]["guard"]
    assert record["enabled"] is True and record["max_force_eV_per_A"] == 250.0
    assert record["temperature_factor"] == GuardConfig().temperature_factor
    assert record["temperature_bound_K"] == [3000.0]  # 10 x the larger of 300 K and the start's
    assert record["volume_checked"] is False and record["max_displacement_A"] == 1.0
    decision = document["plan"]["decisions"]["guard"]
    assert decision["source"] == "forced" and "max_force_eV_per_A=250.0" in decision["reason"]
    default = fm.md(copper(), model="demo-emt-cu", temperature_K=300.0, steps=5,
                    output=tmp_path / "b", **QUIET)  # fmt: skip
    assert default.steps == 5
    document = json.loads((tmp_path / "b" / "metadata.json").read_text())
    assert document["engine"]["guard"]["max_force_eV_per_A"] == GuardConfig().max_force_eV_per_A
    assert document["plan"]["decisions"]["guard"]["source"] == "rule"


def test_guard_settings_are_checked_and_merged_once():
    assert GuardConfig.coerce(None) == GuardConfig.coerce(True) == GuardConfig()
    assert GuardConfig.coerce(False) == GuardConfig(enabled=False)
    assert GuardConfig.coerce({"volume_factor": 2}) == GuardConfig(volume_factor=2)
    assert EngineConfig(guard={"volume_factor": 2}).guard == GuardConfig(volume_factor=2)
    assert EngineConfig(guard=GuardConfig(volume_factor=2)).to_dict()["guard"]["volume_factor"] == 2
    with pytest.raises(ValueError, match=r"unknown bound\(s\) max_force.*max_force_eV_per_A"):
        GuardConfig.coerce({"max_force": 3})
    with pytest.raises(ValueError, match=r"volume_factor=0\.5.*above 1"):
        GuardConfig(volume_factor=0.5)
    with pytest.raises(ValueError, match=r"max_force_eV_per_A=nan"):
        GuardConfig(max_force_eV_per_A=float("nan"))
    with pytest.raises(ValueError, match="guard='yes'"):
        GuardConfig.coerce("yes")
    from fastmace.api import engine_config

    merged = engine_config(
        EngineConfig(guard={"volume_factor": 2}), guard=GuardConfig(volume_factor=2)
    )
    assert merged.guard == GuardConfig(volume_factor=2)
    with pytest.raises(ValueError, match="force each setting once"):
        engine_config(EngineConfig(guard={"volume_factor": 2}), guard=False)


def test_the_guard_adds_no_host_synchronisation_to_a_block(demo, monkeypatch):
    """The guard's work inside a block is device work (the proxy of helpers/host_sync.py refuses
    every operator that reads back), and a block still reads back exactly once."""
    simulation = Simulation(demo, [copper(), copper()], settings(10))
    engine, guard = simulation.engine, simulation.guard
    md, neighbours = engine.md, engine.force_field.neighbours
    with ForbidHostSync():
        guard.start_block(md, neighbours)
        guard.observe(md)
        neighbours.check(md.state)
        guard.finish_block(md, neighbours)
    reads = []
    original = torch.Tensor.cpu

    def counted(tensor, *args, **kwargs):
        reads.append(tuple(tensor.shape))
        return original(tensor, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "cpu", counted)
    engine.run_block()
    assert reads == [(4 + 2 * len(QUANTITIES),)]  # the engine's flags and the guard's values
    monkeypatch.undo()
    np.testing.assert_allclose(guard.values[:, 0], engine.md.temperature())  # this block's


def test_a_resumed_run_keeps_the_guards_references(demo, tmp_path):
    first = Simulation(demo, [copper()], settings(10, schedule=OutputSchedule(0, 5, 5)),
                       tmp_path / "run")  # fmt: skip
    first.run()
    resumed = Simulation(demo, [copper()], settings(15, schedule=OutputSchedule(0, 5, 5)),
                         tmp_path / "run", resume=True)  # fmt: skip
    for name, value in first.guard.references().items():
        np.testing.assert_array_equal(resumed.guard.references()[name], value, err_msg=name)


def test_a_non_finite_blow_up_names_the_last_restart_too(demo, tmp_path):
    run = Simulation(demo, [copper()], settings(20, schedule=OutputSchedule(0, 5, 5)),
                     tmp_path / "run")  # fmt: skip
    run.engine.md.state.velocities[0, 0] = float("inf")
    match = r"blew up.*in steps 0 to 5.*\. The last good restart .* at step 0 "
    with pytest.raises(SimulationError, match=match):
        run.run()


def test_the_command_line_run_configs_and_the_runner_carry_the_guard(tmp_path):
    from fastmace.cli.main import build_parser
    from fastmace.cli.md import read_config
    from fastmace.runner import encode_arguments

    parse = build_parser().parse_args
    args = parse(["md", "x.xyz", "--guard", "max_force_eV_per_A=200", "--guard", "off"])
    assert dict(args.guard) == {"max_force_eV_per_A": 200.0, "enabled": False}
    assert parse(["md", "x.xyz"]).guard is None and parse(["md", "x.xyz"]).timestep_fs is None
    with pytest.raises(SystemExit):
        parse(["md", "x.xyz", "--guard", "max_force_eV_per_A"])
    config = tmp_path / "run.toml"
    config.write_text(
        'structure = "x.xyz"\ntemperature_K = 300\n'
        "[guard]\nvolume_factor = 2.5\ntemperature_factor = inf\n"
    )
    table = read_config(config)["guard"]
    assert GuardConfig.coerce(table) == GuardConfig(volume_factor=2.5, temperature_factor=math.inf)
    sent = encode_arguments({"guard": GuardConfig(volume_factor=2.5)})["guard"]
    assert EngineConfig(guard=sent).guard == GuardConfig(volume_factor=2.5)
