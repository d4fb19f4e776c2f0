"""Temperature schedules for MD: anneal, quench, heat, step between temperatures.

Plain data, no torch. A schedule is a list of (step, temperature) points, the first at step 0,
followed linearly ("linear") or held until the next point ("step"). The engine sets each
block's target temperature on the device before the block runs (a copy into the thermostat's
target, so captured blocks replay unchanged): a "step" schedule's points fall on block starts
(the block length divides them), and a "linear" one is followed block by block, each block at
the temperature of its middle step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

SCHEDULE_MODES = ("linear", "step")
# Ensembles whose target temperature may change during a run. NVE has none; the Nose-Hoover
# chain's thermostat masses are set by the starting temperature and its conserved energy
# would not hold under a changing target.
SCHEDULED_ENSEMBLES = ("nvt-langevin", "nvt-csvr", "npt")


class ScheduleError(ValueError):
    """A temperature schedule that cannot be run; the message says what to change."""


@dataclass(frozen=True)
class TemperatureSchedule:
    """Target temperatures (K) at steps, followed ``"linear"`` or held (``"step"``)."""

    points: tuple[tuple[int, float], ...]
    mode: str = "linear"

    def __post_init__(self) -> None:
        if self.mode not in SCHEDULE_MODES:
            raise ScheduleError(
                f"temperature schedule mode {self.mode!r} is not allowed: use "
                f"{' or '.join(repr(mode) for mode in SCHEDULE_MODES)}"
            )
        try:
            points = tuple((step, temperature) for step, temperature in self.points)
        except (TypeError, ValueError):
            raise ScheduleError(
                f"a temperature schedule is a list of (step, temperature_K) pairs, got "
                f"{self.points!r:.80}"
            ) from None
        if not points or points[0][0] != 0:
            raise ScheduleError(
                "a temperature schedule starts at step 0: give [(0, T0), (step, T1), ...]"
            )
        for step, temperature in points:
            if isinstance(step, bool) or not isinstance(step, int) or step < 0:
                raise ScheduleError(f"schedule step {step!r} is not a whole number >= 0")
            if (
                isinstance(temperature, bool)
                or not isinstance(temperature, int | float)
                or not (math.isfinite(temperature) and temperature >= 0)
            ):
                raise ScheduleError(
                    f"schedule temperature {temperature!r} at step {step} is not a temperature "
                    "in K (a finite number >= 0)"
                )
        steps = [step for step, _ in points]
        if any(later <= earlier for earlier, later in pairwise(steps)):
            raise ScheduleError(f"schedule steps must increase, got {steps}")
        object.__setattr__(self, "points", tuple((s, float(t)) for s, t in points))

    @classmethod
    def coerce(cls, value: Any, mode: str | None = None) -> TemperatureSchedule:
        """A schedule from itself, from a list of (step, temperature_K) pairs (followed
        ``mode``, default linear) or from :meth:`to_dict`'s mapping."""
        if isinstance(value, TemperatureSchedule):
            if mode is not None and mode != value.mode:
                raise ScheduleError(f"the schedule's mode is {value.mode!r}, not {mode!r}")
            return value
        if isinstance(value, dict) and set(value) <= {"points", "mode"} and "points" in value:
            return cls.coerce(value["points"], value.get("mode", mode))  # to_dict()'s form
        if isinstance(value, str) or not isinstance(value, Sequence):
            raise ScheduleError(
                "temperature_schedule takes a list of (step, temperature_K) pairs, a mapping "
                f'{{"points": [...], "mode": "linear" or "step"}} or an fm.TemperatureSchedule, '
                f"got {value!r:.80}"
            )
        return cls(tuple(tuple(point) for point in value), mode or "linear")

    def temperature_at(self, step: float) -> float:
        """The target temperature (K) at ``step``: held after the last point."""
        points = self.points
        for (start, low), (end, high) in pairwise(points):
            if step < end:
                if self.mode == "step":
                    return low
                return low + (high - low) * (step - start) / (end - start)
        return points[-1][1]

    def block_temperature(self, first_step: int, steps: int) -> float:
        """The temperature held for the block of ``steps`` steps from ``first_step``."""
        if self.mode == "step":
            return self.temperature_at(first_step)
        return self.temperature_at(first_step + 0.5 * steps)

    def change_steps(self) -> tuple[int, ...]:
        """Steps where a "step" schedule changes: block starts must fall on them."""
        return tuple(step for step, _ in self.points[1:]) if self.mode == "step" else ()

    def hottest_K(self) -> float:
        return max(temperature for _, temperature in self.points)

    def check_ensemble(self, ensemble: str) -> None:
        if ensemble not in SCHEDULED_ENSEMBLES:
            raise ScheduleError(
                f"a temperature schedule needs a thermostat whose target may change: "
                f"{', '.join(SCHEDULED_ENSEMBLES)}; the {ensemble} ensemble cannot follow one"
            )

    def to_dict(self) -> dict[str, Any]:
        return {"points": [list(point) for point in self.points], "mode": self.mode}

    def describe(self) -> str:
        shown = " -> ".join(f"{temperature:g} K @ {step}" for step, temperature in self.points)
        return f"{self.mode} schedule {shown}"
