"""``fm.calculator(model)``: the MD engine's potential as an ASE calculator.

:class:`FastMACECalculator` evaluates exactly what the MD engine evaluates: the converted model
of ``fm.load`` wrapped in :class:`~fastmace.dynamics.potential.Potential`, on edges from FastMACE's
own :class:`~fastmace.dynamics.neighbours.NeighbourList`. It gives energy (= free energy), forces
and, for fully periodic cells, stress; per-atom energies are not available, because the
potential sums them on the device and does not return them.

Each call checks the structure (elements, overlapping atoms, NaN positions) and converts it
to a one-system :class:`~fastmace.dynamics.state.State`. The neighbour list is planned once and
kept while the atoms (their number and elements) and the periodicity stay the same: a later
call only runs the list's ``update`` (a search into the existing buffers, no re-planning),
and with a skin none at all while no atom has moved more than half the skin. If the list
overflows (more edges, a fuller bin or a smaller cell than it was planned for) a larger one is
planned and built. Everything is read back to the host after each call, as ASE needs.

With ``dispersion="d3bj"`` the calculator adds D3(BJ) as the MD engine does (its own, longer
neighbour list, kept the same way): the force field of ``fm.md(dispersion="d3bj")``.

Long-range models (MACE-POLAR-1's PolarMACE) run here, eagerly, and not in the MD engine. Their
energy depends on each structure's total charge and spin multiplicity, read as mace-torch's
calculator reads them: ``atoms.info["charge"]`` and ``atoms.info["spin"]`` (the multiplicity
2S + 1), else the calculator's ``charge`` and ``spin``, else a neutral singlet. A change of
either in ``atoms.info`` is a change of the system: the next call computes again.

Import note: this module is ``fastmace.ase``, and ``import ase`` in it (absolute, as all
imports are in Python 3) is the ASE package, not this module.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, ClassVar

import ase
import numpy as np
import torch
from ase.calculators.calculator import Calculator, all_changes
from ase.stress import full_3x3_to_voigt_6_stress

from fastmace import assembly
from fastmace.charges import DEFAULT_CHARGE, DEFAULT_SPIN_MULTIPLICITY
from fastmace.dynamics.checks import check_structures
from fastmace.dynamics.dispersion import D3BJ, D3BJParameters, model_dispersion_functional
from fastmace.dynamics.edges import Edges
from fastmace.dynamics.neighbours import NeighbourList
from fastmace.dynamics.overflow import overflowed, regrow
from fastmace.dynamics.polar import is_long_range
from fastmace.dynamics.potential import Potential
from fastmace.dynamics.state import State
from fastmace.models.load import LoadedModel, load
from fastmace.planner import EngineSettings
from fastmace.vocabulary import CALCULATOR_SKIN_A, DEFAULT_MATMUL_PRECISION, MATMUL_PRECISIONS


@dataclass
class _Neighbours:
    """The neighbour list kept between calls, and what it was planned for."""

    key: tuple[tuple[int, ...], tuple[bool, ...]]  # atomic numbers in order, pbc
    neighbours: NeighbourList
    edges: Edges


class FastMACECalculator(Calculator):
    """An ASE calculator on FastMACE's potential: energy, free energy, forces, stress.

    Args:
        model: a :class:`~fastmace.models.load.LoadedModel` from ``fm.load``, or anything
            ``fm.load`` accepts (a label such as ``"demo-emt-cu"``, ``"template:tiny"``, a
            path, an https URL), which is then loaded with the options below.
        head: the head of a multi-head model (loading only).
        device: ``"cpu"`` or ``"cuda"``; loading defaults to ``"cpu"``, a loaded model stays
            on its own device.
        dtype: ``"float32"`` or ``"float64"`` (loading only; default: the checkpoint's).
        backend: ``"auto"``, ``"e3nn"``, ``"cueq"``, ``"oeq"`` or ``"hybrid"`` (loading only).
        skin_A: Verlet skin of the neighbour list in Å (default none:
            ``fastmace.vocabulary.CALCULATOR_SKIN_A`` says why).
        dispersion: ``"d3bj"`` adds D3(BJ) dispersion (``"d3bj-atm"``: with its three-body
            term), with the parameters of the functional
            the model's head was trained on, or of ``dispersion_functional``, as ``fm.md``
            does (docs/md.md).
        charge: total charge in e of structures without ``atoms.info["charge"]`` (long-range
            models only; default 0).
        spin: spin multiplicity 2S + 1 of structures without ``atoms.info["spin"]``
            (long-range models only; default 1, a singlet; 2 is a doublet), as mace-torch.
        matmul_precision: ``"float32"`` (default), ``"tf32"`` (CUDA) or ``"bf16"`` (the
            linear layers' GEMMs with BF16 inputs; float32 models), as in ``fm.md``
            (docs/md.md).
        **load_options: further arguments of ``fm.load`` (``checkpoint``, ``download``,
            ``sha256``, ``trusted``, ``seed``, ``progress``).

    Options that contradict an already loaded model raise ValueError: a loaded model is not
    converted again here.
    """

    implemented_properties: ClassVar[list[str]] = ["energy", "free_energy", "forces", "stress"]
    name = "FastMACE"

    def __init__(
        self,
        model: LoadedModel | str | os.PathLike[str],
        *,
        head: str | None = None,
        device: str | None = None,
        dtype: str | torch.dtype | None = None,
        backend: str = "auto",
        skin_A: float = CALCULATOR_SKIN_A,
        dispersion: str | None = None,
        dispersion_functional: str | None = None,
        charge: float | None = None,
        spin: float | None = None,
        matmul_precision: str = DEFAULT_MATMUL_PRECISION,
        **load_options: Any,
    ) -> None:
        super().__init__()
        if matmul_precision not in MATMUL_PRECISIONS:
            raise ValueError(
                f"matmul_precision={matmul_precision!r}: use one of {', '.join(MATMUL_PRECISIONS)}"
            )
        self.matmul_precision = matmul_precision
        if not skin_A >= 0:
            raise ValueError(f"skin_A must be a length >= 0 in Å, got {skin_A}")
        self.loaded = _loaded_model(model, head, device, dtype, backend, load_options)
        self.long_range = is_long_range(self.loaded.module)
        if not self.long_range and (charge is not None or spin is not None):
            raise ValueError(
                f"charge= and spin= are read by long-range models (MACE-POLAR-1) only; "
                f"{self.loaded.name} is a {self.loaded.description.model_type}, whose energy "
                "does not depend on them"
            )
        self.charge = DEFAULT_CHARGE if charge is None else float(charge)
        self.spin = DEFAULT_SPIN_MULTIPLICITY if spin is None else float(spin)
        if not self.spin >= 1:
            raise ValueError(f"spin is the multiplicity 2S + 1 (1 or more), got {spin}")
        self.skin_A = float(skin_A)
        self.model_species = tuple(int(z) for z in self.loaded.module.atomic_numbers)
        self.dispersion_functional = model_dispersion_functional(
            dispersion, dispersion_functional, self.loaded, []
        )
        self.three_body = dispersion == "d3bj-atm"
        self._potential: Potential | None = None
        self._d3: D3BJ | None = None
        self._lists: dict[str, _Neighbours] = {}  # "model", and "d3" with dispersion

    @property
    def neighbour_list(self) -> NeighbourList | None:
        """The neighbour list kept from the last call (None before the first), for inspection."""
        kept = self._lists.get("model")
        return None if kept is None else kept.neighbours

    def calculate(
        self,
        atoms: ase.Atoms | None = None,
        properties: list[str] | None = None,
        system_changes: list[str] = all_changes,
    ) -> None:
        """Energy, forces and (fully periodic cells only) stress of ``atoms``, into results."""
        super().calculate(atoms, properties, system_changes)
        atoms = self.atoms
        # Refuse unknown elements, overlapping atoms and NaN positions with a clear message
        # before anything reaches the model.
        check_structures([atoms], self.model_species)
        state = State.from_atoms(atoms, device=self.loaded.device)
        potential = self._potential_for(atoms)
        edges = self._edges_for("model", atoms, state, potential.r_max)
        periodic = bool(np.all(atoms.pbc))
        charge, spin = self.charge_and_spin(atoms)
        output = potential(state, edges, compute_stress=periodic, charge=charge, spin=spin)
        energy, forces, stress = output.energy, output.forces, output.stress
        if self.dispersion_functional is not None:  # D3(BJ) on its own list, as in MD
            d3 = self._d3_for(atoms)
            d3_edges = self._edges_for("d3", atoms, state, d3.cutoff)
            if d3.three_body:  # host-side here: a calculator call is not captured
                d3.size_triples(d3_edges)
            extra = d3(state, d3_edges, periodic)
            energy, forces = energy + extra.energy, forces + extra.forces
            stress = None if stress is None else stress + extra.stress
        self.results = {
            "energy": float(energy[0]),
            "free_energy": float(energy[0]),
            "forces": forces.detach().to("cpu").numpy().copy(),
        }
        # Stress is defined for a fully periodic cell only; elsewhere ASE's get_stress raises
        # PropertyNotImplementedError, as for other molecular calculators.
        if periodic and stress is not None:
            self.results["stress"] = full_3x3_to_voigt_6_stress(
                stress[0].detach().to("cpu").numpy()
            )

    def charge_and_spin(self, atoms: ase.Atoms) -> tuple[float, float]:
        """Total charge and spin multiplicity of ``atoms``: its ``info``, else the calculator's."""
        charge = float(atoms.info.get("charge", self.charge))
        spin = float(atoms.info.get("spin", self.spin))
        if not spin >= 1:
            raise ValueError(
                f'atoms.info["spin"] is the spin multiplicity 2S + 1 (1 or more), got {spin}'
            )
        return charge, spin

    def check_state(self, atoms: ase.Atoms, tol: float = 1e-15) -> list[str]:
        """ASE's changes, plus "charge" when a long-range model's charge or spin changed
        (ASE compares no ``info``, so a new charge alone would return the old results)."""
        changes = super().check_state(atoms, tol)
        known = self.long_range and self.atoms is not None and not changes
        if known and self.charge_and_spin(atoms) != self.charge_and_spin(self.atoms):
            changes.append("charge")
        return changes

    def _potential_for(self, atoms: ase.Atoms) -> Potential:
        """The potential for these elements; made again only when the elements change."""
        species = set(atoms.get_atomic_numbers().tolist())
        if self._potential is None or not species <= set(self._potential.species):
            # The calculator's own settings: the loaded model as it is, uncompiled, no tables
            # (the planner's CPU rules), edge chunks as the memory requires on CUDA.
            own = EngineSettings(
                device=self.loaded.device,
                backend=self.loaded.backend,
                matmul_precision=self.matmul_precision,
            )
            self._potential = assembly.potential(self.loaded, sorted(species), own)
        return self._potential

    def _d3_for(self, atoms: ase.Atoms) -> D3BJ:
        """D3(BJ) for these elements; made again only when the elements change."""
        species = set(atoms.get_atomic_numbers().tolist())
        if self._d3 is None or not species <= set(self._d3.species):
            assert self.dispersion_functional is not None
            parameters = D3BJParameters.for_functional(self.dispersion_functional)
            self._d3 = D3BJ(parameters, sorted(species), three_body=self.three_body,
                            device=self.loaded.device)  # fmt: skip
        return self._d3

    def _edges_for(self, name: str, atoms: ase.Atoms, state: State, cutoff: float) -> Edges:
        """Edges for ``state`` from list ``name``, kept while it still fits the atoms."""
        key = (tuple(atoms.get_atomic_numbers().tolist()), tuple(bool(p) for p in atoms.pbc))
        kept = self._lists.get(name)
        if kept is None or kept.key != key:
            # Other atoms or periodicity: plan a list for this structure.
            neighbours = NeighbourList(state, cutoff, self.skin_A)
            kept = _Neighbours(key, neighbours, neighbours.build(state))
        elif bool(kept.neighbours.needs_rebuild(state)):
            # Searched into the existing buffers on the existing plan; skipped altogether
            # while the skin still covers every move (never, without a skin).
            kept.edges = kept.neighbours.update(state, kept.edges)
        if overflowed(kept.edges):
            # The atoms or the cell outgrew the plan: plan again with larger capacities.
            kept = _Neighbours(key, *regrow(kept.neighbours, state))
        self._lists[name] = kept
        return kept.edges


def calculator(model: LoadedModel | str | os.PathLike[str], **options: Any) -> FastMACECalculator:
    """An ASE calculator for ``model``: ``atoms.calc = fm.calculator("demo-emt-cu")``.

    ``options`` are those of :class:`FastMACECalculator` (``head``, ``device``, ``dtype``,
    ``backend``, ``skin_A``, ``dispersion``, ``dispersion_functional``, ``charge``, ``spin``
    and ``fm.load``'s own). MACE-POLAR-1 runs here:
    ``fm.calculator("polar-1", device="cuda")``, with ``atoms.info["charge"]`` and
    ``atoms.info["spin"]`` (multiplicity) for charged and open-shell structures.
    """
    return FastMACECalculator(model, **options)


def _loaded_model(
    model: LoadedModel | str | os.PathLike[str],
    head: str | None,
    device: str | None,
    dtype: str | torch.dtype | None,
    backend: str,
    load_options: dict[str, Any],
) -> LoadedModel:
    """``model`` if it is loaded already (refusing options that contradict it), else loaded."""
    if not isinstance(model, LoadedModel):
        return load(
            model,
            head=head,
            device=device or "cpu",
            dtype=dtype,
            backend=backend,
            **load_options,
        )
    conflicts = [f"{name}={value!r}" for name, value in load_options.items()]
    if head is not None and head != model.head:
        conflicts.append(f"head={head!r}")
    if device is not None and torch.device(device) != torch.device(model.device):
        conflicts.append(f"device={device!r}")
    if dtype is not None and str(dtype).removeprefix("torch.") != model.dtype:
        conflicts.append(f"dtype={dtype!r}")
    if backend not in ("auto", model.backend):
        conflicts.append(f"backend={backend!r}")
    if conflicts:
        raise ValueError(
            f"{', '.join(conflicts)} cannot apply to a model that is already loaded "
            f"({model.summary()}): pass them to fm.load, or pass the model's name here"
        )
    return model
