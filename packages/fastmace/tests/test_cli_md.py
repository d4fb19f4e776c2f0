"""``fastmace md`` and ``fastmace run`` in child processes, as users run them."""

from __future__ import annotations

import csv
import json
from argparse import ArgumentTypeError

import pytest
from conftest import EXAMPLE, run_fastmace

from fastmace.cli.main import build_parser
from fastmace.cli.md import _per_system_numbers


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


def test_md_radial_table_runs_in_float32_and_is_refused_in_float64(clean_env, tmp_path):
    run = tmp_path / "run"
    base = ["md", str(EXAMPLE), "--temperature", "300", "--steps", "4", "--radial-table"]
    result = run_fastmace([*base, "--dtype", "float32", "--output", str(run)], clean_env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "radial weights from tables" in result.stdout
    metadata = json.loads((run / "metadata.json").read_text())
    assert metadata["engine"]["radial_table"]["intervals"] >= 256
    # The demo model is float64 on the CPU: the table would exceed its rounding.
    refused = run_fastmace([*base, "--output", str(tmp_path / "refused")], clean_env)
    assert refused.returncode == 1 and "float32 local model" in refused.stderr
    assert "Traceback" not in refused.stderr and not (tmp_path / "refused").exists()


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


def _option_help(help_text: str) -> dict[str, str]:
    """Each option's entry in ``--help``, by its first flag, its lines joined."""
    entries: dict[str, str] = {}
    flag = None
    for line in help_text.splitlines():
        if line.startswith("  -"):
            flag = line.split()[0].rstrip(",")
            entries[flag] = line.strip()
        elif flag is not None and line.startswith("    "):
            entries[flag] += " " + line.strip()
        else:
            flag = None
    return entries


def test_md_help_shows_every_default_and_the_units(clean_env):
    clean_env["COLUMNS"] = "100"
    result = run_fastmace(["md", "--help"], clean_env)
    assert result.returncode == 0, result.stderr
    entries = _option_help(result.stdout)
    # What argparse fills in when an option is not given: each such default is on show.
    args = build_parser().parse_args(["md", "structure.xyz"])
    shown = 0
    for dest, flag in args.flags.items():
        default = getattr(args, dest, None)  # (-h has no value)
        if default is not None and default is not False:  # 0 is a default to show
            assert f"(default: {default})" in entries[flag], entries[flag]
            shown += 1
    assert shown >= 9
    # Defaults decided later (the integrators', a new run's timestep) are written out.
    assert "(default: 1.0; with --resume, the saved one)" in entries["--timestep"]
    # An ensemble setting's help names the ensembles that take it, then its default.
    assert entries["--friction"].endswith("(nvt-langevin; default: 1.0)")
    assert entries["--tau"].endswith("(nvt-csvr, nvt-nose-hoover; default: 100.0)")
    assert entries["--barostat-tau"].endswith("(npt; default: 1000.0)")
    # Physical quantities say their unit, in the metavar and in words.
    units = {
        "--temperature": ("K", "in K"), "--initial-temperature": ("K", "in K"),
        "--pressure": ("GPA", "in GPa"),
        "--timestep": ("FS", "in fs"), "--friction": ("PER_PS", "in 1/ps"),
        "--tau": ("FS", "in fs"), "--pressure-bar": ("BAR", "in bar"),
        "--compressibility": ("PER_GPA", "in 1/GPa"), "--thermostat-tau": ("FS", "in fs"),
    }  # fmt: skip
    for flag, (metavar, words) in units.items():
        assert entries[flag].startswith(f"{flag} {metavar} ") and words in entries[flag]


def test_run_and_plot_help(clean_env):
    run = run_fastmace(["run", "--help"], clean_env)
    assert run.returncode == 0 and "TOML file" in run.stdout
    plot = _option_help(run_fastmace(["plot", "--help"], clean_env).stdout)
    assert "(default: RUN_DIR/thermo.png, or relax.png for a relaxation)" in plot["--output"]


def test_per_system_numbers_take_one_value_or_one_per_system():
    assert _per_system_numbers("--temperature", "300") == 300.0
    assert _per_system_numbers("--charge", "1,-1,0") == [1.0, -1.0, 0.0]
    with pytest.raises(ArgumentTypeError, match=r"--temperature takes a number or one per"):
        _per_system_numbers("--temperature", "300,x")
    with pytest.raises(ArgumentTypeError, match=r"--charge takes a number or one per system"):
        _per_system_numbers("--charge", "1,x")
