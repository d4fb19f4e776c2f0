"""Replicas: copies of a structure in one batch, each on its own random stream (seed + system
index), so each follows the trajectory it would follow alone with that seed."""

from __future__ import annotations

import csv
import json

import ase.build
import numpy as np
import pytest
from conftest import run_fastmace, same_trajectory_atol_A

import fastmace as fm
from fastmace.cli.md import read_config
from fastmace.preflight import RequestError

COMMON = {"model": "demo-emt-cu", "temperature_K": 300.0, "steps": 20, "seed": 5}


def copper() -> ase.Atoms:
    atoms = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 2, 2))
    atoms.rattle(0.02, seed=1)
    return atoms


def test_each_replica_follows_its_own_stream_as_it_would_alone():
    result = fm.md(copper(), replicas=3, **COMMON)
    assert len(result.structures) == 3
    assert "K (per system)" in result.summary()  # one final temperature per replica
    first = result.structures[0].positions
    for copy in result.structures[1:]:  # independent noise: the copies part ways
        assert np.abs(copy.positions - first).max() > 1e-3
    for index in (0, 2):
        alone = fm.md(copper(), **{**COMMON, "seed": COMMON["seed"] + index})
        np.testing.assert_allclose(
            result.structures[index].positions,
            alone.structures[0].positions,
            rtol=0,
            atol=same_trajectory_atol_A(),
        )


def test_systems_whose_cells_overlap_in_space_never_interact():
    # The second system's atoms sit 0.3 Å from the first's: were they seen by each other's
    # neighbour list, the forces would be enormous. Each follows its trajectory alone.
    first, second = copper(), copper()
    second.positions += 0.3
    batch = fm.md([first, second], **COMMON)
    for index, atoms in enumerate((first, second)):
        alone = fm.md(atoms, **{**COMMON, "seed": COMMON["seed"] + index})
        np.testing.assert_allclose(
            batch.structures[index].positions,
            alone.structures[0].positions,
            rtol=0,
            atol=same_trajectory_atol_A(),
        )


def test_per_system_settings_count_the_copies():
    result = fm.md(
        [copper(), copper()], replicas=2, **{**COMMON, "temperature_K": [300, 300, 900, 900]}
    )
    assert len(result.structures) == 4
    with pytest.raises(ValueError, match="temperature_K"):
        fm.md(copper(), replicas=2, **{**COMMON, "temperature_K": [300, 600, 900]})


@pytest.mark.parametrize("replicas", [0, -2, 1.5, "3", True])
def test_bad_replicas_are_refused_before_anything_runs(replicas, tmp_path):
    with pytest.raises(RequestError, match="replicas must be a positive integer"):
        fm.md(copper(), replicas=replicas, output=tmp_path / "run", **COMMON)
    assert not (tmp_path / "run").exists()


def test_too_many_replicas_are_refused_with_the_atom_count():
    with pytest.raises(RequestError, match=r"10,000,000 replicas make 320,000,000 atoms"):
        fm.md(copper(), replicas=10_000_000, **COMMON)


def test_the_command_line_runs_replicas_into_one_run_directory(tmp_path, clean_env):
    structure = tmp_path / "cu.extxyz"
    copper().write(structure)
    done = run_fastmace(
        ["md", str(structure), "--model", "demo-emt-cu", "--steps", "10", "--replicas", "2",
         "--temperature", "300", "--thermo-every", "5", "--output", str(tmp_path / "run")],
        clean_env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = (tmp_path / "run" / "thermo.csv").read_text().splitlines()
    systems = {row.split(",")[1] for row in rows[1:]}
    assert rows[0].split(",")[1] == "system" and systems == {"0", "1"}
    assert "final 0:" in done.stdout and "final 1:" in done.stdout  # the report, per replica


# A run config's [[systems]] tables: a structure each, with the settings that may differ.

SYSTEMS = """model = "demo-emt-cu"
ensemble = "nvt"
steps = 10
thermo_every = 5
replicas = 2
friction_per_ps = 5.0

[[systems]]
structure = "a.extxyz"
temperature_K = 300

[[systems]]
structure = "b.extxyz"
temperature_K = 900
friction_per_ps = 10.0
"""


def test_systems_tables_give_each_structure_its_settings_and_copies(tmp_path, clean_env):
    copper().write(tmp_path / "a.extxyz")
    copper()[:16].write(tmp_path / "b.extxyz")
    config = tmp_path / "run.toml"
    config.write_text('output = "run"\n' + SYSTEMS)  # top-level keys before the tables
    done = run_fastmace(["run", str(config)], clean_env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    metadata = json.loads((tmp_path / "run" / "metadata.json").read_text())
    settings = metadata["settings"]["ensemble_settings"]
    assert settings["temperature_K"] == [300, 300, 900, 900]
    assert settings["friction_per_ps"] == [5.0, 5.0, 10.0, 10.0]
    rows = list(csv.DictReader((tmp_path / "run" / "thermo.csv").open()))
    assert sorted({row["system"] for row in rows}) == ["0", "1", "2", "3"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('structure = "a.extxyz"\n', 'structure = "a.extxyz"\nsteps = 5\n'), "cannot differ"),
        (("model =", 'structure = "a.extxyz"\nmodel ='), "not both"),
        (('structure = "b.extxyz"\n', ""), "needs structure"),
        (("temperature_K = 300\n", ""), "system 1 has no temperature_K"),
    ],
    ids=["setting-that-cannot-differ", "structure-and-systems", "no-structure", "no-value"],
)
def test_bad_systems_tables_are_refused_with_the_file_and_system(tmp_path, change, message):
    config = tmp_path / "run.toml"
    config.write_text(SYSTEMS.replace(*change, 1))
    with pytest.raises(ValueError, match=message) as refused:
        read_config(config)
    assert str(config) in str(refused.value)
