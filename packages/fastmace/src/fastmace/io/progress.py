"""A progress display for long runs: steps, steps/s, ns/day and the time left (ETA).

On a terminal it redraws one line in place (carriage return), at most twice a second. Any other
stream (a log file, a batch system's output) gets plain lines only, and few of them: one each
time another 10 % of the run is done, or after 5 minutes without a line, whichever comes first,
so that a day-long job's log shows signs of life without being flooded.
"""

from __future__ import annotations

import math
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import TextIO

_WINDOW_S = 60.0  # steps/s is measured over the last minute: a recapture does not skew it long
_REDRAW_S = 0.5
_QUIET_FRACTION = 0.1
_QUIET_INTERVAL_S = 300.0


def _is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def format_duration(seconds: float) -> str:
    """``H:MM:SS`` (days spelled out past 24 h)."""
    seconds = max(0, round(seconds))
    days, seconds = divmod(seconds, 86_400)
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    text = f"{hours}:{minutes:02d}:{seconds:02d}"
    return f"{days}d {text}" if days else text


class Progress:
    """Reports a run's progress to ``stream`` (stderr by default); call :meth:`update` per block.

    Args:
        total_steps: the step the run ends at.
        timestep_fs: the MD time step, for ns/day.
        start_step: the step this session starts from (a resumed run's restart step).
        stream: where to write; a terminal gets a live line, anything else sparse plain lines.
        clock: seconds, monotonic; tests pass a fake one.
    """

    def __init__(
        self,
        total_steps: int,
        timestep_fs: float,
        *,
        start_step: int = 0,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if total_steps < 0 or not 0 <= start_step <= total_steps:
            raise ValueError(
                f"need 0 <= start_step <= total_steps, got start_step={start_step}, "
                f"total_steps={total_steps}"
            )
        if timestep_fs <= 0:
            raise ValueError(f"timestep_fs must be positive, got {timestep_fs}")
        self.total_steps = total_steps
        self.timestep_fs = timestep_fs
        self.start_step = start_step
        self.stream = sys.stderr if stream is None else stream
        self.live = _is_terminal(self.stream)
        self._clock = clock
        self._started = clock()
        self._samples: deque[tuple[float, int]] = deque([(self._started, start_step)])
        self._step = start_step
        self._last_draw = -float("inf")
        self._last_line = self._started
        self._next_fraction = self._fraction(start_step) + _QUIET_FRACTION
        self._width = 0

    def steps_per_second(self) -> float | None:
        """Recent speed, or None before there is any."""
        (first_time, first_step), (last_time, last_step) = self._samples[0], self._samples[-1]
        if last_time <= first_time or last_step <= first_step:
            return None
        return (last_step - first_step) / (last_time - first_time)

    def line(self) -> str:
        """The progress text: step, percentage, steps/s, ns/day and ETA."""
        rate = self.steps_per_second()
        percent = 100.0 * self._fraction(self._step)
        text = f"step {self._step:,}/{self.total_steps:,} ({percent:.1f} %)"
        if rate is None:
            return f"{text}  -- steps/s  -- ns/day  ETA --"
        ns_per_day = rate * self.timestep_fs * 1e-6 * 86_400
        eta = format_duration((self.total_steps - self._step) / rate)
        return f"{text}  {rate:,.1f} steps/s  {ns_per_day:,.2f} ns/day  ETA {eta}"

    def update(self, step: int) -> None:
        """Record that the run has reached ``step``, and show it if it is time to."""
        now = self._clock()
        self._step = step
        self._samples.append((now, step))
        while len(self._samples) > 2 and now - self._samples[1][0] >= _WINDOW_S:
            self._samples.popleft()
        if self.live:
            if now - self._last_draw >= _REDRAW_S or step >= self.total_steps:
                self._draw(self.line())
                self._last_draw = now
        elif (
            self._fraction(step) >= self._next_fraction - 1e-12
            or now - self._last_line >= _QUIET_INTERVAL_S
        ):
            self._print(self.line())
            self._last_line = now
            while self._next_fraction <= self._fraction(step) + 1e-12:
                self._next_fraction += _QUIET_FRACTION

    def note(self, text: str) -> None:
        """One line of its own (a live line is ended first and drawn again at the next update)."""
        if self.live and self._width:
            self.stream.write("\n")
            self._width = 0
        self._print(text)

    def close(self, steady_steps_per_s: float | None = None) -> None:
        """End the display with a summary line: the average over the whole session, start-up
        included, and the run's steady speed (the report's) when the caller gives it."""
        elapsed = self._clock() - self._started
        done = self._step - self.start_step
        summary = f"done: {done:,} steps in {format_duration(elapsed)}"
        if elapsed > 0 and done > 0:
            rate = done / elapsed
            summary += f", {rate:,.1f} steps/s on average"
            if steady_steps_per_s is not None and math.isfinite(steady_steps_per_s):
                ns_per_day = steady_steps_per_s * self.timestep_fs * 1e-6 * 86_400
                summary += (
                    f"; steady {steady_steps_per_s:,.1f} steps/s, {ns_per_day:,.2f} ns/day "
                    "(start-up excluded, as in the report)"
                )
            else:
                summary += f", {rate * self.timestep_fs * 1e-6 * 86_400:,.2f} ns/day"
        if self.live and self._width:
            self.stream.write("\n")
        self._print(summary)

    def _fraction(self, step: int) -> float:
        span = self.total_steps - self.start_step
        return 1.0 if span == 0 else (step - self.start_step) / span

    def _draw(self, text: str) -> None:
        # Pad with spaces rather than an ANSI erase, which some terminals show literally.
        self.stream.write("\r" + text.ljust(self._width))
        self.stream.flush()
        self._width = len(text)

    def _print(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()


# metadata.json's start-up phases (docs/output.md), as the start-up line names them.
_STARTUP_PARTS = (
    ("check_s", "request check"),
    ("plan_s", "plan"),
    ("load_s", "model"),
    ("gate_s", "gate"),
    ("setup_s", "set-up"),
    ("first_outputs_s", "step 0's outputs"),
    ("first_block_s", "first block"),
)


def setup_note(stream: TextIO | None, text: str) -> None:
    """One line of a long set-up's progress ("set-up: ..."), to ``stream`` (stderr by
    default), flushed so that it shows at once."""
    out = sys.stderr if stream is None else stream
    out.write(f"set-up: {text}\n")
    out.flush()


def startup_line(
    path: str,
    timings: Mapping[str, float],
    compile_s: float | None = None,
    compiled_in: str = "setup_s",
) -> str:
    """The line a run prints after its first block: how long start-up took, by part, and which
    path runs. ``timings`` are metadata.json's (``to_first_step_s`` and the phases; with
    ``process_to_first_step_s``, what came before the request: Python, imports, the input);
    ``compile_s`` is the first compiled call's share of the part ``compiled_in`` (the set-up's
    first forces, or the first block where those ran eagerly)."""
    total = timings.get("process_to_first_step_s") or timings.get("to_first_step_s", 0.0)
    parts = []
    if "process_to_first_step_s" in timings and "to_first_step_s" in timings:
        before = timings["process_to_first_step_s"] - timings["to_first_step_s"]
        parts.append(f"process before the run (Python, imports, input) {before:.1f} s")
    counted = 0.0
    for key, name in _STARTUP_PARTS:
        if key in timings:
            counted += timings[key]
            text = f"{name} {timings[key]:.1f} s"
            if key == compiled_in and compile_s is not None:
                text += f" (compilation {compile_s:.1f} s)"
            parts.append(text)
    other = timings.get("to_first_step_s", 0.0) - counted
    if other >= 0.05:
        parts.append(f"other {other:.1f} s")
    return f"start-up {total:.1f} s to the first step: {', '.join(parts)}; running {path}"
