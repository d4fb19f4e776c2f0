"""What ``fm.md`` is asked (:class:`MDRequest`), what a run is set to do (:class:`RunSettings`)
and what it did (:class:`MDResult`).

Plain data, no torch: the entry points, the runner's parent process and tools read them
without loading the engine.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ase

from fastmace.io.schedule import OutputSchedule
from fastmace.protocol import PressureSchedule, TemperatureSchedule

if TYPE_CHECKING:
    from fastmace.dynamics.engine import Engine
    from fastmace.dynamics.ensembles import Ensemble
    from fastmace.dynamics.guard import Guard
    from fastmace.dynamics.potential import Potential
    from fastmace.dynamics.replica_exchange import ReplicaExchange
    from fastmace.dynamics.thermal_start import ThermalStart
    from fastmace.models.load import LoadedModel
    from fastmace.planner import EngineConfig, EngineSettings, Plan
    from fastmace.planner.guard import GuardConfig


@dataclass(frozen=True)
class MDRequest:
    """``fm.md``'s keyword arguments as the caller gave them (all but the structure, the
    progress stream and the runner), with the same defaults.

    The stages of ``fm.md`` read its fields; a child process (``subprocess=True``) or a spread
    part (``gpus``) is handed :meth:`arguments`, the keyword arguments of the same call. The
    ensemble's settings (``temperature_K``, ``tau_fs``...) are in ``ensemble_settings``:
    which there are depends on the ensemble (fastmace.ensemble_catalog).
    """

    model: str | os.PathLike[str] = "demo-emt-cu"
    head: str | None = None
    ensemble: str = "nvt"
    steps: int = 1000
    timestep_fs: float | None = None
    output: str | os.PathLike[str] | None = None
    seed: int = 0
    repeat: Sequence[int] | int | None = None
    replicas: int = 1
    exchange_every: int = 0
    max_batch_atoms: int | None = None
    gpus: int | str | None = None
    initial_temperature_K: float | None = None
    trajectory_every: int = 100
    thermo_every: int = 100
    restart_every: int = 10_000
    trajectory_format: str = "auto"
    device: str | None = None
    dtype: str | None = None
    backend: str | None = None
    checkpoint: str | os.PathLike[str] | None = None
    sha256: str | None = None
    trusted: bool = False
    block_steps: int | None = None
    skin_A: float | None = None
    graphs: bool | None = None
    compile: bool | None = None
    matmul_precision: str | None = None
    radial_table: bool | None = None
    guard: GuardConfig | bool | dict[str, float] | None = None
    resume: bool = False
    check: str | None = None
    reproducible: bool = False
    dispersion: str | None = None
    dispersion_functional: str | None = None
    charge: Any = None  # fastmace.charges.PerSystemValue
    spin: Any = None
    config: EngineConfig | None = None
    temperature_schedule: Any = None
    pressure_schedule: Any = None
    ensemble_settings: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def keywords(cls) -> tuple[str, ...]:
        """fm.md's named keyword arguments (a run config's keys besides the ensemble's)."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.name != "ensemble_settings")

    def arguments(self) -> dict[str, Any]:
        """The request as fm.md's keyword arguments, the ensemble's settings among them."""
        given = {name: getattr(self, name) for name in self.keywords()}
        return {**given, **self.ensemble_settings}

    @classmethod
    def from_arguments(cls, arguments: Mapping[str, Any]) -> MDRequest:
        """The request of fm.md's keyword ``arguments``: those it names, and the rest as the
        ensemble's settings."""
        named = set(cls.keywords())
        return cls(
            **{name: value for name, value in arguments.items() if name in named},
            ensemble_settings={k: v for k, v in arguments.items() if k not in named},
        )


@dataclass(frozen=True)
class RunSettings:
    """What to run: the ensemble, length, timestep, seed and output (the engine settings
    come from the plan: :class:`fastmace.planner.EngineSettings`)."""

    ensemble: Ensemble
    steps: int
    timestep_fs: float = 1.0
    seed: int = 0
    schedule: OutputSchedule = field(default_factory=OutputSchedule)
    initial_temperature_K: float | None = None
    """Draw Maxwell-Boltzmann velocities at this temperature (None: keep the structure's)."""
    start_at_equipartition: bool = False
    """The velocities are FastMACE's default draw (the structure had none and no initial
    temperature was asked for): a system whose first forces show it at rest at an energy
    minimum starts at twice ``initial_temperature_K``, which equipartition halves
    (:mod:`fastmace.dynamics.thermal_start`)."""
    trajectory_format: str = "auto"
    temperature_schedule: TemperatureSchedule | None = None
    """The thermostat's target over the run (anneal, quench); None: the ensemble's own."""
    pressure_schedule: PressureSchedule | None = None
    """The barostat's target over the run (NPT); None: the ensemble's own."""
    dispersion: str | None = None
    """An extra dispersion term: "d3bj" (D3 with Becke-Johnson damping), "d3bj-atm" (with its
    three-body term) or None."""
    dispersion_functional: str | None = None
    """Its parameter set ("pbe", ...); None: the one the label table gives the model's head."""
    exchange_every: int = 0
    """Replica exchange: swap temperatures between neighbouring rungs every this many steps
    (0: never); the systems' ascending ``temperature_K`` are the ladder."""
    charge: tuple[float, ...] = ()
    """Each system's total charge in e, read by a long-range model (MACE-POLAR-1) only; empty:
    each structure's ``atoms.info["charge"]``, else neutral (:mod:`fastmace.charges`)."""
    spin: tuple[float, ...] = ()
    """Each system's spin multiplicity 2S + 1, as ``charge``; empty: ``atoms.info["spin"]``,
    else a singlet."""

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 0:
            raise ValueError(f"steps must be a non-negative whole number, got {self.steps!r}")
        for schedule in self.schedules():
            schedule.check_ensemble(self.ensemble.name)
        every = self.exchange_every
        if isinstance(every, bool) or not isinstance(every, int) or every < 0:
            raise ValueError(f"exchange_every must be a whole number >= 0, got {every!r}")
        if every and self.temperature_schedule is not None:
            raise ValueError(
                "replica exchange swaps the systems' temperatures: it cannot follow a "
                "temperature schedule too; give one or the other"
            )

    def schedules(self) -> list[TemperatureSchedule]:
        """The run's temperature and pressure schedules, those it has."""
        given = (self.temperature_schedule, self.pressure_schedule)
        return [schedule for schedule in given if schedule is not None]

    def block_steps_for(self, block_steps: int) -> int:
        """``block_steps`` (K), shortened so that every output interval is whole blocks and
        every change of a stepwise schedule falls on a block's start."""
        intervals = [v for v in dataclasses.asdict(self.schedule).values() if v > 0]
        if self.exchange_every > 0:
            intervals.append(self.exchange_every)
        for schedule in self.schedules():
            intervals += list(schedule.change_steps())
        return math.gcd(block_steps, *intervals)


@dataclass
class MDResult:
    """What a run did: final structures, last thermo rows, where the output is, how fast."""

    structures: list[ase.Atoms]
    steps: int
    thermo: list[dict[str, Any]]
    output: Path | None
    timings: dict[str, float]
    model: str
    ensemble: str
    report: str = ""
    """The final report: one screen (also saved as report.txt)."""
    mean_temperature_K: list[float] = field(default_factory=list)
    """Each system's mean temperature over the thermo rows of the run's second half (from
    step ``mean_from_step``), in system order; empty when the run has no temperature."""
    mean_from_step: int | None = None

    def summary(self) -> str:
        speed = self.timings.get("steps_per_s", float("nan"))
        ns_day = self.timings.get("ns_per_day", float("nan"))
        temperatures = [row["temperature_K"] for row in self.thermo if "temperature_K" in row]
        text = (
            f"{self.steps} steps of {self.ensemble} with {self.model}: {speed:.1f} steps/s, "
            f"{ns_day:.3f} ns/day"
        )
        if len(temperatures) == 1:
            text += f"; final T = {temperatures[0]:.1f} K"
        elif temperatures:  # a batch: one per system, in system order
            shown = ", ".join(f"{t:.1f}" for t in temperatures)
            text += f"; final T = {shown} K (per system)"
        if len(self.mean_temperature_K) == 1:
            text += f", mean T from step {self.mean_from_step} = {self.mean_temperature_K[0]:.1f} K"
        elif self.mean_temperature_K:
            shown = ", ".join(f"{t:.1f}" for t in self.mean_temperature_K)
            text += f", mean T from step {self.mean_from_step} = {shown} K"
        if self.output is not None:
            text += f"; output in {self.output}"
        return text


class SecondHalfMean:
    """Each system's mean temperature over the thermo rows from the middle of the run on
    (a resumed run: over the rows this process wrote, from its restart or the middle)."""

    def __init__(self, total_steps: int, start_step: int = 0) -> None:
        self.from_step = max(start_step, -(-total_steps // 2))
        self._sums: dict[int, float] = {}
        self._counts: dict[int, int] = {}

    def add(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            temperature = row.get("temperature_K")
            if row["step"] < self.from_step or temperature is None:
                continue
            system = int(row.get("system", 0))
            self._sums[system] = self._sums.get(system, 0.0) + float(temperature)
            self._counts[system] = self._counts.get(system, 0) + 1

    def means(self) -> list[float]:
        """In system order; empty when no row carried a temperature."""
        return [self._sums[s] / self._counts[s] for s in sorted(self._sums)]


@dataclass(frozen=True)
class RunRecord:
    """What metadata.json and the report read of a run (fastmace.provenance): what it was
    given and the parts it built. ``Simulation.record()`` fills it in; the engine, potential,
    guard and exchange are the live objects, read as they stand when a document is written."""

    model: LoadedModel
    structures: list[ase.Atoms]
    settings: RunSettings
    engine_settings: EngineSettings
    block_steps: int
    engine: Engine
    potential: Potential
    guard: Guard | None
    exchange: ReplicaExchange | None
    thermal_start: ThermalStart | None
    plan: Plan | None
    gate: Any  # fastmace.gate.GateResult, when the run was checked
    fallbacks: list[dict[str, Any]]
    runner: dict[str, Any]
    charges: list[float] | None
    spins: list[float] | None
    timings: dict[str, float]
    plot: Path | None
    has_output: bool
