"""Unit conversions between what users type (K, fs, 1/ps, GPa, bar) and the internal units.

Internal units are eV for energy, Å for length, fs for time and amu for mass, so velocities
are in Å/fs and stresses and pressures in eV/Å^3. The constants are derived from the CODATA
2014 values that ASE uses by default (``ase.units``, ``__codata_version__ == "2014"``); a
test checks them against ASE.
"""

from __future__ import annotations

import math

# CODATA 2014, as in ase.units.
_BOLTZMANN_J_PER_K = 1.38064852e-23
_ELEMENTARY_CHARGE_C = 1.6021766208e-19
_ATOMIC_MASS_KG = 1.660539040e-27

KB_EV_PER_K = _BOLTZMANN_J_PER_K / _ELEMENTARY_CHARGE_C
"""Boltzmann's constant in eV/K: ``kT = KB_EV_PER_K * T``."""

EV_PER_AMU_A2_PER_FS2 = 1.0 / (1e-5 * math.sqrt(_ELEMENTARY_CHARGE_C / _ATOMIC_MASS_KG)) ** 2
"""The energy 1 amu·Å²/fs² in eV (about 103.64): kinetic energy is ``0.5 m v² *`` this, and a
force F (eV/Å) gives the acceleration ``F / (m *`` this ``)`` in Å/fs²."""

FS_PER_PS = 1000.0

EV_PER_A3_PER_GPA = 1e-21 / _ELEMENTARY_CHARGE_C
"""1 GPa in eV/Å^3 (about 1/160.2)."""

EV_PER_A3_PER_BAR = 1e-4 * EV_PER_A3_PER_GPA
"""1 bar (1e5 Pa) in eV/Å^3."""


def kelvin_to_ev(temperature_K: float) -> float:
    """kT in eV for a temperature in K."""
    return KB_EV_PER_K * temperature_K


def per_ps_to_per_fs(rate_per_ps: float) -> float:
    """A rate (friction) given in 1/ps, in 1/fs."""
    return rate_per_ps / FS_PER_PS


def gpa_to_ev_per_a3(pressure_GPa: float) -> float:
    """A pressure or stress in GPa, in eV/Å^3."""
    return pressure_GPa * EV_PER_A3_PER_GPA


def bar_to_ev_per_a3(pressure_bar: float) -> float:
    """A pressure or stress in bar, in eV/Å^3."""
    return pressure_bar * EV_PER_A3_PER_BAR


def per_gpa_to_a3_per_ev(compressibility_per_GPa: float) -> float:
    """A compressibility in 1/GPa, in Å^3/eV."""
    return compressibility_per_GPa / EV_PER_A3_PER_GPA
