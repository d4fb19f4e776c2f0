"""The subprocess runner: fm.md in a child process, its hand-off, environment and failures."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from conftest import EXAMPLE, copper

import fastmace as fm
from fastmace.cli.main import main as cli_main
from fastmace.gate import GateError
from fastmace.models.label_table import UnknownLabelError
from fastmace.provenance import SCHEMA
from fastmace.runner import RunnerConfig, RunnerError, encode_arguments
from fastmace.runtime.environment import child_environment

RUN = dict(
    model="demo-emt-cu", temperature_K=300.0, steps=10, timestep_fs=2.0, block_steps=5, seed=7,
    thermo_every=5, trajectory_every=5,
)  # fmt: skip


@pytest.fixture
def cache(tmp_path, monkeypatch, clean_env):
    """This process's environment made clean (the runner's children inherit it), with a cache
    of the test's own (conftest's ``cache``, plus the clean environment)."""
    for name in set(os.environ) - set(clean_env):
        monkeypatch.delenv(name)
    for name, value in clean_env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("FASTMACE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def assert_no_handoff_left(cache: Path) -> None:
    handoff = cache / "handoff"
    assert not handoff.exists() or list(handoff.iterdir()) == [], "a hand-off outlived its run"


def test_a_subprocess_run_matches_the_in_process_run_and_says_so(cache, tmp_path):
    here = fm.md(copper(), **RUN, output=tmp_path / "here", progress=io.StringIO())
    models = str(tmp_path / "models")  # unset in this process: only the child can record it
    runner = RunnerConfig(subprocess=True, environment={"FASTMACE_MODELS": models})
    there = fm.md(copper(), **RUN, output=tmp_path / "there", runner=runner, progress=io.StringIO())
    assert "FASTMACE_MODELS" not in os.environ
    np.testing.assert_allclose(
        there.structures[0].positions, here.structures[0].positions, rtol=0, atol=1e-12
    )
    np.testing.assert_allclose(
        there.structures[0].get_velocities(), here.structures[0].get_velocities(), rtol=0,
        atol=1e-12,
    )  # fmt: skip
    assert there.steps == 10 and there.output == tmp_path / "there"
    assert there.model == here.model and len(there.thermo) == len(here.thermo) == 1
    for name, value in here.thermo[0].items():
        assert there.thermo[0][name] == pytest.approx(value, rel=1e-12), name
    assert "runner:    a child process (extra variables: FASTMACE_MODELS)" in there.report
    assert (tmp_path / "there" / "report.txt").read_text() == there.report
    schema = json.loads(SCHEMA.read_text())
    child = json.loads((tmp_path / "there" / "metadata.json").read_text())
    jsonschema.validate(child, schema)
    assert child["runner"] == {"subprocess": True, "environment": ["FASTMACE_MODELS"]}
    # The variable reached the child: it read the value there.
    assert child["environment"]["read"]["FASTMACE_MODELS"] == models
    parent = json.loads((tmp_path / "here" / "metadata.json").read_text())
    assert parent["runner"] == {"subprocess": False, "environment": []}
    assert_no_handoff_left(cache)


def test_a_run_without_output_returns_its_structures_and_leaves_no_handoff(cache):
    atoms = copper()
    atoms.set_velocities(np.full((len(atoms), 3), 1e-3))  # carried to the child and kept
    log = io.StringIO()
    runner = RunnerConfig(subprocess=True)
    nve = {name: value for name, value in RUN.items() if name != "temperature_K"}
    result = fm.md(atoms, **nve, ensemble="nve", runner=runner, progress=log)
    (final,) = result.structures
    assert len(final) == 8 and result.steps == 10 and result.output is None
    assert not np.array_equal(final.positions, atoms.positions)
    assert result.thermo[0]["step"] == 10 and result.timings["steps_per_s"] > 0
    assert "done: 10 steps" in log.getvalue()  # the child's progress, passed on
    assert (cache / "handoff").is_dir()
    assert_no_handoff_left(cache)


def test_a_failing_child_raises_runner_error_and_leaves_no_handoff(cache, tmp_path):
    # A file that passes every check made before loading, and fails to load in the child.
    not_a_model = tmp_path / "not-a-model.model"
    not_a_model.write_bytes(b"not a checkpoint")
    runner = RunnerConfig(subprocess=True)
    arguments = {**RUN, "model": str(not_a_model), "trusted": True}
    with pytest.raises(RunnerError, match="exit code 1: NotAMaceModelError") as raised:
        fm.md(copper(), **arguments, runner=runner, progress=io.StringIO())
    assert raised.value.returncode == 1
    assert "not-a-model.model" in raised.value.child_error and "Traceback" in raised.value.tail
    assert_no_handoff_left(cache)


def test_a_request_refused_up_front_starts_no_child(cache):
    runner = RunnerConfig(subprocess=True)
    with pytest.raises(UnknownLabelError, match="no-such-model"):
        fm.md(copper(), **{**RUN, "model": "no-such-model"}, runner=runner, progress=io.StringIO())
    assert not (cache / "handoff").exists()


def test_a_child_past_its_timeout_is_stopped(cache):
    runner = RunnerConfig(subprocess=True, timeout_s=0.5)
    with pytest.raises(RunnerError, match=r"did not finish within 0.5 s") as raised:
        fm.md(copper(), **RUN, runner=runner, progress=io.StringIO())
    assert raised.value.returncode is None
    assert_no_handoff_left(cache)


def test_the_gate_child_gets_the_environment(cache, tmp_path):
    # A PYTHONPATH whose sitecustomize stops the child at start-up: the gate fails, saying so.
    (tmp_path / "stop").mkdir()
    (tmp_path / "stop" / "sitecustomize.py").write_text(
        "import os, sys\nprint('the gate child got the environment', file=sys.stderr)\n"
        "sys.stderr.flush()\nos._exit(3)\n"
    )
    runner = RunnerConfig(environment={"PYTHONPATH": str(tmp_path / "stop")})
    with pytest.raises(GateError, match="the gate child got the environment"):
        fm.md(copper(), **RUN, check="gate", runner=runner, progress=io.StringIO())
    assert str(tmp_path / "stop") not in os.environ.get("PYTHONPATH", "")


def test_a_bad_variable_for_the_children_is_refused_before_anything_starts(cache):
    # The children would parse it: refused here, before a model is loaded or a child started.
    runner = RunnerConfig(subprocess=True, environment={"FASTMACE_SOFT_FILE_LOCKS": "bogus"})
    with pytest.raises(fm.EnvironmentVariableError, match="FASTMACE_SOFT_FILE_LOCKS='bogus'"):
        fm.md(copper(), **RUN, runner=runner, progress=io.StringIO())
    assert "FASTMACE_SOFT_FILE_LOCKS" not in os.environ and not (cache / "handoff").exists()


def test_child_environment_puts_this_fastmace_first_and_applies_extra(monkeypatch):
    package_parent = str(Path(fm.__file__).resolve().parents[1])
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.delenv("FASTMACE_TEST_EXTRA", raising=False)
    env = child_environment({"FASTMACE_TEST_EXTRA": "1"})
    assert env["PYTHONPATH"].split(os.pathsep) == [package_parent, "/elsewhere"]
    assert env["FASTMACE_TEST_EXTRA"] == "1" and "FASTMACE_TEST_EXTRA" not in os.environ
    assert os.environ["PYTHONPATH"] == "/elsewhere"
    # A PYTHONPATH of the caller's comes after this FastMACE, too.
    env = child_environment({"PYTHONPATH": "/mine"})
    assert env["PYTHONPATH"].split(os.pathsep) == [package_parent, "/mine"]
    monkeypatch.delenv("PYTHONPATH")
    assert child_environment({})["PYTHONPATH"] == package_parent


@pytest.mark.parametrize(
    ("arguments", "match"),
    [
        ({"subprocess": "yes"}, "subprocess='yes'"),
        ({"environment": [("A", "1")]}, "use a mapping"),
        ({"environment": {"": "1"}}, "'' is not a variable name"),
        ({"environment": {"A=B": "1"}}, "'A=B' is not a variable name"),
        ({"environment": {"OMP_NUM_THREADS": 4}}, r"\['OMP_NUM_THREADS'\] = 4"),
        ({"timeout_s": 0}, "timeout_s=0"),
        ({"timeout_s": float("nan")}, "timeout_s=nan"),
        ({"timeout_s": True}, "timeout_s=True"),
    ],
)
def test_runner_config_refuses_bad_values(arguments, match):
    with pytest.raises(ValueError, match=match):
        RunnerConfig(**arguments)


def test_runner_config_keeps_its_own_copy():
    environment = {"A": "1", "B": ""}
    runner = RunnerConfig(subprocess=True, environment=environment, timeout_s=60)
    environment["A"] = "changed"
    assert runner.to_dict() == {
        "subprocess": True, "environment": {"A": "1", "B": ""}, "timeout_s": 60,
    }  # fmt: skip
    assert fm.RunnerConfig is RunnerConfig and RunnerConfig().to_dict()["subprocess"] is False
    with pytest.raises(TypeError):
        runner.environment["A"] = "2"  # type: ignore[index]


def test_arguments_travel_as_json_and_the_rest_is_refused_before_anything_starts(cache):
    encoded = encode_arguments(
        {"output": Path("run"), "repeat": (2, 1, 1), "temperature_K": np.array([300.0, 400.0]),
         "config": fm.EngineConfig(block_steps=5)}
    )  # fmt: skip
    assert encoded["output"] == "run" and encoded["repeat"] == [2, 1, 1]
    assert encoded["temperature_K"] == [300.0, 400.0] and encoded["config"]["block_steps"] == 5
    runner = RunnerConfig(subprocess=True)
    with pytest.raises(TypeError, match="temperature_K=<object"):
        fm.md(copper(), model="demo-emt-cu", temperature_K=object(), runner=runner)
    with pytest.raises(FileNotFoundError, match="no structure file"):
        fm.md(cache / "missing.extxyz", temperature_K=300.0, runner=runner)
    assert not (cache / "handoff").exists()


def test_cli_makes_the_runner_config(monkeypatch, tmp_path):
    calls = []

    class Result:
        report = "report\n"

    def fake_md(structure, **settings):
        calls.append(settings)
        return Result()

    monkeypatch.setattr("fastmace.api.md", fake_md)
    args = ["md", str(EXAMPLE), "-o", str(tmp_path / "run"), "--subprocess",
            "--env", "A=1", "--env", "B=x=y"]  # fmt: skip
    assert cli_main(args) == 0
    assert calls[-1]["runner"] == RunnerConfig(subprocess=True, environment={"A": "1", "B": "x=y"})
    assert cli_main(["md", str(EXAMPLE), "-o", str(tmp_path / "plain")]) == 0
    assert "runner" not in calls[-1]
    config = tmp_path / "config.toml"
    config.write_text(
        f'structure = "{EXAMPLE}"\nsubprocess = true\nsteps = 5\ntemperature_K = 300\n'
        '[environment]\nOMP_NUM_THREADS = "1"\n'
    )
    assert cli_main(["run", str(config)]) == 0
    assert calls[-1]["runner"] == RunnerConfig(
        subprocess=True, environment={"OMP_NUM_THREADS": "1"}
    )
    assert calls[-1]["steps"] == 5 and "subprocess" not in calls[-1]
    with pytest.raises(SystemExit):
        cli_main(["md", str(EXAMPLE), "--env", "NO_EQUALS"])
