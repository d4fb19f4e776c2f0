"""``fm.GuardConfig``: the physical bounds a run must stay within, or stop (docs/md.md).

Plain data, checked when made. The engine evaluates the bounds on the device inside each
captured block (:mod:`fastmace.dynamics.guard`); the defaults come from the vocabulary, each
with the reason it never trips in a sound run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from fastmace.vocabulary import (
    GUARD_DISPLACEMENT_SKINS,
    GUARD_ENERGY_PER_ATOM_EV,
    GUARD_MAX_FORCE_EV_PER_A,
    GUARD_TEMPERATURE_FACTOR,
    GUARD_VOLUME_FACTOR,
)


@dataclass(frozen=True, kw_only=True)
class GuardConfig:
    """The guard's bounds; ``enabled=False`` switches it off (only non-finite values stop a run)."""

    enabled: bool = True
    temperature_factor: float = GUARD_TEMPERATURE_FACTOR
    """Stop when a system is hotter than this times its reference temperature: the larger of
    its target, its temperature at the start and 300 K."""
    energy_per_atom_eV: float = GUARD_ENERGY_PER_ATOM_EV
    """Stop when a system's conserved energy has changed by more than this per atom since the
    start (ten times more under NPT, whose enthalpy is not exactly conserved)."""
    max_force_eV_per_A: float = GUARD_MAX_FORCE_EV_PER_A
    """Stop when a force on an atom is larger than this."""
    volume_factor: float = GUARD_VOLUME_FACTOR
    """Under NPT: stop when a cell's volume is more than this times larger or smaller than at
    the start."""
    displacement_skins: float = GUARD_DISPLACEMENT_SKINS
    """Stop when an atom has moved more than this many neighbour-list skins since the list's
    last rebuild, although it is searched on every step."""

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ValueError(
                f"GuardConfig(enabled={self.enabled!r}) is not allowed: use True or False"
            )
        for name in ("energy_per_atom_eV", "max_force_eV_per_A", "displacement_skins"):
            _positive(name, getattr(self, name), least=0.0)
        for name in ("temperature_factor", "volume_factor"):
            _positive(name, getattr(self, name), least=1.0)

    @classmethod
    def coerce(cls, value: GuardConfig | bool | Mapping[str, Any] | None) -> GuardConfig:
        """A GuardConfig from what fm.md, a run config or the CLI give: None or True (the
        defaults), False (off), a mapping of bounds (a TOML table), or a GuardConfig."""
        if isinstance(value, GuardConfig):
            return value
        if value is None or value is True:
            return cls()
        if value is False:
            return cls(enabled=False)
        if isinstance(value, Mapping):
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown:
                raise ValueError(
                    f"guard: unknown bound(s) {', '.join(map(str, unknown))}; the bounds are: "
                    f"{', '.join(sorted(known))}"
                )
            return cls(**value)
        raise ValueError(
            f"guard={value!r} is not allowed: use True (the default bounds), False (off), a "
            "table of bounds such as {'max_force_eV_per_A': 200}, or an fm.GuardConfig"
        )

    def to_dict(self) -> dict[str, Any]:
        """Every field: JSON-serialisable."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _positive(name: str, value: Any, least: float) -> None:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not (number and not math.isnan(value) and value > least):
        raise ValueError(
            f"GuardConfig({name}={value!r}) is not allowed: use a number above {least:g} "
            "(math.inf switches this bound off)"
        )
