"""A CPU run of the demo model says nothing on stderr but its progress: the libraries' warnings
about their own code are silenced where they are raised, and only there."""

from __future__ import annotations

import re
import warnings

from conftest import EXAMPLE, run_fastmace

# A Python warning ("...: UserWarning: ...", "warnings.warn(") or a torch log line ("W1201 ...").
NOISE = re.compile(r"Warning\b|warnings\.warn|^[WE]\d{4} ", re.MULTILINE)


def test_fastmace_md_on_the_cpu_prints_no_warnings(clean_env, tmp_path):
    args = ["md", str(EXAMPLE), "--temperature", "300", "--steps", "4", "-o", str(tmp_path / "r")]
    result = run_fastmace(args, clean_env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert NOISE.search(result.stderr) is None, result.stderr
    assert "done: 4 steps" in result.stderr


def test_the_users_warning_filters_are_left_as_they_were():
    import fastmace as fm

    fm.md(EXAMPLE, temperature_K=300.0, steps=2)  # torch's and mace's own imports add filters
    before = list(warnings.filters)
    fm.md(EXAMPLE, temperature_K=300.0, steps=2)
    assert warnings.filters == before
