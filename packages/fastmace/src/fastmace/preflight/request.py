"""Every check of a run request that can be made before anything is created or loaded.

``fm.md`` (and so ``fastmace md`` and ``fastmace run``) calls :func:`check_request` first: the
settings' kinds and values, the environment variables, the model's name or file, the
structures (read once, here), what the ensemble needs of them, and the run directory. Only
then is a model loaded or a directory created, so a refused request leaves nothing behind and
fails in about a second, not after a model load. What needs the model (its elements) or the
machine (the plan's backend and device) is checked after, still before the run directory.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TextIO

import ase

from fastmace.charges import ChargeSpinError, check_given, given_per_system
from fastmace.dynamics.checks import StructureError, check_structures
from fastmace.ensemble_catalog import (
    DEFAULT_ENSEMBLE,
    EnsembleError,
    canonical_ensemble,
    setting_names,
)
from fastmace.io.progress import setup_note
from fastmace.planner.guard import GuardConfig
from fastmace.preflight.ensemble import (
    INITIAL_TEMPERATURE,
    check_exchange,
    check_fits_structures,
    check_settings,
    check_timestep,
)
from fastmace.preflight.model import check_model
from fastmace.preflight.output import check_output_settings, check_run_directory
from fastmace.preflight.values import RequestError, switch, whole
from fastmace.protocol import PressureSchedule, ScheduleError, TemperatureSchedule
from fastmace.runtime import environment
from fastmace.runtime.cache import cache_root
from fastmace.structures import Structure, read_structures
from fastmace.vocabulary import DEFAULT_TIMESTEP_FS, SETUP_PROGRESS_ATOMS


@dataclass(frozen=True)
class CheckedRequest:
    """What the checks read on the way: the structures, before and after ``repeat``."""

    units: list[ase.Atoms]
    """As read (the runner's child repeats them itself)."""
    structures: list[ase.Atoms]
    """With ``repeat`` applied: what runs."""
    ensemble: str
    """The canonical ensemble name."""
    charge: tuple[float, ...] = ()
    """``charge=`` as one value per system (empty when not given: each structure's own)."""
    spin: tuple[float, ...] = ()
    """``spin=`` as one value per system (empty when not given)."""


def check_arguments(arguments: Mapping[str, Any], look: bool = True) -> str:
    """The kinds and values of fm.md's keyword ``arguments`` (those given), on their own.

    Returns the canonical ensemble. ``look=False`` leaves out what looks at files (the
    model's); a run config is checked so before its paths are resolved.
    """
    check_model(
        arguments.get("model", "demo-emt-cu"),
        head=arguments.get("head"),
        checkpoint=arguments.get("checkpoint"),
        sha256=arguments.get("sha256"),
        trusted=arguments.get("trusted", False),
        look=look,
    )
    if "steps" in arguments:
        whole("steps", arguments["steps"], minimum=0)
    if "seed" in arguments:
        # A 64-bit integer: torch's generators take no more (system s of a batch draws from
        # seed + s, which fits for any number of systems).
        whole("seed", arguments["seed"], minimum=-(2**63), maximum=2**63 - 1)
    # No timestep given: 1 fs for a new run, the saved one on resume (checked when it was set).
    given = arguments.get("timestep_fs")
    timestep_fs = DEFAULT_TIMESTEP_FS if given is None else check_timestep(given)
    if arguments.get("initial_temperature_K") is not None:
        initial = arguments["initial_temperature_K"]
        INITIAL_TEMPERATURE.check("initial_temperature_K", initial, timestep_fs)
    for name in ("reproducible", "trusted"):
        if name in arguments:
            switch(name, arguments[name])
    check_output_settings(dict(arguments))
    if arguments.get("guard") is not None:
        try:
            GuardConfig.coerce(arguments["guard"])
        except (TypeError, ValueError) as error:  # as a request's error: names the config file
            raise RequestError(str(error), "guard") from None
    try:
        check_given(arguments.get("charge"), arguments.get("spin"))
    except ChargeSpinError as error:
        raise RequestError(str(error), error.setting) from None
    settings = {name: arguments.get(name) for name in setting_names()}
    name = arguments.get("ensemble", DEFAULT_ENSEMBLE)
    for kind, setting in (
        (TemperatureSchedule, "temperature_K"),
        (PressureSchedule, "pressure_GPa"),
    ):
        value = arguments.get(f"{kind.quantity}_schedule")
        if value is not None:
            schedule = check_schedule(kind, value, name, settings, setting)
            settings[setting] = schedule.points[0][1]  # the run starts where its schedule does
    return check_settings(name, settings, timestep_fs)


def check_schedule(
    kind: type[TemperatureSchedule], value: Any, ensemble: Any, settings: Mapping[str, Any],
    setting: str,
) -> TemperatureSchedule:  # fmt: skip
    """A well-formed schedule that ``ensemble`` can follow, starting at the run's ``setting``
    (temperature_K, pressure_GPa) if that is given; an unknown ensemble is left to its check."""
    name = f"{kind.quantity}_schedule"
    try:
        schedule = kind.coerce(value)
        try:
            canonical = canonical_ensemble(ensemble)
        except (EnsembleError, TypeError):
            canonical = None
        if canonical is not None:
            schedule.check_ensemble(canonical)
    except ScheduleError as error:
        raise RequestError(str(error), name) from None
    start, given = schedule.points[0][1], settings.get(setting)
    if kind is PressureSchedule and settings.get("pressure_bar") is not None:
        raise RequestError(
            "pressure_bar and a pressure schedule (in GPa): leave pressure_bar out", name
        )
    if given is not None and given != start:
        raise RequestError(
            f"{setting}={given!r} and a {kind.quantity} schedule that starts at {start:g} "
            f"{kind.unit}: give one of them, or make the schedule start at {setting}",
            name,
        )
    return schedule


def check_environment(extra: Mapping[str, str] | None = None) -> None:
    """Every variable FastMACE reads (this process's, with ``extra`` for its children) is
    usable, and so is the cache root."""
    merged = {**os.environ, **(extra or {})}
    bad = environment.problems(merged)
    if bad:
        raise bad[0]
    cache_root(merged)


# More atoms than any one run can hold: a GPU holds about 215,000 atoms of MP-0 medium (0.65
# MiB each, measured at 157,464 atoms on an H200, docs/validation/performance.md), so ten
# million is far past every device, and a typing slip (--repeat 1000) is refused in a moment
# instead of failing while hundreds of GiB of host memory are allocated.
MAX_RUN_ATOMS = 10_000_000


def check_repeat(units: list[ase.Atoms], repeat: Any) -> None:
    """Refuse a ``repeat`` that is not three positive integers, or that makes more than
    MAX_RUN_ATOMS atoms, before any supercell is built."""
    if repeat is None:
        return
    counts = (repeat,) * 3 if _whole_number(repeat) else repeat
    try:
        counts = tuple(int(n) if _whole_number(n) else n for n in counts)
        valid = len(counts) == 3 and all(_whole_number(n) and n >= 1 for n in counts)
    except TypeError:
        valid = False
    if not valid:
        raise RequestError(f"repeat must be three positive integers, got {repeat!r}", "repeat")
    copies = _repeat_copies(repeat)
    atoms = sum(len(unit) for unit in units) * copies
    if atoms > MAX_RUN_ATOMS:
        shown = "x".join(str(n) for n in counts)
        raise RequestError(
            f"repeat {shown} makes {atoms:,} atoms ({copies:,} copies); one run holds at most "
            f"{MAX_RUN_ATOMS:,} (a GPU holds about 215,000 atoms of MP-0 medium): choose a "
            "smaller repeat",
            "repeat",
        )


def check_replicas(units: list[ase.Atoms], repeat: Any, replicas: Any) -> int:
    """``replicas`` as a positive integer whose copies stay within MAX_RUN_ATOMS atoms."""
    if not _whole_number(replicas) or replicas < 1:
        raise RequestError(f"replicas must be a positive integer, got {replicas!r}", "replicas")
    atoms = sum(len(unit) for unit in units) * _repeat_copies(repeat) * replicas
    if atoms > MAX_RUN_ATOMS:
        raise RequestError(
            f"{replicas:,} replicas make {atoms:,} atoms; one run holds at most "
            f"{MAX_RUN_ATOMS:,}: choose fewer replicas",
            "replicas",
        )
    return int(replicas)


def _repeat_copies(repeat: Any) -> int:
    """Copies of the cell a checked ``repeat`` makes (1 without one)."""
    if repeat is None:
        return 1
    counts = (repeat,) * 3 if _whole_number(repeat) else tuple(int(n) for n in repeat)
    return counts[0] * counts[1] * counts[2]


def replicated(structures: list[ase.Atoms], replicas: int) -> list[ase.Atoms]:
    """Each structure followed by ``replicas - 1`` copies of itself."""
    return [atoms if copy == 0 else atoms.copy() for atoms in structures
            for copy in range(replicas)]  # fmt: skip


def _whole_number(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_request(
    structure: Structure,
    arguments: Mapping[str, Any],
    extra_environment: Mapping[str, str] | None = None,
    progress: TextIO | None = None,
) -> CheckedRequest:
    """Check a run request of fm.md (its ``structure`` and keyword ``arguments``) before
    anything is loaded or created; returns the structures read. A request of
    SETUP_PROGRESS_ATOMS atoms or more says so to ``progress`` before its structures are
    checked (their close-pair search takes seconds per hundred thousand atoms)."""
    ensemble = check_arguments(arguments)
    check_environment(extra_environment)
    units = read_structures(structure)
    check_repeat(units, arguments.get("repeat"))
    replicas = check_replicas(units, arguments.get("repeat"), arguments.get("replicas", 1))
    structures = replicated(read_structures(units, arguments.get("repeat")), replicas)
    atoms = sum(len(one) for one in structures)
    if atoms >= SETUP_PROGRESS_ATOMS:
        systems = f"{len(structures):,} systems" if len(structures) > 1 else "1 system"
        setup_note(progress, f"{atoms:,} atoms in {systems}; checking the structures")
    try:
        check_structures(structures, model_species=None)
    except StructureError as error:
        if not isinstance(structure, str | os.PathLike):
            raise
        # The message says "the structure"; a user of the command line needs the file too.
        raise StructureError(f"structure file {structure}: {error}") from None
    resume = bool(arguments.get("resume", False))
    settings = {name: arguments.get(name) for name in setting_names()}
    settings = {name: value for name, value in settings.items() if value is not None}
    initial = arguments.get("initial_temperature_K")
    check_fits_structures(ensemble, settings, structures, initial, resume)
    check_exchange(ensemble, settings, structures, arguments.get("exchange_every"))
    check_run_directory(arguments.get("output"), resume, arguments.get("steps"))
    charge, spin = check_charge_and_spin(arguments, len(structures))
    return CheckedRequest(units, structures, ensemble, charge, spin)


def check_charge_and_spin(
    arguments: Mapping[str, Any], n_systems: int
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``charge=`` and ``spin=`` as one value per system each (empty where not given)."""
    try:
        return given_per_system(n_systems, arguments.get("charge"), arguments.get("spin"))
    except ChargeSpinError as error:
        raise RequestError(str(error), error.setting) from None
