"""The names and constants every room of FastMACE shares, written once; imports nothing.

The planner (torch-free) and the engine (torch) both read these tables, so they live here
rather than in either: backends and their one order, the engine's defaults and limits, and
the unit conversions (the ensembles have their own module, fastmace.ensemble_catalog).
"""

from __future__ import annotations

import math

# -- backends ---------------------------------------------------------------------------------

BACKENDS = ("e3nn", "cueq", "oeq", "hybrid")
"""Every backend a model can be converted to (fastmace.models.backends)."""
CUDA_BACKEND_ORDER = ("cueq", "hybrid", "e3nn")
"""Fastest first on CUDA, as measured (docs/validation/performance.md): the order in which
"auto" picks a backend, in fm.md's planner and in fm.load alike, and the gate's fallbacks."""
CPU_BACKEND = "e3nn"
"""The backend "auto" picks on the CPU (faster there than cuEquivariance's CPU fallback)."""
LONG_RANGE_MODEL_TYPES = ("PolarMACE",)
"""mace-torch model classes with a long-range part (MACE-POLAR-1): they run eagerly through
fm.calculator, on the e3nn backend when "auto" picks, and not in the captured MD engine."""
GRAPH_LONGRANGE_VERSION = "0.4.0"
"""The graph-longrange that mace-torch 0.3.16's PolarMACE can call (the polar extra's pin;
0.4.3 and 0.4.4 refuse its force_pbc_evaluator argument); `fastmace doctor` checks it."""
DTYPES = ("float32", "float64")
# How a float32 model's matrix products run: float32 on CUDA cores (results within float32
# rounding), TF32 tensor cores on CUDA (faster, looser: the gate's own tolerance below), or the
# linear layers' GEMMs with BF16 inputs and float32 sums (dynamics/irreps_linear.py).
MATMUL_PRECISIONS = ("float32", "tf32", "bf16")
DEFAULT_MATMUL_PRECISION = "float32"
# The gate holds a TF32 run to this many TF32 epsilons (2^-10) of the float32 gate's scales:
# about 2 % of the largest force (at least 0.02 eV/Å), 0.02 eV per atom.
TF32_EPSILON = 2.0**-10
TF32_GATE_EPSILONS = 20
# A BF16 run (its linear layers' inputs rounded to 7 stored bits) to this many BF16 epsilons:
# about 4 % of the largest force (at least 0.04 eV/Å), 0.04 eV per atom. Measured errors are
# below 1 % of the largest force (docs/validation/bf16.md).
BF16_EPSILON = 2.0**-7
BF16_GATE_EPSILONS = 5
# Each reduced precision's gate tolerance, as a fraction of the float32 gate's scales.
REDUCED_PRECISION_TOLERANCE = {
    "tf32": TF32_GATE_EPSILONS * TF32_EPSILON,
    "bf16": BF16_GATE_EPSILONS * BF16_EPSILON,
}

# Ensembles, their settings and defaults: fastmace.ensemble_catalog.


# -- the engine's defaults and limits -----------------------------------------------------------

MAX_TIMESTEP_FS = 10.0
"""The integrators refuse longer timesteps: no MACE model of interest is stable beyond this,
and a larger value is almost always a unit mistake (ASE time units, or ps for fs)."""
DEFAULT_TIMESTEP_FS = 1.0
"""The timestep of a new run when none is given (a resumed run keeps its saved one)."""
DEFAULT_BLOCK_STEPS = 50
"""K: MD steps per captured launch (up to LARGE_ATOMS atoms)."""
DEFAULT_SKIN_A = 0.5
"""The MD engine's Verlet skin, Å."""
CALCULATOR_SKIN_A = 0.0
"""The ASE calculator's skin, Å: none, since each call's search is cheap next to the model,
while a skin's extra edges (about a third more for 0.5 Å at a 5 Å cutoff) would go through
the model on every call. A skin pays off only where the search costs more than those edges."""
NEIGHBOUR_HEADROOM = 1.25
"""The neighbour list's buffers hold this many times what the first build needs."""
CUTOFF_HEADROOM = 1.1
"""The same for the model's edges (pairs within the cutoff): tighter, since the model pays
for every slot and their count moves far less than a whole rebuild's."""

# -- the guard: physical bounds checked on the device every block (docs/md.md) -------------------

GUARD_TEMPERATURE_FACTOR = 10.0
"""A system hotter than this times its reference temperature (the larger of its target, its
temperature at the start and GUARD_TEMPERATURE_FLOOR_K) has blown up: a thermostat holds the
temperature within a few tens of per cent of its target once the system has a few atoms."""
GUARD_TEMPERATURE_FLOOR_K = 300.0
"""The smallest reference temperature: a run started cold (NVE from 0 K, a quench) may heat
from its own potential energy without tripping the guard below ten times this."""
GUARD_ENERGY_PER_ATOM_EV = 1.0
"""The largest change per atom of a system's conserved energy since the run started, in eV:
about 7,700 K of heat per atom, orders of magnitude beyond the integration error of a sound
run (a blow-up passes it within a few steps)."""
GUARD_NPT_ENERGY_FACTOR = 10.0
"""NPT has no exactly conserved energy (the barostat's noise and friction are not tracked):
its enthalpy plus the heat given to the thermostat may change by this many times the bound,
which leaves room for compressing a solid to a few hundred GPa."""
GUARD_MAX_FORCE_EV_PER_A = 100.0
"""The largest force on any atom, in eV/Å: about what two atoms 0.8 Å apart feel; a sound
run, even at a few thousand K, stays below a few tens of eV/Å."""
GUARD_VOLUME_FACTOR = 5.0
"""Under NPT, a cell more than this many times larger or smaller than at the start has blown
up or collapsed; a packing built at low density or a phase transition stays within 3."""
GUARD_DISPLACEMENT_SKINS = 2.0
"""The largest displacement of an atom since the neighbour list's last rebuild, in skins: with
searches on every step the list is rebuilt once an atom has moved half a skin, so this much
means one step moved an atom by more than 1.5 skins (0.75 Å with the default skin)."""

# -- units (CODATA 2014, as ase.units) -----------------------------------------------------------

_BOLTZMANN_J_PER_K = 1.38064852e-23
_ELEMENTARY_CHARGE_C = 1.6021766208e-19
_ATOMIC_MASS_KG = 1.660539040e-27

KB_EV_PER_K = _BOLTZMANN_J_PER_K / _ELEMENTARY_CHARGE_C
"""Boltzmann's constant in eV/K: ``kT = KB_EV_PER_K * T``."""
EV_PER_AMU_A2_PER_FS2 = 1.0 / (1e-5 * math.sqrt(_ELEMENTARY_CHARGE_C / _ATOMIC_MASS_KG)) ** 2
"""The energy 1 amu·Å²/fs² in eV (about 103.64): kinetic energy is ``0.5 m v² *`` this, and a
force F (eV/Å) gives the acceleration ``F / (m *`` this ``)`` in Å/fs²."""
FS_PER_PS = 1000.0
GPA_PER_BAR = 1e-4
EV_PER_A3_PER_GPA = 1e-21 / _ELEMENTARY_CHARGE_C
"""1 GPa in eV/Å^3 (about 1/160.2)."""
EV_PER_A3_IN_GPA = 1.0 / EV_PER_A3_PER_GPA
"""1 eV/Å^3 in GPa (about 160.2): stresses and pressures as reported."""
EV_PER_A3_PER_BAR = GPA_PER_BAR * EV_PER_A3_PER_GPA
"""1 bar (1e5 Pa) in eV/Å^3."""

SETUP_PROGRESS_ATOMS = 50_000
"""From this many atoms a run's set-up says what it is doing, part by part, as it goes (a
million atoms' first forces take minutes on a CPU)."""
