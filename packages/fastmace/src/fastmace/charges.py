"""Each system's total charge and spin multiplicity, for long-range models (MACE-POLAR-1).

mace-torch reads them from ``atoms.info["charge"]`` (e) and ``atoms.info["spin"]`` (the spin
multiplicity 2S + 1: 1 a singlet, 2 a doublet), a neutral singlet when absent. ``fm.md``'s
``charge=`` and ``spin=`` (one value for all systems, or one per system) take precedence over
them. Plain numbers, no torch: the request's checks use this before anything is loaded.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import ase

# mace-torch's defaults (``AtomicData.from_config``): neutral, a singlet.
DEFAULT_CHARGE = 0.0
DEFAULT_SPIN_MULTIPLICITY = 1.0
# How far from a whole number a spin multiplicity may be (a value read back from text).
_WHOLE_TOLERANCE = 1e-6

PerSystemValue = float | Sequence[float] | None
"""One value for all systems, one per system, or None (each structure's own ``info``)."""


class ChargeSpinError(ValueError):
    """A total charge or spin multiplicity that cannot be used; ``setting`` names it."""

    def __init__(self, message: str, setting: str) -> None:
        super().__init__(message)
        self.setting = setting


def check_given(charge: Any, spin: Any) -> None:
    """Refuse ``charge=`` and ``spin=`` arguments of the wrong kind or value (counts aside)."""
    for name, value in (("charge", charge), ("spin", spin)):
        if value is None:
            continue
        values = list(value) if isinstance(value, list | tuple) else [value]
        if not values:
            raise ChargeSpinError(f"{name}=[] is empty: give one value, or one per system", name)
        for item in values:
            _checked(name, item, f"{name}={value!r}")


def charges_and_spins(
    structures: Sequence[ase.Atoms], charge: PerSystemValue = None, spin: PerSystemValue = None
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(charges, spin multiplicities), one of each per structure: the arguments where given,
    else each structure's ``atoms.info``, else a neutral singlet. Raises ChargeSpinError."""
    check_given(charge, spin)
    charges = _resolve("charge", charge, structures, DEFAULT_CHARGE)
    spins = _resolve("spin", spin, structures, DEFAULT_SPIN_MULTIPLICITY)
    return charges, spins


def given_per_system(
    n_systems: int, charge: PerSystemValue = None, spin: PerSystemValue = None
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The arguments alone, one value per system each (empty where not given): what a run's
    settings carry, the structures' ``info`` filling the rest later. Raises ChargeSpinError."""
    check_given(charge, spin)
    return _expanded("charge", charge, n_systems), _expanded("spin", spin, n_systems)


def _resolve(
    name: str, given: PerSystemValue, structures: Sequence[ase.Atoms], default: float
) -> tuple[float, ...]:
    n_systems = len(structures)
    if given is None:
        return tuple(
            _checked(name, atoms.info.get(name, default), f'system {index}\'s atoms.info["{name}"]')
            for index, atoms in enumerate(structures)
        )
    return _expanded(name, given, n_systems)


def _expanded(name: str, given: PerSystemValue, n_systems: int) -> tuple[float, ...]:
    """``given`` as one float per system (empty for None), or ChargeSpinError for a count
    that is neither one nor ``n_systems``."""
    if given is None:
        return ()
    values = list(given) if isinstance(given, list | tuple) else [given]
    if len(values) == 1:
        return (float(values[0]),) * n_systems
    if len(values) != n_systems:
        raise ChargeSpinError(
            f"{name} has {len(values)} values for {n_systems} systems: give one value for all "
            "systems, or one per system (replicas and every frame of a file count)",
            name,
        )
    return tuple(float(value) for value in values)


def _checked(name: str, value: Any, where: str) -> float:
    """``value`` as a float, or ChargeSpinError saying what is wrong with it and where."""
    number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not number or not math.isfinite(float(value)):
        what = "a total charge in e" if name == "charge" else "a spin multiplicity"
        raise ChargeSpinError(f"{where} is not {what}: give a finite number", name)
    value = float(value)
    if name == "spin" and (value < 1 or abs(value - round(value)) > _WHOLE_TOLERANCE):
        raise ChargeSpinError(
            f"{where} is not a spin multiplicity: spin is 2S + 1, a whole number of 1 or more "
            "(1 a singlet, 2 a doublet, 3 a triplet), as mace-torch reads it; got "
            f"{value:g}",
            name,
        )
    return value


def refused_for_local_model(model: str, setting: str) -> ChargeSpinError:
    """The error for a charge or spin given with a model that has no long-range part."""
    return ChargeSpinError(
        f"charge and spin are read by long-range models (MACE-POLAR-1) only, and {model} has "
        "no long-range part: its energy does not depend on them. Leave charge and spin out, "
        "or run a MACE-POLAR-1 model",
        setting,
    )


def describe(charges: Sequence[float], spins: Sequence[float]) -> str:
    """One line: the systems' charges and multiplicities (all alike: once)."""
    pairs = [
        f"charge {c:+g} e, spin multiplicity {s:g}" for c, s in zip(charges, spins, strict=True)
    ]
    if len(set(pairs)) == 1:
        every = "" if len(pairs) == 1 else f" (each of {len(pairs)} systems)"
        return pairs[0] + every
    return "; ".join(f"system {index}: {pair}" for index, pair in enumerate(pairs))
