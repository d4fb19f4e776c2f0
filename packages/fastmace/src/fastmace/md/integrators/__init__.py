"""MD integrators on the batched State: NVE, Langevin, CSVR, Nosé-Hoover chain and NPT.

Each integrator is a pair of plain functions, ``*_init(state, compute, ...) -> XState`` and
``*_step(md, compute) -> XState``, where ``compute(state) -> ForceResult`` is the potential.
An init function checks its inputs (on the host, with errors that say what is allowed),
removes every system's centre-of-mass momentum and computes the first forces. A step is device
work only: no host synchronisation, no branching on tensor values, fixed shapes, random
numbers from the generator held in the integrator state, never torch's global one. It builds
new tensors rather than writing into the ones it was given, so a block of steps can be
captured in a CUDA graph (copy the outputs back into the captured inputs between replays, and
register the generator with the graph: ``CUDAGraph.register_generator_state``).

Units: temperatures in K, timesteps and time constants in fs, Langevin friction in 1/ps,
pressures in GPa (or bar through ``pressure_bar``), compressibility in 1/GPa. Internally eV,
Å, fs and amu (``units``). Per-system targets: every temperature, time constant, friction and
pressure may be one value or one per system.

Centre of mass and degrees of freedom: the potential (MACE) is translation invariant, so each
system's total momentum is conserved; it is set to zero at init. Temperatures and thermostats
use ``N_f = 3N - 3`` per system, periodic or not (rotations are not removed). Velocity Verlet
leaves the COM momentum alone after init (its reversibility is exact); the thermostats and the
barostat remove it every step, which for Langevin is needed (its noise would move the COM)
and elsewhere only cancels round-off in the net force.

Monitoring: every state has ``kinetic_energy()``, ``temperature()`` (K) and
``total_energy()``; NVE, Langevin, CSVR and the chain also ``conserved_energy()``, which stays
constant up to the integration error (for the stochastic ones through ``thermostat_energy``,
the energy handed to the bath). NPT has ``pressure_tensor()``.

Batches and random numbers: a batch shares one generator, so a stochastic run of a batch is
statistically equivalent, not bitwise equal, to runs of its systems alone; with the same seed
and batch it is reproducible. NVE and the Nosé-Hoover chain are deterministic and give each
system the same trajectory batched or alone.
"""

from fastmace.md.integrators.common import (
    ComputeFn,
    ForceResult,
    MDState,
    kinetic_energy,
    make_generator,
    maxwell_boltzmann_velocities,
    remove_com_momentum,
)
from fastmace.md.integrators.csvr import CSVRState, csvr_init, csvr_step
from fastmace.md.integrators.langevin import LangevinState, langevin_init, langevin_step
from fastmace.md.integrators.nose_hoover import (
    NoseHooverChainState,
    nose_hoover_chain_init,
    nose_hoover_chain_step,
)
from fastmace.md.integrators.npt import CELL_MODES, NPTState, npt_init, npt_step
from fastmace.md.integrators.nve import NVEState, nve_init, nve_step
from fastmace.md.integrators.validation import MAX_TIMESTEP_FS

__all__ = [
    "CELL_MODES",
    "MAX_TIMESTEP_FS",
    "CSVRState",
    "ComputeFn",
    "ForceResult",
    "LangevinState",
    "MDState",
    "NPTState",
    "NVEState",
    "NoseHooverChainState",
    "csvr_init",
    "csvr_step",
    "kinetic_energy",
    "langevin_init",
    "langevin_step",
    "make_generator",
    "maxwell_boltzmann_velocities",
    "nose_hoover_chain_init",
    "nose_hoover_chain_step",
    "npt_init",
    "npt_step",
    "nve_init",
    "nve_step",
    "remove_com_momentum",
]
