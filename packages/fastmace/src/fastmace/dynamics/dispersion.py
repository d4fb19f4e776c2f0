"""D3(BJ) dispersion: Grimme's DFT-D3 with Becke-Johnson damping on a fixed-capacity pair list.

:class:`D3BJ` turns a State and the Edges of a neighbour list planned with the dispersion's
cutoff (every pair within it, both directions, as `NeighbourList` gives them) into energies
per system, forces and stresses, like `Potential`. The two-body term only: coordination numbers
from D3's counting function, C6 from the reference table by Gaussian weighting in CN, C8 from
C6 and the <r4>/<r2> ratios, rational (BJ) damping with the functional's s6, a1, s8, a2.

Reference data are read at run time from torch-dftd's data file (the package mace-torch's
``mace_mp(dispersion=True)`` uses) and its parameter table; nothing is typed in here. Units
inside are the dftd3 program's (bohr, hartree) with its conversion factors, so the numbers are
torch-dftd's. Forces and stress come from one backward pass over positions and a symmetric
strain, as in potential.py. No host synchronisation and fixed shapes: safe to capture.
Evaluation of the libraries and the checks: docs/validation/dispersion.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

import ase.units
import numpy as np
import torch

from fastmace.dynamics.edges import Edges, per_system_matmul, systems_of, systems_of_atoms
from fastmace.dynamics.neighbours import NeighbourList
from fastmace.dynamics.potential import PotentialOutput, _cell_volume, _strained
from fastmace.dynamics.state import POSITION_DTYPE, State

if TYPE_CHECKING:
    from fastmace.models.load import LoadedModel
    from fastmace.runs import RunSettings

# The dftd3 program's conversion factors (torch-dftd keeps them too): its tables are fitted
# in these units, so using them reproduces its numbers to the last digits.
BOHR_A = 0.52917726
HARTREE_EV = 27.21138505
COUNTING_STEEPNESS = 16.0  # k1 of D3's counting function
WEIGHT_STEEPNESS = 4.0  # -k3: the Gaussian weighting of reference coordination numbers
# mace-torch's mace_mp(dispersion=True) defaults: dispersion_cutoff 40 bohr (ASE's bohr), and
# torch-dftd's coordination-number cutoff cnthr, 40 bohr, which mace-torch leaves as it is.
DEFAULT_CUTOFF_A = 40.0 * ase.units.Bohr
DEFAULT_CN_CUTOFF_A = 40.0 * ase.units.Bohr
MAX_ATOMIC_NUMBER = 94  # the reference table covers H to Pu


class DispersionError(ValueError):
    """A dispersion setting or structure that D3(BJ) cannot serve; the message says why."""


@dataclass(frozen=True)
class D3BJParameters:
    """The rational-damping parameters of one functional (dimensionless, a2 in bohr)."""

    functional: str
    s6: float
    a1: float
    s8: float
    a2: float

    @classmethod
    def for_functional(cls, functional: str) -> D3BJParameters:
        """The published D3(BJ) parameters of ``functional`` (torch-dftd's names: "pbe", ...)."""
        _require_torch_dftd()
        from torch_dftd.dftd3_xc_params import get_dftd3_default_params

        name = functional.lower()
        try:
            values = get_dftd3_default_params("bj", name)
        except ValueError:
            raise DispersionError(
                f"no D3(BJ) parameters for the functional {functional!r} in torch-dftd's "
                "table; give a functional it knows (pbe, r2scan, pbesol, b3-lyp, ...)"
            ) from None
        return cls(name, values["s6"], values["rs6"], values["s18"], values["rs18"])


def _require_torch_dftd() -> None:
    """Raise DispersionError, saying what to install, when torch-dftd is missing."""
    from importlib.util import find_spec

    if find_spec("torch_dftd") is None:
        raise DispersionError(
            "D3 dispersion reads its reference data from torch-dftd, which is not installed: "
            "pip install 'fastmace[d3]'"
        )


@cache
def _reference_arrays() -> dict[str, np.ndarray]:
    """torch-dftd's D3 reference data: per-element reference C6 tables, CNs, radii, r2r4.

    The file's place inside the package is torch-dftd 0.5.3's (the `d3` extra's range).
    """
    from importlib import resources

    _require_torch_dftd()
    path = resources.files("torch_dftd").joinpath("nn/params/dftd3_params.npz")
    with resources.as_file(path) as file, np.load(file) as data:
        c6ab = np.array(data["c6ab"])  # (95, 95, 5, 5, 3): C6, CN of A's reference, CN of B's
        rcov = np.array(data["rcov"])  # covalent radii in bohr, D3's k2 = 4/3 already applied
        r2r4 = np.array(data["r2r4"])
    present = c6ab[..., 0] > 0
    # Each element's references exist (and have their CN) whatever the partner: the pair
    # weights D3 uses then factor into one weight vector per atom (checked, not assumed).
    refs = present.any(axis=(1, 3))
    if not np.array_equal(present, refs[:, None, :, None] & refs[None, :, None, :]):
        raise RuntimeError("torch-dftd's D3 reference table no longer factors per element")
    cn = np.where(present, c6ab[..., 1], -np.inf).max(axis=(1, 3))
    return {
        "c6": c6ab[..., 0],
        "cn": np.where(refs, cn, 0.0),
        "present": refs,
        "rcov": rcov,
        "r2r4": r2r4,
    }


def check_species(species: Iterable[int]) -> None:
    """Raise DispersionError for elements outside D3's reference table; host-side."""
    outside = sorted({int(z) for z in species if not 1 <= int(z) <= MAX_ATOMIC_NUMBER})
    if outside:
        raise DispersionError(
            f"D3 has no reference data for atomic numbers {outside} (it covers 1 to "
            f"{MAX_ATOMIC_NUMBER}); run without dispersion"
        )


class D3BJ(torch.nn.Module):
    """The D3(BJ) two-body dispersion energy of a batch, with forces and stress.

    Args:
        parameters: the functional's damping parameters (`D3BJParameters.for_functional`).
        species: the atomic numbers the run will use (H to Pu).
        cutoff: pair cutoff in Å (default mace-torch's, 40 bohr).
        cn_cutoff: coordination-number cutoff in Å (default torch-dftd's, 40 bohr); at most
            ``cutoff``, since it is evaluated on the same pairs.
        three_body: the Axilrod-Teller-Muto term; not implemented yet (mace-torch's default
            leaves it off too).
        device: where the reference tables live (the state's device).

    The edges must hold every pair within ``cutoff`` in both directions; longer pairs and
    padding slots contribute exactly zero.
    """

    def __init__(
        self,
        parameters: D3BJParameters,
        species: Iterable[int],
        *,
        cutoff: float = DEFAULT_CUTOFF_A,
        cn_cutoff: float = DEFAULT_CN_CUTOFF_A,
        three_body: bool = False,
        device: torch.device | str = "cpu",
    ) -> None:
        super().__init__()
        if three_body:
            raise DispersionError(
                "the D3 three-body (ATM) term is not implemented yet; run with "
                "three_body=False (mace-torch's mace_mp(dispersion=True) default)"
            )
        if not 0 < cn_cutoff <= cutoff:
            raise DispersionError(
                f"need 0 < cn_cutoff <= cutoff, got cn_cutoff={cn_cutoff}, cutoff={cutoff}"
            )
        self.parameters = parameters
        self.cutoff = float(cutoff)
        self.cn_cutoff = float(cn_cutoff)
        self.species = tuple(sorted({int(z) for z in species}))
        self.check_species(self.species)
        arrays = _reference_arrays()
        run = list(self.species)

        def buffer(array: np.ndarray, dtype: torch.dtype = POSITION_DTYPE) -> torch.Tensor:
            return torch.as_tensor(np.ascontiguousarray(array), dtype=dtype, device=device)

        # Index of each element among the run's species (-1 elsewhere), and per element the
        # reference C6 towards each of the run's species: (95, k, 5, 5).
        slot = np.full(arrays["rcov"].shape[0], -1)
        slot[run] = np.arange(len(run))
        self.register_buffer("slot", buffer(slot, torch.int64))
        self.register_buffer("c6_towards", buffer(arrays["c6"][:, run]))
        self.register_buffer("cn_reference", buffer(arrays["cn"]))
        self.register_buffer("present", buffer(arrays["present"], torch.bool))
        self.register_buffer("rcov", buffer(arrays["rcov"]))
        self.register_buffer("r2r4", buffer(arrays["r2r4"]))

    def check_species(self, species: Iterable[int]) -> None:
        """Raise DispersionError for elements outside the reference table; host-side."""
        check_species(species)

    def forward(self, state: State, edges: Edges, compute_stress: bool = False) -> PotentialOutput:
        """Energy per system (eV), forces (eV/Å) and, with ``compute_stress``, virial and stress
        (ASE's sign, eV/Å³). No host synchronisation; not under ``torch.inference_mode``."""
        with torch.enable_grad():
            positions = state.positions.detach().clone().requires_grad_(True)
            displacement = None
            if compute_stress:
                moved, cell, displacement = _strained(
                    positions, state.cell, systems_of_atoms(state)
                )
            else:
                moved, cell = positions, state.cell
            energy = self._energy(state, edges, moved, cell)
            inputs = [positions] if displacement is None else [positions, displacement]
            gradients = torch.autograd.grad(
                [energy], inputs, grad_outputs=[torch.ones_like(energy)], materialize_grads=True
            )
        forces = -gradients[0]
        if displacement is None:
            return PotentialOutput(energy=energy.detach(), forces=forces)
        volume = _cell_volume(state.cell).view(-1, 1, 1)
        stress = torch.where(volume > 0, gradients[1] / volume, torch.zeros_like(volume))
        return PotentialOutput(
            energy=energy.detach(), forces=forces, virial=-gradients[1], stress=stress
        )

    def _energy(
        self, state: State, edges: Edges, positions: torch.Tensor, cell: torch.Tensor
    ) -> torch.Tensor:
        """(S,) energy in eV, differentiable with respect to ``positions`` and ``cell``."""
        p = self.parameters
        sender = torch.where(edges.mask, edges.edge_index[0], 0)
        receiver = torch.where(edges.mask, edges.edge_index[1], 0)
        unit_shifts = torch.where(edges.mask[:, None], edges.unit_shifts, 0.0)
        shifts = per_system_matmul(unit_shifts, cell, systems_of(state, sender))
        vectors = positions.index_select(0, receiver) - positions.index_select(0, sender)
        vectors = (vectors + shifts) / BOHR_A
        distance2 = (vectors * vectors).sum(dim=-1)
        real = edges.mask & (distance2 > 0)
        pair = real & (distance2 < (self.cutoff / BOHR_A) ** 2)
        counted = real & (distance2 <= (self.cn_cutoff / BOHR_A) ** 2)
        # Padding and self-pairs get a harmless distance: no NaN can reach a gradient.
        distance2 = torch.where(real, distance2, torch.ones_like(distance2))
        distance = distance2.sqrt()

        numbers = state.atomic_numbers
        z_sender, z_receiver = numbers.index_select(0, sender), numbers.index_select(0, receiver)
        covalent = self.rcov[z_sender] + self.rcov[z_receiver]
        count = torch.sigmoid(COUNTING_STEEPNESS * (covalent / distance - 1.0))
        cn = torch.zeros(state.n_atoms, dtype=distance.dtype, device=distance.device)
        cn = cn.index_add(0, sender, torch.where(counted, count, torch.zeros_like(count)))

        c6 = self._c6(numbers, cn, sender, receiver)
        ratio = 3.0 * self.r2r4[z_sender] * self.r2r4[z_receiver]  # C8 / C6
        radius = p.a1 * ratio.sqrt() + p.a2
        distance6 = distance2**3
        damped = p.s6 / (distance6 + radius**6) + p.s8 * ratio / (distance6 * distance2 + radius**8)
        # Each pair is in the list twice (both directions): half of it per edge.
        per_edge = torch.where(pair, -0.5 * HARTREE_EV * c6 * damped, torch.zeros_like(c6))
        # Summed per atom, then per system: millions of atomic adds onto one address (a
        # system's energy) would queue behind each other on a GPU.
        per_atom = torch.zeros(state.n_atoms, dtype=per_edge.dtype, device=per_edge.device)
        per_atom = per_atom.index_add(0, sender, per_edge)
        energy = torch.zeros(state.n_systems, dtype=per_edge.dtype, device=per_edge.device)
        return energy.index_add(0, state.system, per_atom)

    def _c6(
        self, numbers: torch.Tensor, cn: torch.Tensor, sender: torch.Tensor, receiver: torch.Tensor
    ) -> torch.Tensor:
        """(E,) C6 in hartree bohr^6: D3's Gaussian-weighted mean of the reference C6 values.

        The weight of a reference pair is the product of one weight per atom, so the mean is
        w_sender . C6ref . w_receiver; per atom, C6ref . w towards each of the run's species is
        formed once, and each edge gathers two vectors of five instead of a 5x5 table.
        """
        gap = cn[:, None] - self.cn_reference[numbers]
        logits = (-WEIGHT_STEEPNESS * gap * gap).masked_fill(~self.present[numbers], -torch.inf)
        weights = torch.softmax(logits, dim=-1)  # (N, 5)
        # (N, k, 5): sum over the atom's references a of w[a] C6ref[Z, species, a, b].
        towards = torch.einsum("na,nkab->nkb", weights, self.c6_towards[numbers])
        partner = self.slot[numbers.index_select(0, receiver)]
        # One flat gather: index_select's backward is an atomic index_add, where advanced
        # indexing (towards[sender, partner]) is differentiated by a sort over all E edges.
        species = towards.shape[1]
        row = towards.reshape(-1, towards.shape[2]).index_select(0, sender * species + partner)
        return (row * weights.index_select(0, receiver)).sum(dim=-1)


class DispersionTerm:
    """D3(BJ) with a neighbour list of its own: the force field's extra energy term.

    Its list (cutoff 40 bohr, far beyond the model's) is kept valid with the same skin and
    search pattern as the model's (`ForceField`), and regrown the same way on overflow.
    """

    def __init__(self, d3: D3BJ, neighbours: NeighbourList, edges: Edges) -> None:
        self.d3 = d3
        self.neighbours = neighbours
        self.edges = edges

    @classmethod
    def for_state(cls, state: State, functional: str, skin: float) -> DispersionTerm:
        """The term for ``state``'s elements and ``functional``, its list planned and built."""
        d3 = D3BJ(
            D3BJParameters.for_functional(functional),
            state.atomic_numbers.tolist(),
            device=state.device,
        )
        neighbours = NeighbourList(state, d3.cutoff, skin)
        return cls(d3, neighbours, neighbours.build(state))

    def record(self) -> dict[str, object]:
        """What metadata.json and the report say of it."""
        p = self.d3.parameters
        return {
            "method": "d3bj",
            "functional": p.functional,
            "parameters": {"s6": p.s6, "a1": p.a1, "s8": p.s8, "a2": p.a2},
            "cutoff_A": self.d3.cutoff,
            "cn_cutoff_A": self.d3.cn_cutoff,
            "three_body": False,
            "edge_capacity": self.neighbours.capacity,
            "reference": "torch-dftd's D3 tables and parameters",
        }


def dispersion_functional(
    dispersion: str | None, explicit: str | None, d3_functional: str | None, model: str
) -> str | None:
    """The D3(BJ) parameter set a run uses: ``explicit`` (``dispersion_functional``) if given,
    else the model head's (the label table's ``d3_functional``); None without dispersion.

    Raises DispersionError for an unknown method, or a model whose functional is not known.
    """
    if dispersion is None:
        if explicit is not None:
            raise DispersionError("dispersion_functional needs dispersion='d3bj'")
        return None
    if dispersion != "d3bj":
        raise DispersionError(f"unknown dispersion {dispersion!r}; the one there is: 'd3bj'")
    functional = explicit or d3_functional
    if functional is None:
        raise DispersionError(
            f"the model {model} has no known D3(BJ) functional (the label table has none for "
            "its head: it was not trained on a DFT functional that D3 corrects, or its "
            "reference already contains dispersion); give dispersion_functional='pbe' (or "
            "another) if you know what you are doing"
        )
    D3BJParameters.for_functional(functional)  # refuses unknown names now, not mid-run
    return functional.lower()


def run_dispersion_functional(
    settings: RunSettings, model: LoadedModel, structures: Sequence[ase.Atoms]
) -> str | None:
    """The functional of a run's dispersion (None: no dispersion), checked against the model
    and the structures' elements; host-side, before anything is created."""
    return model_dispersion_functional(
        settings.dispersion, settings.dispersion_functional, model, structures
    )


def model_dispersion_functional(
    dispersion: str | None,
    explicit: str | None,
    model: LoadedModel,
    structures: Sequence[ase.Atoms],
) -> str | None:
    """:func:`dispersion_functional` for ``model``'s head, with the structures' elements
    checked against D3's tables: what MD and relaxation both ask before they build anything."""
    head = model.checkpoint.head(model.head) if model.checkpoint is not None else None
    functional = dispersion_functional(
        dispersion, explicit, head.d3_functional if head is not None else None, model.name
    )
    if functional is not None:
        check_species(int(z) for atoms in structures for z in atoms.numbers)
    return functional
