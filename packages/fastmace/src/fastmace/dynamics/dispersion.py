"""D3(BJ) dispersion: Grimme's DFT-D3 with Becke-Johnson damping on a fixed-capacity pair list.

:class:`D3BJ` turns a State and the Edges of a neighbour list planned with the dispersion's
cutoff (every pair within it, both directions, as `NeighbourList` gives them) into energies
per system, forces and stresses, like `Potential`. The two-body term: coordination numbers
from D3's counting function, C6 from the reference table by Gaussian weighting in CN, C8 from
C6 and the <r4>/<r2> ratios, rational (BJ) damping with the functional's s6, a1, s8, a2; and
optionally the three-body (ATM) term, as torch-dftd computes it (dispersion_atm.py).

Reference data are read at run time from torch-dftd's data file (the package mace-torch's
``mace_mp(dispersion=True)`` uses) and its parameter table; nothing is typed in here. Units
inside are the dftd3 program's (bohr, hartree) with its conversion factors, so the numbers are
torch-dftd's. Forces and stress are written out in closed form (the derivative through the
coordination numbers included) and summed per atom over its run of the sender-sorted list,
without atomics. No host synchronisation and fixed shapes: safe to capture.
Evaluation of the libraries and the checks: docs/validation/dispersion.md.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

import ase.units
import numpy as np
import torch

from fastmace.dynamics import dispersion_atm as atm
from fastmace.dynamics.edges import Edges, per_system_matmul, systems_of
from fastmace.dynamics.neighbours import NeighbourList
from fastmace.dynamics.potential import _cell_volume
from fastmace.dynamics.state import POSITION_DTYPE, PotentialOutput, State

if TYPE_CHECKING:
    from fastmace.models.load import LoadedModel

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
# D3's list is long (21 Å): its search costs several times the model's. It keeps a skin of at
# least this many Å and is searched this many times less often than the model's list (at
# least once per block); the 2 Å skin adds about 22 % more pairs at the default cutoff.
DISPERSION_SKIN_A = 2.0
DISPERSION_SEARCH_FACTOR = 4
KERNELS = ("torch", "triton")
# The user-facing methods: the two-body term, and with the three-body (ATM) term.
METHODS = ("d3bj", "d3bj-atm")
# Above this many pairs of edges per evaluation the three-body term warns that it is slow:
# ATM_MEASURED is what a periodic solid at the default cutoffs cost (dispersion.md).
ATM_SLOW_PAIRS = 20_000_000
ATM_MEASURED = (
    "32 Cu atoms in a periodic cell (2.3e8 pairs) took 511 s per evaluation on a 2-core CPU"
)
# The fused kernels are used only within this relative difference of the torch version on the
# run's first state (float64 rounding: 1e-13 to 1e-16 was measured on the CPU interpreter).
FUSED_TOLERANCE = 1e-10
# Each quantity's difference is taken relative to its largest entry plus these floors (eV,
# eV/Å, eV/Å^3): in a perfect crystal the forces cancel to rounding noise (1e-17 eV/Å), and
# noise relative to noise is of order one whichever kernel is right.
AGREEMENT_FLOORS = {"energy": 1e-3, "forces": 1e-3, "stress": 1e-5}


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
    alp: float = 14.0  # the three-body term's zero damping uses alp + 2

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
        return cls(name, values["s6"], values["rs6"], values["s18"], values["rs18"], values["alp"])


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
        r0ab = np.array(data["r0ab"])  # (95, 95) pairwise R0 in bohr: the three-body damping
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
        "r0ab": r0ab,
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
        three_body: add the Axilrod-Teller-Muto term over triples whose sides are all within
            ``cn_cutoff`` (torch-dftd's ``abc=True``; mace-torch's default leaves it off). Its
            evaluation needs :meth:`size_triples` called on the list first (host-side).
        device: where the reference tables live (the state's device).
        kernel: "torch" (passes over the pair list in torch, any device) or "triton" (three
            fused kernels, one program per atom: dispersion_triton.py; CUDA, or Triton's
            interpreter). The same numbers either way.

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
        kernel: str = "torch",
    ) -> None:
        super().__init__()
        if kernel not in KERNELS:
            raise DispersionError(f"kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
        self.kernel = kernel
        self.three_body = bool(three_body)
        if self.three_body and kernel == "triton":
            raise DispersionError(
                "the fused Triton kernels have the two-body term only; use kernel='torch' "
                "with three_body=True"
            )
        self.slots: int | None = None  # per-atom edge slots of the three-body term
        self._warned_slow = False
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
        self.register_buffer("r0ab", buffer(arrays["r0ab"]))
        self.register_buffer("r0_towards", buffer(arrays["r0ab"][:, run]))  # (95, k)

    def size_triples(self, edges: Edges) -> None:
        """Size the three-body term's per-atom slots for ``edges`` (host-side: reads the
        longest run back; call when the list is built or regrown, never in a capture).

        Warns, once, when an evaluation would examine more than ``ATM_SLOW_PAIRS`` pairs of
        edges: a periodic solid at the default cutoffs, where one evaluation takes minutes.
        """
        self.slots = atm.slots_for(edges.edge_index[0], edges.mask)
        examined = int(edges.mask.sum()) * self.slots // 2
        if examined > ATM_SLOW_PAIRS and not self._warned_slow:
            self._warned_slow = True
            warnings.warn(
                f"D3's three-body term will examine about {examined:.1e} pairs of edges per "
                f"evaluation ({self.slots} slots per atom within {self.cn_cutoff:.1f} Å): "
                f"{ATM_MEASURED}. For a periodic solid use dispersion='d3bj' (two-body only) "
                "(docs/validation/dispersion.md)",
                RuntimeWarning,
                stacklevel=2,
            )

    def check_species(self, species: Iterable[int]) -> None:
        """Raise DispersionError for elements outside the reference table; host-side."""
        check_species(species)

    def forward(self, state: State, edges: Edges, compute_stress: bool = False) -> PotentialOutput:
        """Energy per system (eV), forces (eV/Å) and, with ``compute_stress``, virial and stress
        (ASE's sign, eV/Å³). No host synchronisation; any grad mode.

        The edges must be sorted by sender, as `NeighbourList` gives them (padding last);
        if they are not, every result is NaN (a guard stops the run) rather than wrong.
        """
        with torch.no_grad():
            if self.kernel == "triton" and not self.three_body:  # two-body kernels only
                return self._evaluate_fused(state, edges, compute_stress)
            return self._evaluate(state, edges, compute_stress)

    def _evaluate(self, state: State, edges: Edges, compute_stress: bool) -> PotentialOutput:
        """The energy and its derivatives in closed form, summed per atom over each sender's
        contiguous run of edges: no atomic adds onto shared addresses, which on a GPU queue
        behind each other (about 2,400 pairs per atom at this cutoff).

        Each pair is in the list twice and the two edges have the same length, so everything
        a pair contributes to an atom is found among that atom's own (sender) edges: the
        coordination-number derivative of the receiver's side mirrors the sender's.
        """
        p = self.parameters
        n_atoms, device = state.n_atoms, state.positions.device
        mask = edges.mask
        sender = torch.where(mask, edges.edge_index[0], 0)
        receiver = torch.where(mask, edges.edge_index[1], 0)
        key = torch.where(mask, edges.edge_index[0], n_atoms)  # padding after every atom
        ordered = (key[1:] >= key[:-1]).all()
        bounds = torch.searchsorted(key, torch.arange(n_atoms + 1, device=device))

        unit_shifts = torch.where(mask[:, None], edges.unit_shifts, 0.0)
        shifts = per_system_matmul(unit_shifts, state.cell, systems_of(state, sender))
        positions = state.positions
        vectors = positions.index_select(0, receiver) - positions.index_select(0, sender)
        vectors = (vectors + shifts) / BOHR_A
        distance2 = (vectors * vectors).sum(dim=-1)
        real = mask & (distance2 > 0)
        pair = real & (distance2 < (self.cutoff / BOHR_A) ** 2)
        counted = real & (distance2 <= (self.cn_cutoff / BOHR_A) ** 2)
        # Padding and self-pairs get a harmless distance; their terms are masked to zero.
        distance2 = torch.where(real, distance2, torch.ones_like(distance2))
        distance = distance2.sqrt()
        zero = torch.zeros_like(distance)

        numbers = state.atomic_numbers
        z_sender, z_receiver = numbers.index_select(0, sender), numbers.index_select(0, receiver)
        covalent = self.rcov[z_sender] + self.rcov[z_receiver]
        count = torch.sigmoid(COUNTING_STEEPNESS * (covalent / distance - 1.0))
        cn = _segment_sums(torch.where(counted, count, zero), bounds)
        count_slope = COUNTING_STEEPNESS * count * (1.0 - count) * covalent / distance2
        count_slope = torch.where(counted, -count_slope, zero)  # d count / d r

        c6, c6_slope = self._c6(numbers, cn, sender, receiver)
        ratio = 3.0 * self.r2r4[z_sender] * self.r2r4[z_receiver]  # C8 / C6
        radius2 = (p.a1 * ratio.sqrt() + p.a2) ** 2
        distance6 = distance2**3
        six = distance6 + radius2**3
        eight = distance6 * distance2 + radius2**4
        damped = torch.where(pair, p.s6 / six + p.s8 * ratio / eight, zero)
        damped_slope = (
            6.0 * p.s6 * distance6 / six**2 + 8.0 * p.s8 * ratio * distance6 * distance2 / eight**2
        )
        damped_slope = torch.where(pair, -damped_slope / distance, zero)  # d damped / d r

        # Each pair is in the list twice (both directions): half of its energy per edge.
        atom_energy = _segment_sums(-0.5 * HARTREE_EV * c6 * damped, bounds)
        # dE/dCN of each atom: both edges of a pair depend on it alike, so twice its own half.
        cn_slope = _segment_sums(-HARTREE_EV * damped * c6_slope, bounds)
        triples = None
        if self.three_body:
            edge = atm.EdgeTerms(vectors, counted, receiver, c6, c6_slope,
                                 self.r0ab[z_sender, z_receiver])  # fmt: skip
            triples = self._three_body(state, edges, bounds, edge, cn)
            atom_energy = atom_energy + HARTREE_EV * triples.energy
            cn_slope = cn_slope + HARTREE_EV * triples.cn_slope
        energy = torch.zeros(state.n_systems, dtype=atom_energy.dtype, device=device)
        energy = energy.index_add(0, state.system, atom_energy)
        # dE/dr of each pair, directly and through both atoms' coordination numbers (eV/bohr).
        cn_sum = cn_slope.index_select(0, sender) + cn_slope.index_select(0, receiver)
        pair_slope = -HARTREE_EV * c6 * damped_slope + cn_sum * count_slope
        unit = vectors / distance[:, None]
        # A pair pulls the sender along the edge by dE/dr (eV/bohr, so / BOHR_A for eV/Å).
        forces = _segment_sums(pair_slope[:, None] * unit, bounds) / BOHR_A
        if triples is not None:
            forces = forces + (HARTREE_EV / BOHR_A) * triples.forces
        nan = torch.full_like(energy, torch.nan)
        energy = torch.where(ordered, energy, nan)
        forces = torch.where(ordered, forces, torch.nan)
        if not compute_stress:
            return PotentialOutput(energy=energy, forces=forces)
        # dE/dε = sum over pairs of dE/dr r r^T / r: half of it on each edge (eV).
        weighted = (0.5 * pair_slope / distance)[:, None] * vectors
        if state.n_systems == 1:
            strain_derivative = (weighted.T @ vectors).unsqueeze(0)
        else:  # per atom over its run of edges, then per system
            per_edge = (weighted[:, :, None] * vectors[:, None, :]).reshape(-1, 9)
            per_atom = _segment_sums(per_edge, bounds)
            strain_derivative = torch.zeros(
                state.n_systems, 9, dtype=energy.dtype, device=device
            ).index_add(0, state.system, per_atom)
        if triples is not None:
            strain_derivative = strain_derivative.view(-1, 9).index_add(
                0, state.system, HARTREE_EV * triples.strain
            )
        strain_derivative = strain_derivative.view(-1, 3, 3)
        strain_derivative = torch.where(ordered, strain_derivative, torch.nan)
        volume = _cell_volume(state.cell).view(-1, 1, 1)
        stress = torch.where(volume > 0, strain_derivative / volume, torch.zeros_like(volume))
        return PotentialOutput(
            energy=energy, forces=forces, virial=-strain_derivative, stress=stress
        )

    def _three_body(
        self, state: State, edges: Edges, bounds: torch.Tensor, edge: atm.EdgeTerms,
        cn: torch.Tensor,
    ) -> atm.AtomTerms:  # fmt: skip
        """The ATM term per atom (hartree, bohr) over each atom's run of edges. A run longer
        than the slots sets ``edges.overflow`` (the engine regrows the list and the slots)."""
        if self.slots is None:
            raise DispersionError("the three-body term needs D3BJ.size_triples(edges) first")
        numbers = state.atomic_numbers
        sender = torch.where(edges.mask, edges.edge_index[0], 0)
        table = atm.slot_table(bounds, sender, edges.mask, self.slots)
        edges.overflow.copy_(edges.overflow | ~table.fits)
        weights, _ = self._weights(numbers, cn)
        (towards,) = self._towards(numbers, weights)
        r0 = self.r0_towards[numbers]
        pair = atm.PairC6(towards.reshape(-1, towards.shape[-1]), r0.reshape(-1), weights,
                          self.slot, numbers)  # fmt: skip
        cutoff2 = (self.cn_cutoff / BOHR_A) ** 2
        return atm.three_body(table, edge, pair, cutoff2, self.parameters.alp + 2.0)

    def _c6(
        self, numbers: torch.Tensor, cn: torch.Tensor, sender: torch.Tensor, receiver: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(E,) C6 in hartree bohr^6, D3's Gaussian-weighted mean of the reference C6 values,
        and its derivative with respect to the sender's coordination number.

        The weight of a reference pair is the product of one weight per atom, so the mean is
        w_sender . C6ref . w_receiver; per atom, C6ref . w (and C6ref . dw/dCN) towards each
        of the run's species is formed once, and each edge gathers rows of five.
        """
        weights, weight_slope = self._weights(numbers, cn)
        species = self.c6_towards.shape[1]
        row = sender * species + self.slot[numbers.index_select(0, receiver)]
        partner = weights.index_select(0, receiver)
        values = []
        for towards in self._towards(numbers, weights, weight_slope):
            rows = towards.reshape(-1, towards.shape[2]).index_select(0, row)
            values.append((rows * partner).sum(dim=-1))
        return values[0], values[1]

    def _weights(self, numbers: torch.Tensor, cn: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(N, 5) Gaussian weights of each atom's reference coordination numbers, and their
        derivatives with respect to its coordination number."""
        gap = cn[:, None] - self.cn_reference[numbers]
        present = self.present[numbers]
        logits = (-WEIGHT_STEEPNESS * gap * gap).masked_fill(~present, -torch.inf)
        weights = torch.softmax(logits, dim=-1)
        logit_slope = torch.where(present, -2.0 * WEIGHT_STEEPNESS * gap, 0.0)
        mean_slope = (weights * logit_slope).sum(dim=-1, keepdim=True)
        return weights, weights * (logit_slope - mean_slope)  # d softmax / d CN

    def _towards(self, numbers: torch.Tensor, *per_atom: torch.Tensor) -> list[torch.Tensor]:
        """For each (N, 5) per-atom vector w: w . C6ref towards each species, (N, k, 5)."""
        table = self.c6_towards[numbers]
        return [torch.einsum("na,nkab->nkb", w, table) for w in per_atom]

    def _evaluate_fused(self, state: State, edges: Edges, compute_stress: bool) -> PotentialOutput:
        """The same numbers as :meth:`_evaluate` from three fused kernels over each atom's
        run of the sender-sorted list (dispersion_triton.py); per-atom work in torch."""
        from fastmace.dynamics import dispersion_triton as fused

        n_atoms, device = state.n_atoms, state.positions.device
        mask = edges.mask
        key = torch.where(mask, edges.edge_index[0], n_atoms)  # padding after every atom
        ordered = (key[1:] >= key[:-1]).all()
        bounds = torch.searchsorted(key, torch.arange(n_atoms + 1, device=device))
        receiver = edges.edge_index[1].contiguous()
        shifts = edges.unit_shifts.contiguous()
        units = (BOHR_A, HARTREE_EV, COUNTING_STEEPNESS)
        pairs = (self, state, receiver, shifts, bounds)
        cn = fused.coordination_numbers(*pairs, units)
        numbers = state.atomic_numbers
        weights, weight_slope = self._weights(numbers, cn)
        towards, towards_slope = (t.contiguous() for t in self._towards(numbers, weights,
                                                                        weight_slope))  # fmt: skip
        weights = weights.contiguous()
        atom_energy, cn_slope = fused.energies_and_cn_slopes(
            *pairs, towards, towards_slope, weights, units
        )
        forces, strain = fused.forces_and_strain(*pairs, towards, weights, cn_slope, units)
        energy = torch.zeros(state.n_systems, dtype=atom_energy.dtype, device=device)
        energy = torch.where(ordered, energy.index_add(0, state.system, atom_energy), torch.nan)
        forces = torch.where(ordered, forces, torch.nan)
        if not compute_stress:
            return PotentialOutput(energy=energy, forces=forces)
        strain_derivative = torch.zeros(
            state.n_systems, 9, dtype=energy.dtype, device=device
        ).index_add(0, state.system, strain)
        strain_derivative = torch.where(ordered, strain_derivative.view(-1, 3, 3), torch.nan)
        volume = _cell_volume(state.cell).view(-1, 1, 1)
        stress = torch.where(volume > 0, strain_derivative / volume, torch.zeros_like(volume))
        return PotentialOutput(
            energy=energy, forces=forces, virial=-strain_derivative, stress=stress
        )


def kernel_disagreement(want: PotentialOutput, got: PotentialOutput) -> float:
    """The largest difference between two evaluations' energy, forces and stress, each
    relative to the quantity's largest entry plus its floor (:data:`AGREEMENT_FLOORS`)."""
    return max(
        float((getattr(got, name) - getattr(want, name)).abs().max())
        / (float(getattr(want, name).abs().max()) + floor)
        for name, floor in AGREEMENT_FLOORS.items()
    )


def _segment_sums(values: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
    """Sums of ``values`` (E, ...) over the runs ``bounds[i]:bounds[i + 1]`` of sorted edges.

    A running sum and differences at the boundaries: no atomics. The rounding of a difference
    is relative to the running total, not to the run's own sum; in float64 that stays many
    orders below the issue's 1e-6 (docs/validation/dispersion.md).
    """
    # One scan of a contiguous vector per column: a cumsum along the first dimension of an
    # (E, 3) tensor would run as 3 sequential scans of E on a GPU (torch parallelises such a
    # scan over the other dimensions only).
    columns = values.reshape(values.shape[0], -1)
    running = torch.stack(
        [torch.cumsum(columns[:, c].contiguous(), dim=0) for c in range(columns.shape[1])], dim=1
    )
    running = torch.cat([running.new_zeros((1, running.shape[1])), running])
    sums = running.index_select(0, bounds[1:]) - running.index_select(0, bounds[:-1])
    return sums.view(bounds.shape[0] - 1, *values.shape[1:])


class DispersionTerm:
    """D3(BJ) with a neighbour list of its own: the force field's extra energy term.

    Its list (cutoff 40 bohr, far beyond the model's) has a wider skin
    (:data:`DISPERSION_SKIN_A`) and is searched :data:`DISPERSION_SEARCH_FACTOR` times less
    often than the model's, with the same skin check between searches (`ForceField`), and is
    regrown the same way on overflow.
    """

    def __init__(self, d3: D3BJ, neighbours: NeighbourList, edges: Edges) -> None:
        self.d3 = d3
        self.neighbours = neighbours
        self.edges = edges
        self.kernel_choice = f"{d3.kernel} (as constructed)"

    @classmethod
    def for_state(
        cls, state: State, functional: str, skin: float, three_body: bool = False
    ) -> DispersionTerm:
        """The term for ``state``'s elements and ``functional``, its list planned and built
        (and the three-body term's slots sized on it), and on CUDA its kernels chosen
        (:meth:`choose_kernel`)."""
        d3 = D3BJ(
            D3BJParameters.for_functional(functional),
            state.atomic_numbers.tolist(),
            three_body=three_body,
            device=state.device,
        )
        neighbours = NeighbourList(state, d3.cutoff, max(skin, DISPERSION_SKIN_A))
        term = cls(d3, neighbours, neighbours.build(state))
        term.size_triples()
        term.choose_kernel(state)
        return term

    def size_triples(self) -> None:
        """Size the three-body term's per-atom slots on the current edges (host-side: when
        the list is built or regrown, between blocks); nothing without the three-body term."""
        if self.d3.three_body:
            self.d3.size_triples(self.edges)

    def choose_kernel(self, state: State) -> str:
        """On CUDA, the fused Triton kernels if they give the torch version's energy, forces
        and stress on ``state`` (checked once, here, outside any capture); otherwise, and off
        CUDA, the torch version. Returns and keeps the choice with its reason."""
        self.d3.kernel = "torch"
        if self.d3.three_body:  # the fused kernels have the two-body term only
            self.kernel_choice = "torch (three-body term)"
            return self.kernel_choice
        if state.device.type != "cuda":
            self.kernel_choice = "torch (not on CUDA)"
            return self.kernel_choice
        try:
            want = self.d3(state, self.edges, compute_stress=True)
            self.d3.kernel = "triton"
            got = self.d3(state, self.edges, compute_stress=True)
            error = kernel_disagreement(want, got)
        except Exception as failure:  # a kernel that cannot compile or run: keep torch's
            self.d3.kernel = "torch"
            self.kernel_choice = f"torch (the Triton kernels failed: {type(failure).__name__})"
            return self.kernel_choice
        if not error <= FUSED_TOLERANCE:
            self.d3.kernel = "torch"
            self.kernel_choice = f"torch (the Triton kernels differ by {error:.1e})"
        else:
            self.kernel_choice = f"triton (within {error:.1e} of torch's on the first state)"
        return self.kernel_choice

    def record(self) -> dict[str, object]:
        """What metadata.json and the report say of it."""
        p = self.d3.parameters
        return {
            "method": "d3bj-atm" if self.d3.three_body else "d3bj",
            "functional": p.functional,
            "parameters": {"s6": p.s6, "a1": p.a1, "s8": p.s8, "a2": p.a2},
            "cutoff_A": self.d3.cutoff,
            "cn_cutoff_A": self.d3.cn_cutoff,
            "three_body": self.d3.three_body,
            "triple_slots": self.d3.slots,
            "skin_A": self.neighbours.skin,
            "search_factor": DISPERSION_SEARCH_FACTOR,
            "edge_capacity": self.neighbours.capacity,
            "kernel": self.kernel_choice,
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
    if dispersion not in METHODS:
        raise DispersionError(
            f"unknown dispersion {dispersion!r}; the ones there are: "
            + ", ".join(repr(method) for method in METHODS)
        )
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
