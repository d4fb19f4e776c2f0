"""Every ensemble described once: its names, its settings and what the rest of FastMACE may
do with it. No torch.

Preflight's bounds, the schedules' ensembles, replica exchange's refusals, the guard's
targets, ``fm.md``'s keyword arguments, the CLI's flags, a run config's keys and per-system
keys, and the table in docs/md.md are all read from these descriptors, so adding an ensemble
is its integrator module plus one :class:`EnsembleDescriptor` in :data:`BUILT_IN` (or
:func:`register_ensemble` for one defined elsewhere, in this process only).
docs/architecture.md walks through it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

CELL_MODES = ("isotropic", "per_axis", "full")
"""How the NPT barostat may deform the cell (``cell_mode``)."""
DEFAULT_ENSEMBLE = "nvt"
TARGET_TENSORS = {"temperature": "kT", "pressure": "pressure"}
"""The state tensor that holds each target, (S,), in eV and eV/Å³: schedules fill it,
replica exchange swaps the temperature's, the guard reads them."""


class EnsembleError(ValueError):
    """An unknown ensemble, a setting it does not take, or one it needs and lacks."""


@dataclass(frozen=True)
class Setting:
    """One setting an ensemble takes: a keyword argument of ``fm.md`` and the integrator's
    init, a key of a run config, and (with ``flag``) an option of ``fastmace md``."""

    name: str
    help: str
    """What it is, for the CLI's help and the docs (``target temperature in K``)."""
    unit: str = ""
    default: float | int | str | None = None
    lower: float | None = None
    strict: bool = False
    """``lower`` itself is excluded (``> lower`` rather than ``>= lower``)."""
    at_least_timestep: bool = False
    """The value may not be below the timestep (a time constant the integrator resolves)."""
    choices: tuple[str, ...] = ()
    """A word out of these (``cell_mode``) instead of a number."""
    whole: bool = False
    """A whole number, at least ``lower`` (``chain_length``)."""
    per_system: bool = True
    """A number that may be given once or once per system (a [[systems]] table's key)."""
    required: bool = False
    instead_of: str | None = None
    """This setting may be given in place of that one (``pressure_bar`` for ``pressure_GPa``):
    exactly one of the two when that one is required."""
    flag: str | None = None
    """The option of ``fastmace md`` (None: set in a run config only)."""

    def __post_init__(self) -> None:
        if self.choices and (self.whole or self.per_system):
            raise ValueError(f"setting {self.name}: a choice of words is neither whole nor numeric")

    @property
    def numeric(self) -> bool:
        """A real number with a unit (checked against the bounds), as most settings are."""
        return not (self.choices or self.whole)

    def stricter(self, **changes: Any) -> Setting:
        """This setting with tighter bounds for one ensemble."""
        return dataclasses.replace(self, **changes)


# The settings of the built-in ensembles, with the bounds their integrators' inits check
# (dynamics/integrators/validation.py); an ensemble that asks more uses `stricter`.
TEMPERATURE = Setting(
    "temperature_K", "target temperature in K", "K", lower=0.0,
    required=True, flag="--temperature",
)  # fmt: skip
FRICTION = Setting(
    "friction_per_ps", "Langevin friction in 1/ps", "1/ps", 1.0, lower=0.0, flag="--friction"
)
TAU = Setting(
    "tau_fs", "thermostat time constant in fs", "fs", 100.0, lower=0.0, strict=True, flag="--tau"
)
CHAIN_LENGTH = Setting(
    "chain_length", "thermostats in the Nose-Hoover chain", default=3, lower=1, whole=True,
    per_system=False, flag="--chain-length",
)  # fmt: skip
PRESSURE = Setting(
    "pressure_GPa", "target pressure in GPa", "GPa", required=True, flag="--pressure"
)
PRESSURE_BAR = Setting(
    "pressure_bar", "target pressure in bar", "bar", instead_of="pressure_GPa",
    flag="--pressure-bar",
)  # fmt: skip
THERMOSTAT_TAU = Setting(
    "thermostat_tau_fs", "NPT thermostat time constant in fs", "fs", 100.0, lower=0.0,
    strict=True, flag="--thermostat-tau",
)  # fmt: skip
BAROSTAT_TAU = Setting(
    "barostat_tau_fs", "barostat time constant in fs, at least the timestep", "fs", 1000.0,
    at_least_timestep=True, flag="--barostat-tau",
)  # fmt: skip
COMPRESSIBILITY = Setting(
    "compressibility_per_GPa", "the barostat's compressibility in 1/GPa", "1/GPa", 0.01,
    lower=0.0, strict=True, flag="--compressibility",
)  # fmt: skip
CELL_MODE = Setting(
    "cell_mode", f"how the cell may deform: {', '.join(CELL_MODES)}", default="isotropic",
    choices=CELL_MODES, per_system=False, flag="--cell-mode",
)  # fmt: skip


@dataclass(frozen=True)
class EnsembleDescriptor:
    """An ensemble: its names, its integrator and settings, and what it offers the engine."""

    name: str
    integrator: str
    """What runs it, for the docs table (``Langevin, BAOAB splitting``)."""
    init: str | Callable[..., Any]
    """``"module:function"`` (imported when a run starts), or the function itself: it takes
    ``state``, ``compute``, ``timestep_fs``, the settings by name and ``rng`` if stochastic."""
    step: str | Callable[..., Any]
    settings: tuple[Setting, ...] = ()
    aliases: tuple[str, ...] = ()
    stochastic: bool = False
    """Draws random numbers (its init takes ``rng``; a restart keeps its streams)."""
    targets: tuple[str, ...] = ()
    """The targets it holds (keys of TARGET_TENSORS): "temperature" makes a thermostat whose
    state has ``kT``, "pressure" a barostat whose state has ``pressure`` and which reads the
    stress every step."""
    schedules: tuple[str, ...] = ()
    """The targets that may change during a run (a temperature or pressure schedule)."""
    rescaling_only: bool = False
    """Its thermostat only rescales velocities, so it cannot heat a system at rest."""

    def __post_init__(self) -> None:
        names = [setting.name for setting in self.settings]
        if len(set(names)) != len(names):
            raise ValueError(f"ensemble {self.name}: a setting is described twice ({names})")
        if not set(self.targets) <= set(TARGET_TENSORS):
            raise ValueError(f"ensemble {self.name}: targets are among {tuple(TARGET_TENSORS)}")
        if not set(self.schedules) <= set(self.targets):
            raise ValueError(f"ensemble {self.name}: only a target it holds can follow a schedule")
        if self.thermostat != ("temperature_K" in names):
            raise ValueError(f"ensemble {self.name}: a thermostat takes temperature_K, and only it")
        if self.barostat != ("pressure_GPa" in names):
            raise ValueError(f"ensemble {self.name}: a barostat takes pressure_GPa, and only it")

    @property
    def thermostat(self) -> bool:
        return "temperature" in self.targets

    @property
    def barostat(self) -> bool:
        return "pressure" in self.targets

    @property
    def exchanges_temperatures(self) -> bool:
        """Replica exchange may swap its targets: a thermostat at a fixed cell (a swap between
        volumes would need a P·ΔV term in its acceptance, which FastMACE does not have)."""
        return self.thermostat and not self.barostat

    @property
    def setting_names(self) -> tuple[str, ...]:
        return tuple(setting.name for setting in self.settings)

    def setting(self, name: str) -> Setting:
        return next(setting for setting in self.settings if setting.name == name)

    def defaults(self) -> dict[str, Any]:
        """The settings that have a default, at it."""
        return {s.name: s.default for s in self.settings if s.default is not None}


BUILT_IN: tuple[EnsembleDescriptor, ...] = (
    EnsembleDescriptor(
        "nve", "velocity Verlet",
        "fastmace.dynamics.integrators.nve:nve_init", "fastmace.dynamics.integrators.nve:nve_step",
    ),
    EnsembleDescriptor(
        "nvt-langevin", "Langevin, BAOAB splitting",
        "fastmace.dynamics.integrators.langevin:langevin_init",
        "fastmace.dynamics.integrators.langevin:langevin_step",
        (TEMPERATURE, FRICTION), aliases=("nvt", "langevin"), stochastic=True,
        targets=("temperature",), schedules=("temperature",),
    ),
    EnsembleDescriptor(
        "nvt-csvr", "stochastic velocity rescaling (Bussi-Donadio-Parrinello)",
        "fastmace.dynamics.integrators.csvr:csvr_init",
        "fastmace.dynamics.integrators.csvr:csvr_step",
        (TEMPERATURE, TAU), aliases=("csvr", "bussi"), stochastic=True,
        targets=("temperature",), schedules=("temperature",), rescaling_only=True,
    ),
    # The chain's masses grow with T and tau²: a positive temperature and a time constant of
    # at least a step. They are set by the starting temperature, so its conserved energy
    # would not hold under a changing target: no schedule.
    EnsembleDescriptor(
        "nvt-nose-hoover", "Nose-Hoover chain (Martyna-Tuckerman-Tobias-Klein)",
        "fastmace.dynamics.integrators.nose_hoover:nose_hoover_chain_init",
        "fastmace.dynamics.integrators.nose_hoover:nose_hoover_chain_step",
        (
            TEMPERATURE.stricter(strict=True),
            TAU.stricter(lower=None, strict=False, at_least_timestep=True, help=(
                "thermostat time constant in fs, at least the timestep")),
            CHAIN_LENGTH,
        ),
        aliases=("nose-hoover", "nhc"), targets=("temperature",),
    ),
    EnsembleDescriptor(
        "npt", "stochastic cell rescaling (Bernetti-Bussi) with CSVR",
        "fastmace.dynamics.integrators.npt:npt_init", "fastmace.dynamics.integrators.npt:npt_step",
        (
            TEMPERATURE, PRESSURE, PRESSURE_BAR, THERMOSTAT_TAU, BAROSTAT_TAU, COMPRESSIBILITY,
            CELL_MODE,
        ),
        stochastic=True, targets=("temperature", "pressure"),
        schedules=("temperature", "pressure"), rescaling_only=True,
    ),
)  # fmt: skip
"""The ensembles FastMACE ships, in the order the docs list them."""

_REGISTRY: dict[str, EnsembleDescriptor] = {}


def _check_new_names(descriptor: EnsembleDescriptor) -> None:
    taken = {name for known in _REGISTRY.values() for name in (known.name, *known.aliases)}
    clash = sorted(taken & {descriptor.name, *descriptor.aliases})
    if clash:
        raise ValueError(f"ensemble {descriptor.name}: {', '.join(clash)} already names one")


def register_ensemble(descriptor: EnsembleDescriptor) -> None:
    """Offer ``descriptor``'s ensemble to every entry point of this process (not to child
    processes: ``subprocess=True`` and ``gpus`` know only the built-in ones)."""
    _check_new_names(descriptor)
    _REGISTRY[descriptor.name] = descriptor


@contextmanager
def registered(descriptor: EnsembleDescriptor) -> Iterator[EnsembleDescriptor]:
    """``descriptor``'s ensemble offered within the ``with`` block only."""
    register_ensemble(descriptor)
    try:
        yield descriptor
    finally:
        del _REGISTRY[descriptor.name]


for _descriptor in BUILT_IN:
    register_ensemble(_descriptor)


# -- what the entry points read --------------------------------------------------------------


def descriptors() -> tuple[EnsembleDescriptor, ...]:
    """Every ensemble offered, built-in ones first."""
    return tuple(_REGISTRY.values())


def ensemble_names(*, aliases: bool = False) -> tuple[str, ...]:
    """The canonical names (and, with ``aliases``, every alias after them)."""
    names = tuple(_REGISTRY)
    if aliases:
        names += tuple(alias for known in _REGISTRY.values() for alias in known.aliases)
    return names


def setting_names() -> tuple[str, ...]:
    """Every ensemble setting: keyword arguments of fm.md and keys of a run config."""
    return tuple(dict.fromkeys(s.name for known in _REGISTRY.values() for s in known.settings))


def described_settings() -> dict[str, Setting]:
    """Each setting name and its first description (the CLI's flag and help)."""
    found: dict[str, Setting] = {}
    for known in _REGISTRY.values():
        for setting in known.settings:
            found.setdefault(setting.name, setting)
    return found


def per_system_settings() -> tuple[str, ...]:
    """The settings that may differ per system of a batch."""
    return tuple(name for name, setting in described_settings().items() if setting.per_system)


def descriptor(name: str) -> EnsembleDescriptor:
    """The ensemble called ``name`` (or an alias); EnsembleError if there is none."""
    return _REGISTRY[canonical_ensemble(name)]


def canonical_ensemble(name: str) -> str:
    """The canonical name of ensemble ``name`` (or an alias); EnsembleError if there is none."""
    if not isinstance(name, str):
        raise EnsembleError(f"ensemble must be a name, got {name!r}")
    wanted = name.lower()
    for known in _REGISTRY.values():
        if wanted == known.name or wanted in known.aliases:
            return known.name
    choices = ", ".join(ensemble_names(aliases=True))
    raise EnsembleError(f"unknown ensemble {name!r}; choose one of: {choices}")


def offering(quantity: str) -> tuple[str, ...]:
    """The ensembles whose target ``quantity`` ("temperature", "pressure") may follow a
    schedule, for messages."""
    return tuple(known.name for known in _REGISTRY.values() if quantity in known.schedules)


def exchanging() -> tuple[str, ...]:
    """The ensembles replica exchange runs under, for messages."""
    return tuple(known.name for known in _REGISTRY.values() if known.exchanges_temperatures)


def bind_ensemble(name: str, settings: Mapping[str, object]) -> tuple[str, dict[str, object]]:
    """The canonical name of ensemble ``name`` and those of ``settings`` that are not None.

    EnsembleError for an unknown name, a setting the ensemble does not take, or a required
    setting it lacks (a thermostat's temperature_K). The values themselves are checked by
    preflight (:mod:`fastmace.preflight.ensemble`) and again by the integrator.
    """
    known = descriptor(name)
    given = {key: value for key, value in settings.items() if value is not None}
    unknown = sorted(set(given) - set(known.setting_names))
    if unknown:
        takes = ", ".join(known.setting_names) or "no settings"
        raise EnsembleError(
            f"the {known.name} ensemble does not take {', '.join(unknown)}; it takes: {takes}"
        )
    for setting in known.settings:
        alternatives = [s.name for s in known.settings if s.instead_of == setting.name]
        if setting.required and not alternatives and setting.name not in given:
            raise EnsembleError(
                f"the {known.name} ensemble needs the {setting.help} ({setting.name})"
            )
    return known.name, given


def docs_table() -> str:
    """The ensembles as the Markdown table of docs/md.md ("Ensembles and units")."""
    rows = ["| `ensemble` | integrator | settings (defaults) |", "|---|---|---|"]
    for known in _REGISTRY.values():
        names = ", ".join(f"`{name}`" for name in (known.name, *known.aliases))
        shown = []
        for setting in known.settings:
            if setting.instead_of is not None:
                continue  # shown beside the setting it stands in for
            text = f"`{setting.name}`"
            others = [s.name for s in known.settings if s.instead_of == setting.name]
            text += "".join(f" or `{other}`" for other in others)
            if setting.choices:
                text += f" ({', '.join(f'`{choice}`' for choice in setting.choices)})"
            elif setting.default is not None:
                text += f" ({setting.default:g})"
            shown.append(text)
        rows.append(f"| {names} | {known.integrator} | {', '.join(shown) or 'none'} |")
    return "\n".join(rows) + "\n"
