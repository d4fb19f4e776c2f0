"""Names and defaults shared by the MD entry points; importing this loads no torch."""

from __future__ import annotations

DEFAULT_BLOCK_STEPS = 50  # K: steps per captured launch
DEFAULT_SKIN_A = 0.5  # Verlet skin of the neighbour list, Å

# The settings an ensemble may take, as keyword arguments of fm.md (see md/ensembles.py).
ENSEMBLE_SETTINGS = (
    "temperature_K", "friction_per_ps", "tau_fs", "chain_length", "pressure_GPa",
    "pressure_bar", "thermostat_tau_fs", "barostat_tau_fs", "compressibility_per_GPa",
    "cell_mode",
)  # fmt: skip
