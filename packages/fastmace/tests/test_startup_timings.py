"""Start-up phase by phase: metadata.json's timings and the report's start-up line, from a
real ``fastmace md`` process, and the process clock they count from."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from conftest import run_fastmace, run_python

from fastmace.provenance import startup_summary

EXAMPLE = Path(__file__).parents[3] / "examples" / "cu-fcc-32.extxyz"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the clock reads Linux's /proc")
def test_the_process_clock_counts_from_the_process_start(clean_env):
    code = (
        "import time; time.sleep(1.5)\n"
        "from fastmace.runtime.process_clock import seconds_since_process_start\n"
        "print(seconds_since_process_start())"
    )
    started = time.monotonic()
    result = run_python(code, clean_env)
    wall = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    since_start = float(result.stdout.strip())
    # The child slept 1.5 s before asking, and cannot have run longer than we waited for it.
    assert 1.5 <= since_start <= wall


def test_fastmace_md_records_each_start_up_phase(clean_env, tmp_path):
    output = tmp_path / "run"
    args = [
        "md", str(EXAMPLE), "--temperature", "300", "--steps", "20", "--thermo-every", "10",
        "--traj-every", "10", "-o", str(output),
    ]  # fmt: skip
    started = time.monotonic()
    result = run_fastmace(args, clean_env)
    wall = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    timings = json.loads((output / "metadata.json").read_text())["timings"]
    names = ("check_s", "plan_s", "load_s", "setup_s", "first_outputs_s", "first_block_s")
    phases = sum(timings[name] for name in names)
    assert all(timings[name] > 0 for name in names)
    # Each phase's timed parts happen inside it.
    load_parts = ("load_read_s", "load_convert_s")
    assert "load_check_s" not in timings  # e3nn on the CPU: nothing to compare the model with
    setup_parts = ("setup_potential_s", "setup_neighbours_s", "setup_first_forces_s")
    assert all(timings[name] >= 0 for name in load_parts + setup_parts)
    assert sum(timings[name] for name in load_parts) <= timings["load_s"]
    assert sum(timings[name] for name in setup_parts) <= timings["setup_s"]
    assert "gate_s" not in timings and "capture_s" not in timings  # no gate, no graphs on CPU
    # The phases run one after another inside the request, which runs inside the process.
    assert phases <= timings["to_first_step_s"] <= timings["process_to_first_step_s"] <= wall
    assert timings["to_first_step_s"] < timings["to_steady_s"]
    report = (output / "report.txt").read_text()
    assert f"start-up:  {startup_summary(timings)}" in report
    assert "after the process started" in report


@pytest.mark.parametrize(
    ("timings", "line"),
    [
        pytest.param(
            {
                "setup_s": 5.53, "load_s": 12.0, "gate_s": 4.0, "first_block_s": 0.72,
                "capture_s": 1.1, "to_first_step_s": 23.4, "steps_per_s": 29.6,
            },
            "load 12.0 s, gate 4.0 s, setup 5.5 s, first block 0.7 s, capture 1.1 s; "
            "first step done 23.4 s after the request",
            id="phases-in-order",
        ),
        pytest.param(
            {
                "load_s": 18.0, "load_read_s": 2.0, "load_convert_s": 5.04, "load_check_s": 10.0,
                "setup_s": 5.6, "setup_neighbours_s": 0.3, "setup_first_forces_s": 4.9,
            },
            "load 18.0 s (read 2.0, convert 5.0, check 10.0), "
            "setup 5.6 s (neighbours 0.3, first forces 4.9)",
            id="parts-of-a-phase",
        ),
    ],
)  # fmt: skip
def test_the_start_up_line(timings: dict[str, float], line: str) -> None:
    assert startup_summary(timings) == line
