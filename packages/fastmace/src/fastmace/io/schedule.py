"""When a run writes output: trajectory frames, thermo rows and restarts, every so many steps."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class OutputSchedule:
    """Output intervals in MD steps; 0 switches that output off.

    Step 0 counts as due, so a run records its starting point.
    """

    trajectory_every: int = 100
    thermo_every: int = 100
    restart_every: int = 10_000

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(
                    f"{name} must be a non-negative whole number of steps (0 = never), "
                    f"got {value!r}"
                )

    def trajectory_due(self, step: int) -> bool:
        return _due(self.trajectory_every, step)

    def thermo_due(self, step: int) -> bool:
        return _due(self.thermo_every, step)

    def restart_due(self, step: int) -> bool:
        return _due(self.restart_every, step)

    def expected_frames(self, n_steps: int) -> int:
        """Trajectory frames a run of ``n_steps`` from step 0 writes."""
        if n_steps < 0:
            raise ValueError(f"n_steps must not be negative, got {n_steps}")
        return 0 if self.trajectory_every == 0 else n_steps // self.trajectory_every + 1

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OutputSchedule:
        return cls(**data)


def _due(every: int, step: int) -> bool:
    return every > 0 and step % every == 0
