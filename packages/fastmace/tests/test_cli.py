"""The command line's frame: version, help, usage errors."""

from __future__ import annotations

from conftest import run_fastmace

import fastmace
from fastmace.cli.main import attach_negative_numbers, build_parser


def test_version(clean_env):
    result = run_fastmace(["--version"], clean_env)
    assert result.returncode == 0
    assert result.stdout.strip() == f"fastmace {fastmace.__version__}"


def test_no_command_is_a_usage_error(clean_env):
    result = run_fastmace([], clean_env)
    assert result.returncode == 2
    assert "COMMAND" in result.stderr


def test_unknown_command(clean_env):
    result = run_fastmace(["fly"], clean_env)
    assert result.returncode == 2
    assert "invalid choice: 'fly'" in result.stderr


def test_help_lists_doctor(clean_env):
    result = run_fastmace(["--help"], clean_env)
    assert result.returncode == 0 and "doctor" in result.stdout


def test_bad_lock_setting_at_the_command_line(clean_env):
    # Doctor runs and reports it (it used to be an import error with a traceback).
    clean_env["FASTMACE_SOFT_FILE_LOCKS"] = "on"
    result = run_fastmace(["doctor"], clean_env)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "[FAIL] environment: FASTMACE_SOFT_FILE_LOCKS='on' is not allowed" in result.stdout


def test_models_list_shows_labels_heads_and_licences(clean_env):
    result = run_fastmace(["models", "list"], clean_env)
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    mh1 = next(line for line in lines if line.startswith("mh-1 "))
    assert "omat_pbe, mp_pbe_refit_add" in mh1 and "ASL" in mh1
    demo = next(line for line in lines if line.startswith("demo-emt-cu "))
    assert demo.endswith("shipped")
    assert "ASL = Academic Software License (non-commercial use only)" in result.stdout


def test_models_verify_flags_a_damaged_file(clean_env, tmp_path):
    models = tmp_path / "cache" / "models"
    models.mkdir(parents=True)
    (models / "mace-mh-1.model").write_bytes(b"truncated")
    clean_env["FASTMACE_CACHE"] = str(tmp_path / "cache")
    result = run_fastmace(["models", "verify"], clean_env)
    assert result.returncode == 1
    assert f"{models / 'mace-mh-1.model'} (mh-1): SHA-256 MISMATCH" in result.stdout
    assert (models / "mace-mh-1.model").exists()


def test_models_fetch_unknown_label(clean_env):
    result = run_fastmace(["models", "fetch", "mh-7"], clean_env)
    assert result.returncode == 1
    assert "unknown model label 'mh-7'" in result.stderr


def test_negative_numbers_in_scientific_notation_are_values():
    """``--pressure -1e5`` as the user means it (argparse alone takes -1e5 for an option)."""
    argv = ["md", "s.xyz", "--pressure", "-1e5", "--temperature", "-1.5e2,3", "--compile"]
    assert attach_negative_numbers(argv) == [
        "md", "s.xyz", "--pressure=-1e5", "--temperature=-1.5e2,3", "--compile",
    ]  # fmt: skip
    args = build_parser().parse_args(attach_negative_numbers(["md", "s.xyz", "--pressure", "-1e5"]))
    assert args.pressure_GPa == -1e5
    # What is not a number, or follows no long option, stays as it was.
    for kept in (["--output", "-run"], ["--pressure", "-inf"], ["-o", "-1e5"], ["--a=1", "-2"]):
        assert attach_negative_numbers(kept) == kept
