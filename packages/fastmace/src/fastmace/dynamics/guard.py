"""The guard: physical sanity bounds of a run, evaluated on the device inside each block.

A blow-up rarely produces a NaN at once: atoms fly apart, the thermostat fights a temperature
of millions of K, the barostat inflates the cell without end, and every number stays finite.
The guard watches, per system, the largest force of every step (a running maximum: forces are
already computed, and a spike is the first sign) and, at the end of each block, the
temperature, the change per atom of the conserved energy since the start, the volume relative
to the start (NPT) and the largest displacement the neighbour list's skin test has seen since
its last rebuild. These land in one small (S, 5) device tensor that the engine reads with its
other flags at the block's one host synchronisation; :meth:`Guard.check` then compares them
with the bounds on the host. The bounds and why they never trip in a sound run: docs/md.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fastmace.dynamics.errors import Breach, GuardError
from fastmace.dynamics.fusion import fusible
from fastmace.dynamics.integrators import Barostatted, MDState, Thermostatted
from fastmace.dynamics.integrators.common import cell_volume, system_sum
from fastmace.dynamics.integrators.units import KB_EV_PER_K
from fastmace.dynamics.neighbours import NeighbourList
from fastmace.vocabulary import GUARD_NPT_ENERGY_FACTOR, GUARD_TEMPERATURE_FLOOR_K

if TYPE_CHECKING:
    from fastmace.planner.guard import GuardConfig

QUANTITIES = ("temperature", "energy", "force", "volume", "displacement")
"""The columns of :attr:`Guard.values`, in order."""


def watched_energy(md: MDState) -> torch.Tensor:
    """(S,) the energy the guard watches: the integrator's conserved energy; under NPT, which
    has none, the enthalpy at the target pressure plus the heat given to the thermostat."""
    if isinstance(md, Barostatted):
        enthalpy = md.total_energy() + md.pressure * cell_volume(md.state.cell)
        return enthalpy + md.thermostat_energy
    conserved = getattr(md, "conserved_energy", md.total_energy)
    return conserved()


class Guard:
    """The bounds of ``config`` for the run that starts (or resumes) at ``md``.

    ``references`` (from a restart: :meth:`references`) keeps the first session's temperature,
    energy and volume references, so a resumed run is held to the same bounds.
    """

    def __init__(
        self,
        md: MDState,
        config: GuardConfig,
        *,
        skin_A: float,
        references: Mapping[str, Any] | None = None,
        hottest_target_K: float = 0.0,
    ) -> None:
        """``hottest_target_K``: the highest target a temperature schedule will ask for, so
        that heating by schedule is not taken for a blow-up."""
        self.config = config
        state, device = md.state, md.state.device
        saved = references or {}
        with torch.no_grad():
            start_temperature = md.temperature().cpu().numpy()
            energy = watched_energy(md)
            volume = cell_volume(state.cell)
            atoms = system_sum(torch.ones_like(state.masses), state.system, state.n_systems)
        target = (
            md.kT.cpu().numpy() / KB_EV_PER_K
            if isinstance(md, Thermostatted)
            else np.zeros(state.n_systems)
        )
        reference = np.maximum.reduce([
            target, start_temperature, np.full(state.n_systems, GUARD_TEMPERATURE_FLOOR_K),
            np.full(state.n_systems, hottest_target_K),
        ])  # fmt: skip
        self.temperature_reference_K = _saved(saved, "temperature_reference_K", reference)
        self.npt = isinstance(md, Barostatted)
        self.energy_bound = config.energy_per_atom_eV * (GUARD_NPT_ENERGY_FACTOR if self.npt else 1)
        self.max_displacement_A = config.displacement_skins * skin_A

        def tensor(name: str, value: torch.Tensor) -> torch.Tensor:
            array = _saved(saved, name, value.detach().cpu().numpy())
            return torch.as_tensor(array, dtype=torch.float64, device=device)

        self._energy_reference = tensor("energy_reference_eV", energy)
        self._volume_reference = tensor("volume_reference_A3", volume)
        self.volume_reference_A3 = self._volume_reference.cpu().numpy()  # for messages
        self._atoms = atoms
        # Device tensors the captured block writes into: a running maximum of the squared
        # largest force per system, and the values the engine reads once per block.
        self._force2 = torch.zeros(state.n_systems, dtype=torch.float64, device=device)
        self.values = torch.zeros(
            (state.n_systems, len(QUANTITIES)), dtype=torch.float64, device=device
        )

    # -- on the device, inside the captured block --------------------------------------------

    def start_block(self, md: MDState, neighbours: NeighbourList) -> None:
        """Reset the block's maxima: the forces the block starts from count as its first."""
        self._force2.zero_()
        _keep_largest_force2(self._force2, md.forces, md.state.system)
        neighbours.largest_move.zero_()

    def observe(self, md: MDState) -> None:
        """After each step: the running maximum of the largest force (two small reductions)."""
        _keep_largest_force2(self._force2, md.forces, md.state.system)

    def finish_block(self, md: MDState, neighbours: NeighbourList) -> None:
        """At the block's end: every watched value of every system into :attr:`values`."""
        ones = torch.ones_like(self._volume_reference)
        volume = cell_volume(md.state.cell) / self._volume_reference if self.npt else ones
        energy = (watched_energy(md) - self._energy_reference).abs() / self._atoms
        columns = (md.temperature(), energy, self._force2.sqrt(), volume, neighbours.largest_move)
        self.values.copy_(torch.stack(columns, dim=1))

    # -- on the host, after the block's one synchronisation ------------------------------------

    def check(self, values: torch.Tensor | np.ndarray, steps: tuple[int, int]) -> None:
        """Raise GuardError when a value of :attr:`values` (read back to the host, flattened or
        not) of the block of ``steps`` (first, last) is out of its bounds; the message names
        each breach."""
        table = np.asarray(values, dtype=np.float64).reshape(-1, len(QUANTITIES))
        breaches = [
            breach
            for system, row in enumerate(table)
            for breach in self._breaches(system, dict(zip(QUANTITIES, row, strict=True)))
        ]
        if breaches:
            shown = "; ".join(_describe(breach) for breach in breaches[:4])
            more = f"; and {len(breaches) - 4} more" if len(breaches) > 4 else ""
            raise GuardError(
                f"the run left the guard's physical bounds in steps {steps[0]} to {steps[1]}: "
                f"{shown}{more}. A timestep too long for the fastest motion, atoms too close in "
                "the structure, or a model used outside its training data are the usual causes",
                breaches,
            )

    def _breaches(self, system: int, value: dict[str, float]) -> list[Breach]:
        config, found = self.config, []

        def above(quantity: str, bound: float, unit: str, why: str) -> None:
            if value[quantity] > bound:
                found.append(Breach(quantity, system, value[quantity], bound, unit, why))

        reference = float(self.temperature_reference_K[system])
        above("temperature", config.temperature_factor * reference, "K",
              f"temperature_factor {config.temperature_factor:g} x {reference:.4g} K")  # fmt: skip
        ratio, factor = value["volume"], config.volume_factor
        if self.npt and (ratio > factor or ratio < 1.0 / factor):
            start = float(self.volume_reference_A3[system])
            bound = factor if ratio > 1 else 1.0 / factor
            why = f"volume_factor {factor:g} on the start's {start:.4g} Å^3"
            found.append(Breach("volume", system, ratio * start, bound * start, "Å^3", why))
        npt = f" x {GUARD_NPT_ENERGY_FACTOR:g} under NPT" if self.npt else ""
        above("energy", self.energy_bound, "eV/atom", f"energy_per_atom_eV{npt}")
        above("force", config.max_force_eV_per_A, "eV/Å", "max_force_eV_per_A")
        above("displacement", self.max_displacement_A, "Å",
              f"displacement_skins {config.displacement_skins:g} x the skin")  # fmt: skip
        return found

    # -- records --------------------------------------------------------------------------------

    def references(self) -> dict[str, np.ndarray]:
        """What a restart keeps, so that a resumed run is held to the same bounds."""
        return {
            "temperature_reference_K": np.asarray(self.temperature_reference_K, dtype=np.float64),
            "energy_reference_eV": self._energy_reference.cpu().numpy(),
            "volume_reference_A3": self._volume_reference.cpu().numpy(),
        }

    def record(self) -> dict[str, Any]:
        """metadata.json's ``engine.guard``: the configured bounds and the bounds in force."""
        return {
            **self.config.to_dict(),
            "temperature_bound_K": (
                self.config.temperature_factor * np.asarray(self.temperature_reference_K)
            ).tolist(),
            "energy_bound_eV_per_atom": self.energy_bound,
            "volume_checked": self.npt,
            "max_displacement_A": self.max_displacement_A,
        }


@fusible
def _keep_largest_force2(
    largest_so_far: torch.Tensor, forces: torch.Tensor, system: torch.Tensor
) -> None:
    """Raise ``largest_so_far`` (S,) to each system's squared largest force on an atom (no
    host synchronisation; one fused computation when compiled)."""
    squared = (forces * forces).sum(dim=1).to(torch.float64)
    largest = torch.zeros_like(largest_so_far).scatter_reduce(0, system, squared, "amax")
    largest_so_far.copy_(torch.maximum(largest_so_far, largest))


def _saved(saved: Mapping[str, Any], name: str, default: np.ndarray) -> np.ndarray:
    """A reference from a restart, when it has one of the right shape; else ``default``."""
    value = saved.get(name)
    if value is None or np.shape(value) != np.shape(default):
        return np.asarray(default, dtype=np.float64)
    return np.asarray(value, dtype=np.float64)


def _describe(breach: Breach) -> str:
    what = {
        "temperature": "temperature",
        "energy": "energy per atom changed since the start by",
        "force": "largest force on an atom",
        "volume": "volume",
        "displacement": "largest displacement of an atom since the neighbour list's last rebuild",
    }[breach.quantity]
    side = "below" if breach.value < breach.bound else "above"
    return (
        f"system {breach.system}'s {what} {breach.value:.4g} {breach.unit}, {side} the bound "
        f"of {breach.bound:.4g} {breach.unit} ({breach.why})"
    )
