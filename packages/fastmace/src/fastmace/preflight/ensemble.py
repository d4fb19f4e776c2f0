"""Checks of an ensemble's settings and of what it needs from the structures, without torch.

The integrators check the same bounds when they start (:mod:`fastmace.dynamics.integrators`),
but only after the model is loaded and the run directory exists; :func:`check_settings` runs
before either, so that a bad setting leaves nothing behind.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ase

from fastmace.ensemble_catalog import Setting, bind_ensemble, descriptor, exchanging
from fastmace.preflight.values import RequestError, number, one_of, per_system_numbers, whole
from fastmace.vocabulary import MAX_TIMESTEP_FS


@dataclass(frozen=True)
class Bound:
    """The values a setting takes: finite, and above ``lower`` (or the timestep) if given."""

    unit: str
    lower: float | None = None
    strict: bool = False
    """The bound itself is excluded (``> lower`` rather than ``>= lower``)."""
    at_least_timestep: bool = False

    def check(self, name: str, value: Any, timestep_fs: float) -> list[float]:
        values = per_system_numbers(name, value, self.unit)
        lower = timestep_fs if self.at_least_timestep else self.lower
        if lower is None:
            return values
        for item in values:
            if item < lower or (self.strict and item == lower):
                relation = ">" if self.strict else ">="
                what = " (the timestep)" if self.at_least_timestep else ""
                raise RequestError(
                    f"{name}={item:g} {self.unit} is not allowed: it must be {relation} "
                    f"{lower:g} {self.unit}{what}",
                    name,
                )
        return values

    @classmethod
    def of(cls, setting: Setting) -> Bound:
        """The bound an ensemble's descriptor gives a numeric setting."""
        return cls(setting.unit, setting.lower, setting.strict, setting.at_least_timestep)


# fm.md's own temperature, for the velocities it draws (not an ensemble's setting).
INITIAL_TEMPERATURE = Bound("K", 0.0)


def check_timestep(timestep_fs: Any) -> float:
    """The timestep in fs, in (0, MAX_TIMESTEP_FS]."""
    value = number("timestep_fs", timestep_fs, "fs")
    if not 0.0 < value <= MAX_TIMESTEP_FS:
        raise RequestError(
            f"timestep_fs={timestep_fs!r} is not allowed: it must be in (0, {MAX_TIMESTEP_FS:g}] "
            "fs. Give the timestep in femtoseconds (typical: 0.5 to 2 fs), not in ASE time units",
            "timestep_fs",
        )
    return value


def check_settings(name: str, settings: Mapping[str, Any], timestep_fs: float) -> str:
    """The canonical ensemble of ``name``, once its settings are known and in bounds."""
    canonical, given = bind_ensemble(name, dict(settings))
    known = descriptor(canonical)
    for name_given, value in given.items():
        setting = known.setting(name_given)
        if setting.whole:
            whole(setting.name, value, minimum=int(setting.lower or 0))
        elif setting.choices:
            one_of(setting.name, value, setting.choices)
        else:
            Bound.of(setting).check(setting.name, value, timestep_fs)
    for setting in known.settings:  # a required setting given once, as itself or instead
        if setting.instead_of is None:
            continue
        pair = (setting.instead_of, setting.name)
        if (pair[0] in given) == (pair[1] in given):
            raise RequestError(
                f"the {canonical} ensemble needs exactly one of {pair[0]} or {pair[1]} (got "
                f"{pair[0]}={given.get(pair[0])!r}, {pair[1]}={given.get(pair[1])!r})",
                pair[0],
            )
    return canonical


def check_fits_structures(
    canonical: str,
    settings: Mapping[str, Any],
    structures: Sequence[ase.Atoms],
    initial_temperature_K: Any,
    resume: bool,
) -> None:
    """Per-system values fit the batch, and the ensemble can run these structures."""
    n_systems = len(structures)
    counted = {**settings, "initial_temperature_K": initial_temperature_K}
    known = descriptor(canonical)
    for setting, value in counted.items():
        described = known.setting(setting) if setting in known.setting_names else None
        if value is None or (described is not None and not described.per_system):
            continue
        count = len(per_system_numbers(setting, value, ""))
        if count not in (1, n_systems):
            raise RequestError(
                f"{setting} has {count} values, but the batch has {n_systems} systems: give one "
                "value, or one per system",
                setting,
            )
    if "temperature_K" in settings:
        small = [i for i, atoms in enumerate(structures) if len(atoms) < 2]
        if small:
            raise RequestError(
                f"the {canonical} thermostat needs at least 2 atoms per system (the centre-of-"
                f"mass momentum is removed, leaving 3N-3 degrees of freedom); systems {small} "
                "have fewer: use nve for a single atom"
            )
    if known.barostat:
        flat = [i for i, atoms in enumerate(structures) if not atoms.pbc.all()]
        if flat:
            raise RequestError(
                f"{canonical} needs every system periodic in x, y and z (a volume to rescale); "
                f"systems {flat} are not. Use an NVT ensemble for molecules, slabs and wires"
            )
    if known.rescaling_only and not resume:
        _check_can_heat(canonical, settings, structures, initial_temperature_K)


def _check_can_heat(
    canonical: str,
    settings: Mapping[str, Any],
    structures: Sequence[ase.Atoms],
    initial_temperature_K: Any,
) -> None:
    """A rescaling thermostat keeps a system at rest at rest: refuse that start."""
    moving = [bool(abs(atoms.get_velocities()).max() > 0) for atoms in structures]
    if all(moving) or initial_temperature_K is None:
        return  # the default draws velocities at temperature_K
    initial = per_system_numbers("initial_temperature_K", initial_temperature_K, "K")
    target = per_system_numbers("temperature_K", settings["temperature_K"], "K")
    for index, is_moving in enumerate(moving):
        start = initial[index if len(initial) > 1 else 0]
        goal = target[index if len(target) > 1 else 0]
        if not is_moving and start == 0.0 and goal > 0.0:
            raise RequestError(
                f"{canonical} rescales velocities, and cannot heat system {index} from rest "
                f"(initial_temperature_K=0, temperature_K={goal:g}): give initial_temperature_K "
                "> 0, or use nvt (Langevin) to heat from rest",
                "initial_temperature_K",
            )


def check_exchange(
    canonical: str,
    settings: Mapping[str, Any],
    structures: Sequence[ase.Atoms],
    exchange_every: Any,
) -> None:
    """Replica exchange's request, before anything is loaded: a whole interval, a fixed-cell
    thermostat, copies of one structure, and one ascending temperature per copy."""
    if exchange_every is None:
        return
    every = whole("exchange_every", exchange_every, minimum=0)
    if every == 0:
        return
    known, allowed = descriptor(canonical), " or ".join(exchanging())
    if known.barostat:
        raise RequestError(
            f"replica exchange is not offered under {canonical}: a swap between walkers at "
            "different volumes needs a P·ΔV term in its acceptance, which FastMACE does not "
            "have, so the ladder would sample the wrong ensemble. Run the ladder at a fixed "
            f"cell ({allowed}), at the volume an NPT run gave",
            "exchange_every",
        )
    if not known.exchanges_temperatures:
        raise RequestError(
            f"replica exchange swaps thermostat temperatures; the {canonical} ensemble has no "
            f"thermostat: use {allowed}",
            "exchange_every",
        )
    numbers = {tuple(int(z) for z in atoms.numbers) for atoms in structures}
    if len(numbers) != 1:
        raise RequestError(
            "replica exchange swaps temperatures between copies of one structure: give one "
            "structure with replicas=N and temperature_K=[one per replica]",
            "exchange_every",
        )
    ladder = per_system_numbers("temperature_K", settings.get("temperature_K", []), "K")
    if len(structures) < 2 or len(ladder) != len(structures):
        raise RequestError(
            f"replica exchange needs one temperature per replica ({len(structures)} replicas, "
            f"{len(ladder)} temperatures): give replicas=N and temperature_K=[N values, lowest "
            "first], for instance fm.geometric_ladder(300, 600, N)",
            "temperature_K",
        )
    if any(high <= low for low, high in itertools.pairwise(ladder)):
        raise RequestError(
            f"replica exchange needs the temperatures strictly ascending, lowest first; got "
            f"{ladder}",
            "temperature_K",
        )
