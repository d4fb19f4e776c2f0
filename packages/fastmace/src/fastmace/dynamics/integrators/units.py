"""Unit conversions between what users type (K, fs, 1/ps, GPa, bar) and the internal units.

Internal units are eV for energy, Å for length, fs for time and amu for mass, so velocities
are in Å/fs and stresses and pressures in eV/Å^3. The constants live in
:mod:`fastmace.vocabulary` (CODATA 2014, as ``ase.units``; a test checks them against ASE).
"""

from __future__ import annotations

from fastmace.vocabulary import (
    EV_PER_A3_PER_BAR,
    EV_PER_A3_PER_GPA,
    EV_PER_AMU_A2_PER_FS2,
    FS_PER_PS,
    KB_EV_PER_K,
)

__all__ = [
    "EV_PER_A3_PER_BAR",
    "EV_PER_A3_PER_GPA",
    "EV_PER_AMU_A2_PER_FS2",
    "FS_PER_PS",
    "KB_EV_PER_K",
    "per_gpa_to_a3_per_ev",
]


def per_gpa_to_a3_per_ev(compressibility_per_GPa: float) -> float:
    """A compressibility in 1/GPa, in Å^3/eV."""
    return compressibility_per_GPa / EV_PER_A3_PER_GPA
