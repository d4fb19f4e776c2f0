"""The progress display: a live line on a terminal, sparse plain lines anywhere else."""

from __future__ import annotations

import io
import re

import pytest

from fastmace.io import Progress
from fastmace.io.progress import format_duration, startup_line


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def simulate(stream, total=100_000, block=100, seconds_per_block=0.2) -> Progress:
    clock = FakeClock()
    progress = Progress(total, timestep_fs=1.0, stream=stream, clock=clock)
    for step in range(block, total + 1, block):
        clock.now += seconds_per_block
        progress.update(step)
    progress.close()
    return progress


def test_terminal_shows_eta_rate_and_ns_per_day():
    terminal = FakeTerminal()
    simulate(terminal, total=10_000)
    text = terminal.getvalue()
    assert "\r" in text
    first = text.split("\r")[2]  # after the first redraw interval
    assert re.search(r"step [\d,]+/10,000 \(\d+\.\d %\)", first)
    assert "500.0 steps/s" in first  # 100 steps per 0.2 s
    assert "43.20 ns/day" in first  # 500 steps/s x 1 fs x 86400 s
    assert re.search(r"ETA 0:00:\d\d", first)
    assert text.endswith("\n") and "done: 10,000 steps in 0:00:20" in text


def test_log_file_gets_few_plain_lines():
    log = io.StringIO()  # not a terminal
    simulate(log, total=100_000)  # 1000 updates over 200 s
    text = log.getvalue()
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    assert len(lines) == 11  # one per 10 % of the run, and the summary
    assert lines[0].startswith("step 10,000/100,000 (10.0 %)")
    assert "ETA" in lines[0] and "ns/day" in lines[0]
    assert lines[-1].startswith("done: 100,000 steps")


def test_log_file_gets_a_line_every_few_minutes_on_a_slow_run():
    log = io.StringIO()
    simulate(log, total=1_000, block=1, seconds_per_block=1.0)  # 10 % every 100 s
    assert len(log.getvalue().splitlines()) == 11
    log = io.StringIO()
    simulate(log, total=100, block=1, seconds_per_block=60.0)  # 10 % every 10 min
    lines = log.getvalue().splitlines()
    assert len(lines) == 21  # every 5 minutes (20 of them) and the summary


def test_resumed_run_counts_from_its_start_step():
    log = io.StringIO()
    clock = FakeClock()
    progress = Progress(1000, 2.0, start_step=900, stream=log, clock=clock)
    clock.now += 10.0
    progress.update(1000)
    assert "step 1,000/1,000 (100.0 %)  10.0 steps/s  1.73 ns/day  ETA 0:00:00" in log.getvalue()


def test_bad_arguments():
    with pytest.raises(ValueError, match="start_step"):
        Progress(10, 1.0, start_step=20)
    with pytest.raises(ValueError, match="timestep_fs must be positive"):
        Progress(10, 0.0)


def test_format_duration():
    assert format_duration(3725) == "1:02:05"
    assert format_duration(90_000) == "1d 1:00:00"


def test_the_summary_tells_the_average_from_the_steady_speed():
    """Start-up makes a run's average slower than its steady speed; the last line says which
    is which, and the steady one is the report's."""
    log, clock = io.StringIO(), FakeClock()
    progress = Progress(1000, 2.0, stream=log, clock=clock)
    clock.now += 10.0  # start-up: warm-up and capture
    progress.update(100)
    clock.now += 2.0  # 900 steady steps at 450 steps/s
    progress.update(1000)
    progress.close(steady_steps_per_s=450.0)
    last = log.getvalue().splitlines()[-1]
    assert last == (
        "done: 1,000 steps in 0:00:12, 83.3 steps/s on average; steady 450.0 steps/s, "
        "77.76 ns/day (start-up excluded, as in the report)"
    )


def test_startup_line_names_each_part_and_the_path() -> None:
    timings = {
        "process_to_first_step_s": 12.34, "to_first_step_s": 8.0, "load_s": 2.0,
        "setup_s": 4.5, "first_block_s": 1.0,
    }  # fmt: skip
    line = startup_line("cueq float32 on cuda, compiled, radial tables", timings, compile_s=3.9)
    assert line == (
        "start-up 12.3 s to the first step: process before the run (Python, imports, input) "
        "4.3 s, model 2.0 s, "
        "set-up 4.5 s (compilation 3.9 s), first block 1.0 s, other 0.5 s; "
        "running cueq float32 on cuda, compiled, radial tables"
    )
    # With FastMACE's own kernels the set-up's first forces run eagerly (the first-state
    # check): the compilation is said where it happened, in the first block.
    timings = {"check_s": 0.2, "to_first_step_s": 9.0, "setup_s": 3.0,
               "first_outputs_s": 1.5, "first_block_s": 4.3}  # fmt: skip
    line = startup_line("cueq", timings, compile_s=3.6, compiled_in="first_block_s")
    assert line == (
        "start-up 9.0 s to the first step: request check 0.2 s, set-up 3.0 s, "
        "step 0's outputs 1.5 s, first block 4.3 s (compilation 3.6 s); running cueq"
    )
    # fm.md called from Python: no process start to count from, no gate, nothing left over.
    line = startup_line("e3nn", {"to_first_step_s": 3.0, "setup_s": 2.0, "first_block_s": 1.0})
    assert line == "start-up 3.0 s to the first step: set-up 2.0 s, first block 1.0 s; running e3nn"


def test_a_note_ends_the_live_line_first() -> None:
    terminal = FakeTerminal()
    progress = Progress(100, timestep_fs=1.0, stream=terminal, clock=FakeClock())
    progress.update(10)
    progress.note("start-up 1.0 s")
    assert terminal.getvalue().endswith("\nstart-up 1.0 s\n")
