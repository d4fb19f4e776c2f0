"""``fastmace md`` and ``fastmace run`` in child processes, as users run them."""

from __future__ import annotations

import csv

from conftest import EXAMPLE, run_fastmace


def test_md_writes_a_run_directory_and_refuses_to_overwrite_it(clean_env, tmp_path):
    run = tmp_path / "run"
    args = ["md", str(EXAMPLE), "--temperature", "300", "--steps", "10", "--timestep", "2",
            "--thermo-every", "5", "--traj-every", "5", "--output", str(run)]  # fmt: skip
    first = run_fastmace(args, clean_env)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "FastMACE run report" in first.stdout and "nvt-langevin" in first.stdout
    rows = list(csv.DictReader((run / "thermo.csv").open()))
    assert [int(r["step"]) for r in rows] == [0, 5, 10]
    second = run_fastmace(args, clean_env)
    assert second.returncode == 1
    assert "resume" in second.stderr and "Traceback" not in second.stderr


def test_run_config_runs_and_resolves_paths_against_the_file(clean_env, tmp_path):
    (tmp_path / "cu.extxyz").write_text(EXAMPLE.read_text())
    config = tmp_path / "config.toml"
    config.write_text(
        'structure = "cu.extxyz"\nensemble = "nve"\nsteps = 5\ntimestep_fs = 1.0\n'
        'initial_temperature_K = 100\noutput = "out"\nthermo_every = 5\ntrajectory_every = 0\n'
    )
    result = run_fastmace(["run", str(config)], clean_env, cwd=tmp_path / "..")
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "out" / "thermo.csv").is_file()


def test_run_config_refuses_unknown_keys(clean_env, tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('structure = "cu.extxyz"\ntemprature_K = 300\n')
    result = run_fastmace(["run", str(config)], clean_env)
    assert result.returncode == 1
    assert "unknown key(s) temprature_K" in result.stderr and "temperature_K" in result.stderr
    missing = tmp_path / "missing.toml"
    missing.write_text("steps = 10\n")
    result = run_fastmace(["run", str(missing)], clean_env)
    assert result.returncode == 1 and "'structure'" in result.stderr
