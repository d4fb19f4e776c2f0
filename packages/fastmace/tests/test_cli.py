"""The command line's frame: version, help, usage errors."""

from __future__ import annotations

from conftest import run_fastmace

import fastmace


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
    clean_env["FASTMACE_SOFT_FILE_LOCKS"] = "on"
    result = run_fastmace(["doctor"], clean_env)
    assert result.returncode != 0
    assert "FASTMACE_SOFT_FILE_LOCKS='on' is not allowed" in result.stderr
