"""MD integrators on the batched State: NVE, Langevin, CSVR, Nosé-Hoover chain and NPT.

Each integrator is a pair of plain functions, ``*_init(state, compute, ...) -> XState`` and
``*_step(md, compute) -> XState``; a step is device work only on fixed shapes, so a block of
steps can be captured in a CUDA graph. Units are those users type (K, fs, 1/ps, GPa); every
target may be given per system. The conventions (centre of mass, degrees of freedom, random
numbers, monitoring): docs/design/integrators.md.
"""

from fastmace.dynamics.integrators.common import (
    Barostatted,
    ComputeFn,
    ForceResult,
    MDState,
    Thermostatted,
    kinetic_energy,
    maxwell_boltzmann_velocities,
    remove_com_momentum,
)
from fastmace.dynamics.integrators.csvr import CSVRState, csvr_init, csvr_step
from fastmace.dynamics.integrators.langevin import LangevinState, langevin_init, langevin_step
from fastmace.dynamics.integrators.nose_hoover import (
    NoseHooverChainState,
    nose_hoover_chain_init,
    nose_hoover_chain_step,
)
from fastmace.dynamics.integrators.npt import CELL_MODES, NPTState, npt_init, npt_step
from fastmace.dynamics.integrators.nve import NVEState, nve_init, nve_step
from fastmace.dynamics.integrators.streams import RandomStreams, random_streams
from fastmace.dynamics.integrators.validation import MAX_TIMESTEP_FS

__all__ = [
    "CELL_MODES",
    "MAX_TIMESTEP_FS",
    "Barostatted",
    "CSVRState",
    "ComputeFn",
    "ForceResult",
    "LangevinState",
    "MDState",
    "NPTState",
    "NVEState",
    "NoseHooverChainState",
    "RandomStreams",
    "Thermostatted",
    "csvr_init",
    "csvr_step",
    "kinetic_energy",
    "langevin_init",
    "langevin_step",
    "maxwell_boltzmann_velocities",
    "nose_hoover_chain_init",
    "nose_hoover_chain_step",
    "npt_init",
    "npt_step",
    "nve_init",
    "nve_step",
    "random_streams",
    "remove_com_momentum",
]
