"""Temperature and pressure schedules for MD: anneal, quench, heat, compress, decompress.

Plain data, no torch. A schedule is a list of (step, value) points, the first at step 0,
followed linearly ("linear") or held until the next point ("step"). The engine sets each
block's target (temperature, or pressure under NPT) on the device before the block runs (a
copy into the integrator's target, so captured blocks replay unchanged): a "step" schedule's
points fall on block starts (the block length divides them), and a "linear" one is followed
block by block, each block at the value of its middle step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from fastmace.ensemble_catalog import EnsembleError, descriptor, offering

SCHEDULE_MODES = ("linear", "step")


class ScheduleError(ValueError):
    """A schedule that cannot be run; the message says what to change."""


@dataclass(frozen=True)
class TemperatureSchedule:
    """Target temperatures (K) at steps, followed ``"linear"`` or held (``"step"``)."""

    points: tuple[tuple[int, float], ...]
    mode: str = "linear"

    # Class constants: what a schedule of this kind sets (a target of an ensemble
    # descriptor's `schedules`, fastmace.ensemble_catalog).
    quantity = "temperature"
    unit = "K"
    minimum = 0.0

    def __post_init__(self) -> None:
        if self.mode not in SCHEDULE_MODES:
            raise ScheduleError(
                f"{self.quantity} schedule mode {self.mode!r} is not allowed: use "
                f"{' or '.join(repr(mode) for mode in SCHEDULE_MODES)}"
            )
        try:
            points = tuple((step, value) for step, value in self.points)
        except (TypeError, ValueError):
            raise ScheduleError(
                f"a {self.quantity} schedule is a list of (step, {self.quantity}) pairs, got "
                f"{self.points!r:.80}"
            ) from None
        if not points or points[0][0] != 0:
            raise ScheduleError(
                f"a {self.quantity} schedule starts at step 0: give [(0, value), (step, value), "
                "...]"
            )
        for step, value in points:
            if isinstance(step, bool) or not isinstance(step, int) or step < 0:
                raise ScheduleError(f"schedule step {step!r} is not a whole number >= 0")
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not (math.isfinite(value) and value >= self.minimum)
            ):
                bound = "" if self.minimum == -math.inf else f" >= {self.minimum:g}"
                raise ScheduleError(
                    f"schedule {self.quantity} {value!r} at step {step} is not a {self.quantity} "
                    f"in {self.unit} (a finite number{bound})"
                )
        steps = [step for step, _ in points]
        if any(later <= earlier for earlier, later in pairwise(steps)):
            raise ScheduleError(f"schedule steps must increase, got {steps}")
        object.__setattr__(self, "points", tuple((s, float(t)) for s, t in points))

    @classmethod
    def coerce(cls, value: Any, mode: str | None = None) -> TemperatureSchedule:
        """A schedule from itself, from a list of (step, value) pairs (followed
        ``mode``, default linear) or from :meth:`to_dict`'s mapping."""
        if isinstance(value, TemperatureSchedule):
            if type(value) is not cls:
                raise ScheduleError(f"a {cls.quantity} schedule is needed, not {value!r:.80}")
            if mode is not None and mode != value.mode:
                raise ScheduleError(f"the schedule's mode is {value.mode!r}, not {mode!r}")
            return value
        if isinstance(value, dict) and set(value) <= {"points", "mode"} and "points" in value:
            return cls.coerce(value["points"], value.get("mode", mode))  # to_dict()'s form
        if isinstance(value, str) or not isinstance(value, Sequence):
            raise ScheduleError(
                f"{cls.quantity}_schedule takes a list of (step, {cls.quantity}) pairs, a "
                f'mapping {{"points": [...], "mode": "linear" or "step"}} or an fm.{cls.__name__}, '
                f"got {value!r:.80}"
            )
        return cls(tuple(tuple(point) for point in value), mode or "linear")

    def value_at(self, step: float) -> float:
        """The target at ``step`` (K or GPa): held after the last point."""
        points = self.points
        for (start, low), (end, high) in pairwise(points):
            if step < end:
                if self.mode == "step":
                    return low
                return low + (high - low) * (step - start) / (end - start)
        return points[-1][1]

    def block_value(self, first_step: int, steps: int) -> float:
        """The target held for the block of ``steps`` steps from ``first_step``."""
        if self.mode == "step":
            return self.value_at(first_step)
        return self.value_at(first_step + 0.5 * steps)

    def change_steps(self) -> tuple[int, ...]:
        """Steps where a "step" schedule changes: block starts must fall on them."""
        return tuple(step for step, _ in self.points[1:]) if self.mode == "step" else ()

    def largest(self) -> float:
        return max(value for _, value in self.points)

    def check_ensemble(self, ensemble: str) -> None:
        """ScheduleError unless ``ensemble`` (a name or alias) lets this target change."""
        try:
            follows = self.quantity in descriptor(ensemble).schedules
        except EnsembleError:
            follows = False
        if not follows:
            raise ScheduleError(
                f"a {self.quantity} schedule needs an ensemble whose target may change: "
                f"{', '.join(offering(self.quantity))}; the {ensemble} ensemble cannot follow one"
            )

    def to_dict(self) -> dict[str, Any]:
        return {"points": [list(point) for point in self.points], "mode": self.mode}

    def describe(self) -> str:
        shown = " -> ".join(f"{value:g} {self.unit} @ {step}" for step, value in self.points)
        return f"{self.mode} {self.quantity} schedule {shown}"


@dataclass(frozen=True)
class PressureSchedule(TemperatureSchedule):
    """Target pressures (GPa, NPT only) at steps, followed ``"linear"`` or held (``"step"``)."""

    quantity = "pressure"
    unit = "GPa"
    minimum = -math.inf
