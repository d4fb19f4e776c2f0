"""metadata.json of real CPU runs: valid against the shipped schema, and complete."""

from __future__ import annotations

import json

import jsonschema
import pytest
from conftest import copper

from fastmace.dynamics.engine import SimulationError
from fastmace.dynamics.ensembles import ensemble
from fastmace.io import OutputSchedule
from fastmace.models.label_table import find_checkpoint
from fastmace.models.load import load
from fastmace.provenance import SCHEMA, structure_hash
from fastmace.simulation import RunSettings, Simulation


@pytest.fixture(scope="module")
def schema():
    document = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(document)
    return document


def settings(**changes) -> RunSettings:
    values = dict(
        ensemble=ensemble("nvt", temperature_K=300.0),
        steps=10,
        timestep_fs=2.0,
        seed=42,
        schedule=OutputSchedule(5, 5, 10),
        initial_temperature_K=300.0,
    )  # the schedule makes K = 5
    values.update(changes)
    return RunSettings(**values)


def test_finished_run_metadata_is_valid_and_complete(schema, tmp_path):
    atoms = copper()
    Simulation(load("demo-emt-cu"), [atoms], settings(), tmp_path / "run").run()
    document = json.loads((tmp_path / "run" / "metadata.json").read_text())
    jsonschema.validate(document, schema)
    assert document["status"] == "finished" and document["error"] is None
    software = document["software"]
    assert software["packages"]["mace-torch"] == "0.3.16"
    assert software["torch"].startswith(software["packages"]["torch"].split("+")[0])
    assert software["fastmace"]["kind"] in ("checkout", "installed")
    model = document["model"]
    assert (
        model["label"] == "demo-emt-cu" and model["sha256"] == find_checkpoint("demo-emt-cu").sha256
    )
    assert model["licence"] and model["head"] == "Default" and model["dtype"] == "float64"
    (structure,) = document["structures"]
    assert structure["formula"] == "Cu8" and structure["sha256"] == structure_hash(atoms)
    assert document["settings"]["ensemble"] == "nvt-langevin"
    assert document["settings"]["ensemble_settings"] == {"temperature_K": 300.0}
    assert document["seed"] == 42 and document["timings"]["steps_per_s"] > 0
    assert document["engine"]["capture"] is False and document["engine"]["regrowths"] == 0
    assert "FASTMACE_CACHE" in document["environment"]["read"]
    assert document["runtime_info"]["lock_mode"] in ("soft", "kernel")
    # The OEq runtime prepared this process (or OEq is absent): its record is there either way.
    record = software["oeq_extension"]
    assert record is None or record["summary"].startswith("host extension:")


def test_failed_run_records_the_error(schema, tmp_path):
    run = Simulation(
        load("demo-emt-cu"), [copper()],
        settings(ensemble=ensemble("nve"), initial_temperature_K=None), tmp_path / "run",
    )  # fmt: skip
    # Input velocities are checked up front, so the blow-up is made inside the running state.
    run.engine.md.state.velocities[0, 0] = float("inf")
    with pytest.raises(SimulationError):
        run.run()
    document = json.loads((tmp_path / "run" / "metadata.json").read_text())
    jsonschema.validate(document, schema)
    assert document["status"] == "failed" and "blew up" in document["error"]


def test_backend_reason_is_one_in_metadata_report_and_plan(tmp_path):
    import fastmace as fm

    result = fm.md(
        copper(), model="demo-emt-cu", ensemble="nvt", temperature_K=300.0, steps=5,
        timestep_fs=2.0, thermo_every=5, trajectory_every=0, output=tmp_path / "run",
    )  # fmt: skip
    document = json.loads((tmp_path / "run" / "metadata.json").read_text())
    planned = document["plan"]["decisions"]["backend"]
    model = document["model"]
    assert model["backend"] == planned["value"]
    assert model["backend_reason"] == planned["reason"]
    assert f"backend:   {model['backend']}: {planned['reason']}\n" in result.report
    # The plan's K of 50, shortened to the thermo interval of 5: the report says both.
    assert document["plan"]["decisions"]["block_steps"]["value"] == 50
    # Nothing compiled on the CPU: Inductor's setting is left alone, and the record says why.
    workers = document["plan"]["decisions"]["compile_workers"]
    assert (workers["value"], workers["reason"]) == (None, "rule: nothing is compiled")
    assert document["engine"]["block_steps"] == 5
    assert "engine:    5 steps per launch (the plan's K = 50, shortened" in result.report
    assert document["engine"]["radial_table_failure"] is None
    # Without a plan (a Simulation made directly) all three say what loading the model said.
    loaded = load("demo-emt-cu")
    run = Simulation(loaded, [copper()], settings(), tmp_path / "direct")
    report = run.run().report
    direct = json.loads((tmp_path / "direct" / "metadata.json").read_text())["model"]
    assert direct["backend_reason"] == loaded.backend_reason
    assert f"backend:   {loaded.backend}: {loaded.backend_reason}\n" in report


def test_a_crystal_that_ends_cool_is_told_why_and_what_to_do(demo, tmp_path):
    """Issue 33's newcomer: a perfect crystal started at the target temperature ends near half
    of it in a short run; the report says why and how to start (no such note when on target)."""
    import ase.build

    from fastmace.provenance import cool_start_note

    crystal = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 2, 2))  # at its minimum
    gentle = ensemble("nvt", temperature_K=300.0, friction_per_ps=0.1)
    run = RunSettings(ensemble=gentle, steps=100, timestep_fs=2.0, seed=3,
                      schedule=OutputSchedule(0, 50, 0))  # fmt: skip
    simulation = Simulation(demo, [crystal], run, tmp_path / "run")
    result = simulation.run()
    final = result.thermo[0]["temperature_K"]
    assert final < 0.8 * 300.0  # what the newcomer saw
    report = (tmp_path / "run" / "report.txt").read_text()
    assert "note:" in report and "--initial-temperature 600" in report
    assert cool_start_note(run, [{"temperature_K": 290.0}]) is None
    ladder = RunSettings(ensemble=ensemble("nvt", temperature_K=[300.0, 400.0]), steps=1)
    assert cool_start_note(ladder, [{"temperature_K": 10.0}] * 2) is None
