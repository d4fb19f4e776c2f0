"""The thermo log: a CSV file with one row per system per output step.

Columns, in this order (units in the names): ``step``, ``system`` (only when the batch has
several systems), ``time_fs``, ``potential_energy_eV``, ``kinetic_energy_eV``,
``total_energy_eV``, ``temperature_K``, ``pressure_GPa``, ``volume_A3``, ``ns_per_day``, then
any further columns the first rows bring (a thermostat's ``conserved_energy_eV``, say), in the
order they first appear. A value a row does not give is left empty. Floats are written with
Python's shortest exact repr, so the log reads back to the same doubles.
"""

from __future__ import annotations

import csv
import io
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from numbers import Integral, Real
from pathlib import Path

STANDARD_COLUMNS = (
    "step",
    "system",
    "time_fs",
    "potential_energy_eV",
    "kinetic_energy_eV",
    "total_energy_eV",
    "temperature_K",
    "pressure_GPa",
    "volume_A3",
    "ns_per_day",
)
_SECONDS_PER_DAY = 86_400.0


class ThermoLog:
    """Appends rows to a thermo CSV file; each :meth:`write` is flushed to the OS.

    ``ns_per_day`` is filled in when a row lacks it: simulated time over wall time since the
    previous :meth:`write` (empty on the first write of a session).
    """

    def __init__(
        self, path: Path, n_systems: int = 1, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = Path(path)
        self.n_systems = n_systems
        self._clock = clock
        self._columns = _read_header(self.path)
        self._stream = open(self.path, "a", encoding="utf-8", newline="")  # noqa: SIM115
        self._last_step = -1
        self._previous: tuple[float, float] | None = None  # (wall clock, time_fs)

    @property
    def columns(self) -> tuple[str, ...] | None:
        """The header, once the first rows have fixed it."""
        return self._columns

    def start_after(self, step: int) -> None:
        """Refuse rows at or before ``step`` (they are already in the log)."""
        self._last_step = step

    def write(self, rows: Iterable[Mapping[str, float | int | None]]) -> None:
        """Append ``rows`` (steps increasing, and after every step already written)."""
        rows = [dict(row) for row in rows]
        if not rows:
            return
        steps = [self._check_row(row) for row in rows]
        if steps[0] <= self._last_step or steps != sorted(steps):
            raise ValueError(
                f"thermo rows must come in step order after step {self._last_step}; "
                f"got steps {steps[0]} to {steps[-1]}"
            )
        columns = self._columns or self._header_for(rows)
        unknown = sorted({key for row in rows for key in row} - set(columns))
        if unknown:
            raise ValueError(
                f"thermo columns {unknown} are not in this log's header {list(columns)}; "
                "every column must be present from the first rows on"
            )
        self._fill_ns_per_day(rows)
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        if self._columns is None:
            writer.writerow(columns)
            self._columns = columns
        for row in rows:
            writer.writerow([_format(row.get(column)) for column in columns])
        self._stream.write(buffer.getvalue())
        self._stream.flush()
        self._last_step = steps[-1]

    def sync(self) -> None:
        self._stream.flush()
        os.fsync(self._stream.fileno())

    def close(self) -> None:
        self._stream.close()

    def _check_row(self, row: dict) -> int:
        step = row.get("step")
        if isinstance(step, bool) or not isinstance(step, Integral) or step < 0:
            raise ValueError(f"a thermo row needs a non-negative integer 'step', got {row!r}")
        system = row.pop("system", 0)
        if isinstance(system, bool) or not isinstance(system, Integral):
            raise ValueError(f"'system' must be an integer, got {system!r}")
        if not 0 <= system < self.n_systems:
            raise ValueError(f"system {system} is outside the batch of {self.n_systems}")
        if self.n_systems > 1:  # one system: the column would only ever say 0
            row["system"] = int(system)
        for key, value in row.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, Real)):
                raise TypeError(f"thermo value {key}={value!r} is not a number")
        return int(step)

    def _fill_ns_per_day(self, rows: list[dict]) -> None:
        now = self._clock()
        times = [row["time_fs"] for row in rows if row.get("time_fs") is not None]
        latest = max(times) if times else None
        if self._previous is not None and latest is not None:
            wall, simulated = self._previous
            if now > wall and latest > simulated:
                rate = (latest - simulated) * 1e-6 / ((now - wall) / _SECONDS_PER_DAY)
                for row in rows:
                    row.setdefault("ns_per_day", rate)
        if latest is not None:
            self._previous = (now, latest)

    def _header_for(self, rows: list[dict]) -> tuple[str, ...]:
        standard = [c for c in STANDARD_COLUMNS if c != "system" or self.n_systems > 1]
        extra: list[str] = []
        for row in rows:
            extra += [key for key in row if key not in STANDARD_COLUMNS and key not in extra]
        return (*standard, *extra)


def _format(value: float | int | None) -> str:
    if value is None:
        return ""
    if isinstance(value, Integral):
        return str(int(value))
    number = float(value)
    return repr(number) if math.isfinite(number) else str(number)


def _read_header(path: Path) -> tuple[str, ...] | None:
    """The header of an existing log, or None for a new or empty one."""
    try:
        with open(path, encoding="utf-8", newline="") as stream:
            header = next(csv.reader(stream), None)
    except FileNotFoundError:
        return None
    return tuple(header) if header else None


def truncate_thermo(path: Path, last_step: int) -> int:
    """Drop rows after ``last_step`` and a half-written last row; returns the rows kept."""
    path = Path(path)
    kept = 0
    cut = None
    with open(path, "rb") as stream:
        header = stream.readline()
        if not header.endswith(b"\n"):
            cut = 0  # not even the header was finished: start the log again
        while cut is None:
            start = stream.tell()
            line = stream.readline()
            if not line:
                break
            if not line.endswith(b"\n"):
                cut = start  # a row cut short by a crash
                break
            step_field = line.split(b",", 1)[0].strip()
            if not step_field.isdigit():
                raise ValueError(
                    f"{path} is damaged at byte {start}: expected a step, found {line[:40]!r}"
                )
            if int(step_field) > last_step:
                cut = start
            else:
                kept += 1
    if cut is not None:
        os.truncate(path, cut)
    return kept
