"""The potential: a converted MACE model evaluated on a batched State and fixed-capacity Edges.

:class:`Potential` turns (State, Edges) into the dictionary mace-torch's ``forward`` reads and
back into energies (float64, per system), forces (float64) and, when asked, virials and
stresses. It calls the model's own ``forward``, so every backend (e3nn, cueq, oeq, hybrid) runs
unchanged. Checked against mace-torch 0.3.16 (``mace/modules/models.py``, ``utils.py``).

Padding is exact by construction, whatever the model's radial functions: edges that are not
real (mask False), and real edges at or beyond ``r_max`` (a Verlet skin's extra pairs, which
mace-torch's own neighbour list would not have produced), are rerouted to extra *padding
nodes*. They belong to an extra dummy system, no edge connects them to a real atom, and their
energy is left out of every sum, so real atoms cannot see them: not in the energy, not in the
forces, not in the stress. Their edges are self-edges with a fixed vector of length ``2 r_max``,
so their spherical harmonics and radial basis stay finite (a zero-length edge would give NaN)
and mace's polynomial cutoff, exactly zero beyond ``r_max``, keeps their features small.

The padding edges are spread over one padding node per 128 atoms (dynamics/padding.py),
slot by slot in turn. The kernels sum messages into their receivers (and gradients into
their senders) with atomic adds, which one memory address takes one at a time: with a single
padding node, a million atoms' headroom (millions of padding edges, each adding a row of
thousands of numbers to that node's row) kept an H200 busy for minutes in one convolution.

Stress: the atoms' positions and the cells are strained by a symmetric per-system ε = 0 before
the edge vectors are formed (mace-torch's ``get_symmetric_displacement`` construction, done
here so the rerouted edges stay fixed). One backward pass gives dE/dr and dE/dε: forces -dE/dr,
virial -dE/dε, stress (1/V) dE/dε, as mace-torch and ASE report them.

The call never synchronises with the host and all shapes depend only on the number of atoms,
systems and the edge capacity, so it can be captured in a CUDA graph. Torch's default dtype is
the model's during the model call only (mace-torch takes some dtypes from it), then restored.
"""

from __future__ import annotations

import contextlib
import copy
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import ase
import numpy as np
import torch

from fastmace.charges import DEFAULT_CHARGE, DEFAULT_SPIN_MULTIPLICITY
from fastmace.dynamics.bf16_tier import bf16_model
from fastmace.dynamics.edge_chunks import (
    bytes_per_row,
    chunked_model,
    chunking_refusal,
    widest_row,
)
from fastmace.dynamics.edges import (
    Edges,
    per_system_matmul,
    systems_of_atoms,
    vectors_of_edges,
)
from fastmace.dynamics.fused_conv import ConvolutionError, fused_convolution_model
from fastmace.dynamics.fusion import fusible
from fastmace.dynamics.irreps_linear import IrrepsLinear
from fastmace.dynamics.module_copy import copy_modules_of, weight_sharing_copy
from fastmace.dynamics.overflow import available_memory_bytes
from fastmace.dynamics.padding import padding_nodes
from fastmace.dynamics.pair_radials import pair_shared_model
from fastmace.dynamics.pair_table import PairRadialTable, pair_tabulated_model
from fastmace.dynamics.polar import (
    LONG_RANGE_MODEL_TYPES,
    PerSystem,
    is_long_range,
    per_system_values,
    polar_graph,
)
from fastmace.dynamics.product_basis import ProductBasisError, product_basis_model
from fastmace.dynamics.radial_table import (
    RadialTable,
    TableError,
    TableReport,
    table_refusal,
    tabulated_model,
)
from fastmace.dynamics.scalar_activation import replace_activations
from fastmace.dynamics.species_linear import SpeciesLinear, specialise_for_species
from fastmace.dynamics.stacked_linear import stacked_model
from fastmace.dynamics.state import PotentialOutput, State
from fastmace.dynamics.table_conv import table_convolution_model
from fastmace.models.backends import precision_loosening, rounding_tolerances
from fastmace.models.checkpoint import contained, default_dtype, model_device, model_dtype
from fastmace.models.reference import check_structure
from fastmace.planner.edge_memory import EdgeChunking, edge_chunking
from fastmace.vocabulary import DEFAULT_MATMUL_PRECISION, MATMUL_PRECISIONS

if TYPE_CHECKING:
    from fastmace.dynamics.aot_potential import AotReport
    from fastmace.models.load import LoadedModel

ENERGY_DTYPE = torch.float64  # energies are summed and forces returned in float64
SUPPORTED_MODEL_TYPES = ("MACE", "ScaleShiftMACE", *LONG_RANGE_MODEL_TYPES)
_MAX_ATOMIC_NUMBER = 118
# The model inputs whose size is the number of edges, and the dimension that holds it.
EDGE_DIMENSIONS = (("edge_index", 1), ("shifts", 0), ("unit_shifts", 0))


class UnsupportedSpeciesError(ValueError):
    """The structure has elements the model was not trained on."""


class UnsupportedModelError(TypeError):
    """The model is not an energy model that Potential can drive."""


class PotentialCheckError(AssertionError):
    """A potential failed :func:`check_potential`; the message says which property."""


# Where a compiled potential is a package compiled ahead of time rather than torch.compile's
# (the validation scripts add "cuda" to measure that path). Not CUDA: side by side on an H100
# at 13,824 atoms the package started 5.5 s sooner warm but stepped 9 % slower and took twice
# as long cold (docs/validation/performance.md, 2026-12-06).
AHEAD_OF_TIME_DEVICES = ("cpu",)


class Potential(torch.nn.Module):
    """A converted MACE model (any backend) as a function of (State, Edges).

    The model runs in its own dtype: positions and cells are cast to it at the boundary, and
    energies and forces come back in float64. Multi-head models use ``head`` for every system.

    A ``PolarMACE`` (MACE-POLAR-1) runs eagerly only (dynamics/polar.py): its graph keeps the
    real edges alone, and graph-longrange and mace-torch read device values on the host inside
    its forward pass (docs/validation/polar.md#capture), so it cannot be captured in a CUDA
    graph; it is neither specialised nor compiled. Its energy is the model's total per system
    (local, electrostatic and electron energy), for the ``charge`` and ``spin`` given to
    ``forward``.

    Args:
        model: a mace-torch ``MACE``, ``ScaleShiftMACE`` or ``PolarMACE`` on any backend,
            device and dtype.
        species: the atomic numbers the run will use; every one must be in the model. The
            potential runs a copy of the model specialised to them (dynamics/species_linear.py),
            which gives NaN for atoms of other elements; ``model`` itself is not changed.
        head: the head's name; may be left out for a model with one head.
        compile: run the model's forward through ``torch.compile`` (Inductor). The number of
            edges is a symbolic size, so a regrown neighbour list is not compiled again.
            Compilation happens at the first call, and its caches live in the cache root
            (docs/environment.md).
        compile_fallback: when compilation fails, warn, record why in ``compile_failure`` and
            run the model uncompiled from then on, instead of raising
            :class:`ModelCompileError` (for compilation the planner chose, not the user).
        matmul_precision: "float32" (default): the model's GEMMs run in float32, and results
            are within float32 rounding of the float64 reference; "tf32": on CUDA, its GEMMs
            (the radial MLPs and linear layers) run on TF32 tensor cores, faster and with
            looser numbers (docs/md.md states the tolerance the gate holds them to). Only the
            model call is affected: torch's TF32 switch is set for it and put back after.
            "bf16": the model's equivariant linear layers and skip connections run as GEMMs
            with BF16 inputs and float32 sums (dynamics/bf16_tier.py; BF16 tensor cores on
            CUDA, the same numbers computed in float32 on the CPU); everything else, the
            radial MLPs and tensor products included, stays float32. Float32 short-range
            models only; ``bf16_layers`` lists the layers it changed.
        radial_table: read each interaction block's radial weights from a table of the
            distance instead of running its radial MLP (dynamics/radial_table.py); raises
            ``TableError`` for a model whose blocks do not allow it. ``table_report`` says
            how the tables came out.
        radial_table_fallback: when the tables cannot be built to their tolerance, warn,
            record why in ``table_failure`` and run the radial MLPs instead of raising (for
            tables the planner chose, not the user).
        fused_convolution: each interaction block's convolution runs as FastMACE's own
            kernel (dynamics/fused_conv.py) instead of the backend's, each block checked
            against its own convolution as it will run (the kernels, on CUDA); raises
            ``ConvolutionError`` for a block it does not compute (it needs a cuEquivariance
            model, whose features' layout is the kernel's) or that fails the check. Under
            evaluation: the planner does not choose it yet (docs/design/convolution.md).
        fused_convolution_fallback: when the convolution cannot be built or fails its check,
            warn, record why in ``fused_convolution_failure`` and keep the block's own
            convolution instead of raising. ``fused_convolution_used`` says which runs.
        product_basis: each product block's symmetric contraction runs as FastMACE's own
            kernel (dynamics/product_basis.py) instead of cuEquivariance's, with coefficients
            for the run's elements, each block checked against cuEquivariance's module as it
            will run (its kernels, on CUDA); raises ``ProductBasisError`` for a block it does
            not compute (a model on another backend) or that fails the check. Slower than
            cuEquivariance's so far: the planner does not choose it
            (docs/design/product-basis.md).
        product_basis_fallback: when the product basis cannot be built or fails its check,
            warn, record why in ``product_basis_failure`` and keep cuEquivariance's
            contraction instead of raising. ``product_basis_used`` says which runs.
        edge_chunk_rows: when the edges (or, with mirrored edges, the pairs) outnumber it,
            each interaction block works through them this many at a time
            (dynamics/edge_chunks.py), so that memory grows with the atoms and not with a full
            set of per-edge intermediates; the backward pass evaluates each chunk again. None
            (default): never; a number: that many (raises ``ChunkingError`` for a model whose
            blocks cannot be chunked; not with ``compile``); "auto": on CUDA, as many as fit
            in a share of the memory free now (fastmace.planner.edge_memory), for a model
            that can be chunked, and an evaluation that needs chunks runs uncompiled.
            ``edge_chunking`` says what was chosen and why.
        stack_linears: a local model's cuEquivariance linear layers run as one batched GEMM
            per shape of their matrices instead of one GEMM per path (dynamics/
            stacked_linear.py: the same products in another order, fewer launches; each
            layer checked when replaced); not with ``matmul_precision="bf16"``, whose layers
            are BF16's. None (default): with ``compile``, as the path the planner compiles
            is launch-bound at small sizes. ``stacked_layers`` lists the layers replaced,
            ``stacked_refused`` those kept because their stacked map failed its check (why).

    ``first_compiled_call_s`` holds the seconds of the first compiled call (its compilation
    included) once it has run: what the next plan for this model expects compilation to cost.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        species: Iterable[int] | torch.Tensor,
        head: str | None = None,
        *,
        compile: bool = False,
        compile_fallback: bool = False,
        matmul_precision: str = DEFAULT_MATMUL_PRECISION,
        radial_table: bool = False,
        radial_table_fallback: bool = False,
        fused_convolution: bool = False,
        fused_convolution_fallback: bool = False,
        product_basis: bool = False,
        product_basis_fallback: bool = False,
        edge_chunk_rows: int | str | None = None,
        stack_linears: bool | None = None,
    ) -> None:
        super().__init__()
        _check_model(model)
        if matmul_precision not in MATMUL_PRECISIONS:
            raise ValueError(
                f"unknown matmul_precision {matmul_precision!r}; choose one of "
                f"{', '.join(MATMUL_PRECISIONS)}"
            )
        self.matmul_precision = matmul_precision
        if matmul_precision == "bf16" and model_dtype(model) != torch.float32:
            raise ValueError(
                f"matmul_precision='bf16' runs float32 models, not {model_dtype(model)}: load "
                "the model in float32 or leave matmul_precision at 'float32'"
            )
        self.bf16_layers: list[str] = []  # the layers whose GEMMs run in BF16
        # cuEquivariance linear layers run as batched GEMMs (dynamics/stacked_linear.py)
        self.stacked_layers: list[str] = []
        self.stacked_refused: dict[str, str] = {}  # layers whose stacked map failed its check
        self.model_species = tuple(int(z) for z in model.atomic_numbers)
        self.species = _species_tuple(species)
        self.check_species(self.species)
        heads = tuple(getattr(model, "heads", None) or ("Default",))
        self.head = _resolve_head(head, heads)
        self.long_range = is_long_range(model)
        counted = isinstance(edge_chunk_rows, int) and not isinstance(edge_chunk_rows, bool)
        if edge_chunk_rows not in (None, "auto") and not (counted and edge_chunk_rows >= 1):
            raise ValueError(
                f"edge_chunk_rows={edge_chunk_rows!r}: give a positive number of rows, 'auto' "
                "or None"
            )
        if compile and isinstance(edge_chunk_rows, int):
            raise ValueError(
                "a potential that works through its edges in chunks runs uncompiled: leave "
                "compile off, or edge_chunk_rows None"
            )
        if self.long_range and (
            compile
            or radial_table
            or fused_convolution
            or product_basis
            or isinstance(edge_chunk_rows, int)
            or matmul_precision == "bf16"
        ):
            setting = next(name for name, value in (
                ("compile", compile), ("radial_table", radial_table),
                ("matmul_precision='bf16'", matmul_precision == "bf16"),
                ("fused_convolution", fused_convolution), ("product_basis", product_basis),
                ("edge_chunk_rows", isinstance(edge_chunk_rows, int))) if value)  # fmt: skip
            raise UnsupportedModelError(
                f"a {type(model).__name__} runs eagerly and as trained in FastMACE: "
                f"leave {setting} off"
            )
        self.table_report: TableReport | None = None
        self.table_failure: str | None = None  # why tables the plan chose were not built
        self.table_fallback = bool(radial_table_fallback)
        self.product_basis_failure: str | None = None  # why the own product basis is not used
        self.product_basis_used = False
        self.fused_convolution_failure: str | None = None  # why the own convolution is not used
        self.fused_convolution_used = False
        # The model without the own kernels, until they are checked on the first state.
        self._unchecked_against: torch.nn.Module | None = None
        self._own_kernels_fallback = False
        self.own_kernels_check: str | None = None  # how they compared on the first state
        if self.long_range:
            # mace-torch's own model, unchanged: its long-range part is checked against
            # mace-torch's calculator as it is, and it has no padding node to specialise for.
            self.model, self.pair_model = model, None
        else:
            # A copy for the run's elements and the padding node's (the model's first element),
            # over weights that do not require gradients: a kernel library's backward computes
            # a gradient for every input that requires one (cuEquivariance's: the weights of
            # every linear map and contraction), and forces need none of them.
            self.model = specialise_for_species(
                weight_sharing_copy(model), (*self.species, self.model_species[0])
            )
            if radial_table:
                self._tabulate(radial_table_fallback)
            without_own_kernels = self.model
            if fused_convolution:
                self._use_fused_convolution(fused_convolution_fallback)
            if product_basis:
                self._use_product_basis(product_basis_fallback)
            if matmul_precision == "bf16":
                self.model, self.bf16_layers = bf16_model(self.model)
                without_own_kernels, _ = bf16_model(without_own_kernels)
            elif compile if stack_linears is None else stack_linears:
                # cuEquivariance's linear layers as one batched GEMM per shape of their
                # matrices: the same products in fewer launches (dynamics/stacked_linear.py).
                self.model, self.stacked_layers, self.stacked_refused = stacked_model(self.model)
                if self.fused_convolution_used or self.product_basis_used:
                    without_own_kernels, _, _ = stacked_model(without_own_kernels)
            if self.fused_convolution_used or self.product_basis_used:
                # Checked once more on the run's first state (forward), against this.
                self._unchecked_against = without_own_kernels
                self._own_kernels_fallback = fused_convolution_fallback or product_basis_fallback
            # The same weights with the radial MLPs run once per pair, for mirrored edges
            # (dynamics/pair_radials.py); None when the model's blocks cannot share them.
            self.pair_model = pair_shared_model(self.model)
        self.edge_chunking = self._edge_chunking(edge_chunk_rows, model_device(model))
        self.edge_chunk_rows = None if self.edge_chunking is None else self.edge_chunking.rows
        self.chunked_calls = 0  # evaluations that needed chunks
        self._chunk(self.model)
        self.compiled = bool(compile)
        self.compile_fallback = bool(compile_fallback)
        self.compile_failure: str | None = None  # why compilation was given up, if it was
        self.first_compiled_call_s: float | None = None
        # Plain functions, not submodules, made at the first call of each kind (mirrored
        # edges or not): the weights are registered once, under ``model``.
        self._compiled_calls: dict[bool, Callable[..., dict[str, torch.Tensor]]] = {}
        # Models on cuEquivariance or OpenEquivariance kernels compile ahead of time on the
        # CPU: whole evaluations kept in the cache root (dynamics/aot_potential.py). Not on
        # CUDA (AHEAD_OF_TIME_DEVICES says why); torch.compile serves CUDA, and e3nn models.
        self.ahead_of_time = (
            self.compiled
            and not self.long_range
            and model_device(model).type in AHEAD_OF_TIME_DEVICES
            and _has_accelerated_kernels(self.model)
        )
        self._aot_evaluations: dict[tuple[bool, bool, int], Callable[..., PotentialOutput]] = {}
        self.aot_reports: list[AotReport] = []  # how each compiled potential was obtained
        self.r_max = float(model.r_max)
        dtype, device = model_dtype(model), model_device(model)
        self.register_buffer("head_index", torch.tensor(heads.index(self.head), device=device))
        self.register_buffer("node_attr_table", self._node_attr_table(dtype, device))
        # The padding node's edges: a fixed vector beyond r_max, where the cutoff is zero.
        pad = torch.tensor([2.0 * self.r_max, 0.0, 0.0], dtype=dtype, device=device)
        self.register_buffer("padding_shift", pad)

    @classmethod
    def from_loaded(
        cls,
        loaded: LoadedModel,
        species: Iterable[int] | torch.Tensor,
        *,
        compile: bool = False,
        compile_fallback: bool = False,
        matmul_precision: str = DEFAULT_MATMUL_PRECISION,
        radial_table: bool = False,
        radial_table_fallback: bool = False,
        fused_convolution: bool = False,
        fused_convolution_fallback: bool = False,
        product_basis: bool = False,
        product_basis_fallback: bool = False,
        edge_chunk_rows: int | str | None = None,
    ) -> Potential:
        """The potential of an ``fm.load`` result: its converted module and its head."""
        return cls(
            loaded.module,
            species,
            head=loaded.head,
            compile=compile,
            compile_fallback=compile_fallback,
            matmul_precision=matmul_precision,
            radial_table=radial_table,
            radial_table_fallback=radial_table_fallback,
            fused_convolution=fused_convolution,
            fused_convolution_fallback=fused_convolution_fallback,
            product_basis=product_basis,
            product_basis_fallback=product_basis_fallback,
            edge_chunk_rows=edge_chunk_rows,
        )

    def check_species(self, species: Iterable[int] | torch.Tensor) -> None:
        """Raise UnsupportedSpeciesError unless the model knows every element of ``species``.

        Host-side: call it when a new structure comes in, never inside a step.
        """
        unknown = sorted(set(_species_tuple(species)) - set(self.model_species))
        if unknown:
            raise UnsupportedSpeciesError(
                f"the model has no parameters for {_element_list(unknown)}; its elements are "
                f"{_element_list(self.model_species)}. Choose a model trained on these elements."
            )

    def _node_attr_table(self, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """(119, num_species) rows: atomic number -> mace's one-hot node attributes.

        Elements the model does not know get NaN rows: if one slipped past the host-side
        check, its system's energy becomes NaN instead of a silently wrong number.
        """
        table = torch.full((_MAX_ATOMIC_NUMBER + 1, len(self.model_species)), float("nan"))
        for index, number in enumerate(self.model_species):
            table[number] = 0.0
            table[number, index] = 1.0
        return table.to(dtype=dtype, device=device)

    def forward(
        self,
        state: State,
        edges: Edges,
        compute_stress: bool = False,
        *,
        charge: PerSystem = None,
        spin: PerSystem = None,
    ) -> PotentialOutput:
        """Energy per system, forces and (with ``compute_stress``) virials and stresses.

        ``charge`` (total charge in e) and ``spin`` (spin multiplicity 2S + 1), one value or
        one per system, are read by long-range models only (default: neutral singlet, as
        mace-torch); local models do not depend on them. For local models: no host
        synchronisation and fixed shapes. Not to be called under ``torch.inference_mode``
        (forces need autograd), any other grad mode is fine.
        """
        if self._unchecked_against is not None:
            return self._first_state_check(state, edges, compute_stress)
        if not self.compiled:
            return self._evaluate(state, edges, compute_stress, charge, spin)
        started, chunked_before = time.perf_counter(), self.chunked_calls
        try:
            if self.ahead_of_time:
                output = self._aot_call(state, edges, compute_stress)
            else:
                with _compile_settings():
                    output = self._evaluate(state, edges, compute_stress, charge, spin)
            # An evaluation in chunks runs uncompiled: its time says nothing of compilation.
            if self.first_compiled_call_s is None and self.chunked_calls == chunked_before:
                self.first_compiled_call_s = time.perf_counter() - started
            return output
        except ModelCompileError as error:
            if not self.compile_fallback:
                raise
            # Compilation happens in an eager block (the first, or the one after a regrowth),
            # never inside a capture, so the same call can simply be made again uncompiled.
            self.compiled = False
            self.compile_failure = str(error)[:500]
            warnings.warn(
                f"{error}; the model runs uncompiled for the rest of this run",
                RuntimeWarning,
                stacklevel=2,
            )
            return self._evaluate(state, edges, compute_stress, charge, spin)

    @property
    def own_kernels(self) -> tuple[str, ...]:
        """FastMACE's own kernels this potential runs: "convolution", "product basis"."""
        return tuple(name for name, used in (
            ("convolution", self.fused_convolution_used),
            ("product basis", self.product_basis_used)) if used)  # fmt: skip

    def _chunk(self, model: torch.nn.Module) -> None:
        """The chunked copies of ``model`` (plain and per pair), when edges come in chunks."""
        self.chunked_model = self.chunked_pair_model = None
        if self.edge_chunk_rows is not None:
            self.chunked_model = chunked_model(model, self.edge_chunk_rows, pairs=False)
            if self.pair_model is not None:
                self.chunked_pair_model = chunked_model(model, self.edge_chunk_rows, pairs=True)

    def _first_state_check(
        self, state: State, edges: Edges, compute_stress: bool
    ) -> PotentialOutput:
        """The first evaluation with FastMACE's own kernels, compared with the same model
        without them (cuEquivariance's kernels) on the same state: forces within float32's
        rounding tolerance of the model's dtype, or the own kernels are dropped for the rest
        of the run (with ``fallback``; else ConvolutionError). Uncompiled, as a first call."""
        reference_model, self._unchecked_against = self._unchecked_against, None
        own = self._evaluate(state, edges, compute_stress, None, None, compiled=False)
        current = (self.model, self.pair_model, self.chunked_model, self.chunked_pair_model)
        self.model, self.pair_model = reference_model, pair_shared_model(reference_model)
        self._chunk(reference_model)
        counted = self.chunked_calls  # the run's evaluations, not this comparison's
        reference = self._evaluate(state, edges, compute_stress, None, None, compiled=False)
        self.chunked_calls = counted
        dtype = self.node_attr_table.dtype  # the model's
        loosening = precision_loosening(dtype, self.matmul_precision)
        energy_tolerance, force_tolerance = (
            tolerance * loosening
            for tolerance in rounding_tolerances(
                dtype,
                float(reference.energy.abs().max()),
                reference.forces.detach().cpu().numpy(),
                state.n_atoms,
            )
        )
        force_error = float((own.forces - reference.forces).abs().max())
        energy_error = float((own.energy - reference.energy).abs().max())
        kernels = self.own_kernels
        if force_error <= force_tolerance and energy_error <= energy_tolerance:
            self.model, self.pair_model, self.chunked_model, self.chunked_pair_model = current
            self.own_kernels_check = (
                f"own {' and '.join(kernels)} within {force_error:.1e} eV/Å of "
                f"cuEquivariance's on the first state (tolerance {force_tolerance:.1e})"
            )
            return own
        reason = (
            f"on the run's first state the own {' and '.join(kernels)} gave forces "
            f"{force_error:.2e} eV/Å (energy {energy_error:.2e} eV) from cuEquivariance's "
            f"(tolerance {force_tolerance:.2e})"
        )
        if not self._own_kernels_fallback:
            self.model, self.pair_model, self.chunked_model, self.chunked_pair_model = current
            raise ConvolutionError(reason)
        self._compiled_calls.clear()
        self.own_kernels_check = reason
        if self.fused_convolution_used:
            self.fused_convolution_used, self.fused_convolution_failure = False, reason
        if self.product_basis_used:
            self.product_basis_used, self.product_basis_failure = False, reason
        warnings.warn(f"{reason}; cuEquivariance's kernels run", RuntimeWarning, stacklevel=3)
        return reference

    def _edge_chunking(
        self, setting: int | str | None, device: torch.device
    ) -> EdgeChunking | None:
        """The rows an evaluation takes at once (None: all), from ``edge_chunk_rows``."""
        if setting is None or self.long_range:
            return None
        if isinstance(setting, int):
            return EdgeChunking(rows=setting, reason=f"asked: edge_chunk_rows={setting}")
        if device.type != "cuda" or chunking_refusal(self.model) is not None:
            return None
        free = available_memory_bytes(device)
        return edge_chunking(free, bytes_per_row(self.model), widest_row(self.model))

    def _tabulate(self, fallback: bool) -> None:
        """``model`` with its radial weights read from tables; with ``fallback``, a model
        whose tables miss their tolerance keeps its radial MLPs, with a warning."""
        try:
            self.model, self.table_report = _tables_for(self.model, self.species)
        except TableError as error:
            if not fallback:
                raise
            self.table_failure = str(error)[:500]
            warnings.warn(f"{error}; the radial MLPs run as trained", RuntimeWarning, stacklevel=3)

    def _use_fused_convolution(self, fallback: bool) -> None:
        """``model`` with FastMACE's own convolution; with ``fallback``, a model whose
        convolution cannot be built or fails its check keeps its own, with a warning."""
        try:
            # The last padding node has edges to itself only: no messages needed (the
            # others' messages are computed and reach only padding nodes).
            self.model = fused_convolution_model(self.model, skip=1)
            if self.table_report is not None:  # the tables read inside the convolution
                self.model = table_convolution_model(self.model)
            self.fused_convolution_used = True
        except ConvolutionError as error:
            if not fallback:
                raise
            self.fused_convolution_failure = str(error)[:500]
            warnings.warn(
                f"{error}; the blocks' own convolution runs", RuntimeWarning, stacklevel=3
            )

    def _use_product_basis(self, fallback: bool) -> None:
        """``model`` with FastMACE's own product basis; with ``fallback``, a model whose
        product basis cannot be built or fails its check keeps cuEquivariance's, with a
        warning."""
        try:
            species = (*self.species, self.model_species[0])
            self.model = product_basis_model(self.model, species)
            self.product_basis_used = True
        except ProductBasisError as error:
            if not fallback:
                raise
            self.product_basis_failure = str(error)[:500]
            warnings.warn(
                f"{error}; cuEquivariance's symmetric contraction runs",
                RuntimeWarning,
                stacklevel=3,
            )

    def _aot_call(self, state: State, edges: Edges, compute_stress: bool) -> PotentialOutput:
        """Through the package compiled ahead of time for these kinds of inputs, loaded or
        built at the first call of each kind (outside any CUDA graph capture)."""
        kind = (compute_stress, edges.mirrored, state.n_systems)
        evaluation = self._aot_evaluations.get(kind)
        if evaluation is None:
            from fastmace.dynamics.aot_potential import AotBuildError, aot_evaluation

            try:
                evaluation, report = aot_evaluation(self, state, edges, compute_stress)
            except AotBuildError as error:
                raise ModelCompileError(
                    f"{error}; run without EngineConfig(compile=True)"
                ) from error
            self._aot_evaluations[kind] = evaluation
            self.aot_reports.append(report)
        return evaluation(state, edges)

    def evaluate_eagerly(
        self,
        state: State,
        edges: Edges,
        compute_stress: bool = False,
        call: Callable[..., dict[str, torch.Tensor]] | None = None,
        *,
        charge: PerSystem = None,
        spin: PerSystem = None,
        padding: int | None = None,
    ) -> PotentialOutput:
        """``forward`` without any compilation (neither torch.compile nor a package compiled
        ahead of time), or through ``call`` in place of the model (what
        dynamics/aot_potential.py traces and checks against). For evaluations outside the
        steps of a compiled run, which would otherwise compile a graph of their own.

        ``padding``: the number of padding nodes (default :func:`padding_nodes` of the
        atoms). The trace ahead of time passes it as a size of its own, so that the traced
        graph puts no condition on the number of atoms."""
        return self._evaluate(
            state, edges, compute_stress, charge, spin, call, compiled=False, padding=padding
        )

    def _evaluate(
        self,
        state: State,
        edges: Edges,
        compute_stress: bool,
        charge: PerSystem,
        spin: PerSystem,
        call: Callable[..., dict[str, torch.Tensor]] | None = None,
        *,
        compiled: bool = True,
        padding: int | None = None,
    ) -> PotentialOutput:
        """forward's work, through ``call``, or else the model (through torch.compile when
        both ``compiled`` and the potential's ``compiled``)."""
        compiled = compiled and self.compiled and not self.ahead_of_time
        compiling = compiled and call is None
        with torch.enable_grad(), _compile_errors_named(compiling):
            if self.long_range:
                graph = self._long_range_graph(state, edges, compute_stress, charge, spin)
            else:
                graph = self._graph(state, edges, compute_stress, padding)
            with (
                default_dtype(self.node_attr_table.dtype),
                _matmul_precision(self.matmul_precision),
            ):
                if call is None:
                    edge_count = graph.data["edge_index"].shape[1]
                    call = self._model_call(edges.mirrored, edge_count, compiled)
                output = call(graph.data, training=False, compute_force=False)
            if self.long_range:
                # The total per system: the node energies leave out the electrostatic and
                # electron energies.
                energy = output["energy"].to(ENERGY_DTYPE)
            else:
                energy = _system_energies(output["node_energy"], state.system, state.n_systems)
            inputs = [graph.positions]
            if graph.displacement is not None:
                inputs.append(graph.displacement)
            # As mace-torch: forces (and virials) by one backward pass, no graph kept.
            gradients = torch.autograd.grad(
                [energy],
                inputs,
                grad_outputs=[torch.ones_like(energy)],
                create_graph=False,
                allow_unused=True,
                materialize_grads=True,
            )
        if graph.displacement is None:
            return PotentialOutput(energy=energy.detach(), forces=_forces(gradients[0]))
        forces, virial, stress = _forces_and_stress(gradients[0], gradients[1], state.cell)
        return PotentialOutput(energy=energy.detach(), forces=forces, virial=virial, stress=stress)

    def _model_call(
        self, mirrored: bool, edges: int, compiled: bool = True
    ) -> Callable[..., dict[str, torch.Tensor]]:
        """The model for these edges: radial weights once per pair when they are mirrored
        and the model allows it; in chunks when they are more than ``edge_chunk_rows``;
        through torch.compile when ``compiled`` and the potential compiles."""
        shared = mirrored and self.pair_model is not None
        if self.edge_chunk_rows is not None:
            rows = edges // 2 if shared else edges
            if rows > self.edge_chunk_rows:
                self.chunked_calls += 1
                return self.chunked_pair_model if shared else self.chunked_model
        if not (compiled and self.compiled) or self.ahead_of_time:
            return self.pair_model if shared else self.model
        if shared not in self._compiled_calls:
            self._compiled_calls[shared] = _compiled(self.model, share_pair_radials=shared)
        return self._compiled_calls[shared]

    def _graph(
        self, state: State, edges: Edges, compute_stress: bool, padding: int | None = None
    ) -> _Graph:
        """mace-torch's input dictionary for this batch, plus the leaves to differentiate
        (``padding``: the number of padding nodes, default :func:`padding_nodes`)."""
        dtype = self.node_attr_table.dtype
        n_atoms, n_systems = state.n_atoms, state.n_systems
        edge_index, unit_shifts, real = _real_edges(state, edges, self.r_max)
        positions = state.positions.to(dtype=dtype, copy=True).requires_grad_(True)
        displacement = _zero_strain(state.cell.shape[0], positions) if compute_stress else None
        padding = padding_nodes(n_atoms) if padding is None else padding
        vectors, cell_rows, edge_index, unit_shifts = _model_edges(
            positions,
            state.cell.to(dtype),
            displacement,
            systems_of_atoms(state),
            edge_index,
            unit_shifts,
            real,
            edges.mirrored,
            self.padding_shift,
            padding,
        )
        node_attrs, batch, ptr = _model_nodes(
            state.atomic_numbers,
            state.system,
            self.node_attr_table,
            self._padding_node_attrs(),
            n_systems,
            padding,
        )
        data = {
            # The edge vectors are handed to the model as its "shifts", with all positions
            # zero: mace's receiver - sender + shift is then exactly these vectors.
            "positions": positions.new_zeros(n_atoms + padding, 3),
            "node_attrs": node_attrs,
            "edge_index": edge_index,
            "shifts": vectors,
            "unit_shifts": unit_shifts,
            "cell": cell_rows,
            "batch": batch,
            "ptr": ptr,
            "head": self.head_index.expand(n_systems + 1),
        }
        return _Graph(data=data, positions=positions, displacement=displacement)

    def _long_range_graph(
        self,
        state: State,
        edges: Edges,
        compute_stress: bool,
        charge: PerSystem,
        spin: PerSystem,
    ) -> _Graph:
        """PolarMACE's input dictionary (dynamics/polar.py), plus the leaves to differentiate."""
        dtype = self.node_attr_table.dtype
        device, n_systems = state.device, state.n_systems
        edge_index, unit_shifts, real = _real_edges(state, edges, self.r_max)
        positions = state.positions.to(dtype=dtype, copy=True).requires_grad_(True)
        strained, displacement = None, None
        if compute_stress:
            moved, cell_moved, displacement = _strained(
                positions, state.cell.to(dtype), systems_of_atoms(state)
            )
            strained = (moved, cell_moved)
        data = polar_graph(
            state,
            edge_index,
            unit_shifts,
            real,
            node_attrs=self.node_attr_table[state.atomic_numbers],
            head_index=self.head_index,
            r_max=self.r_max,
            positions=positions,
            strained=strained,
            charge=per_system_values(charge, DEFAULT_CHARGE, n_systems, "charge", dtype, device),
            spin=per_system_values(
                spin, DEFAULT_SPIN_MULTIPLICITY, n_systems, "spin", dtype, device
            ),
        )
        return _Graph(data=data, positions=positions, displacement=displacement)

    def _padding_node_attrs(self) -> torch.Tensor:
        """A padding node is an atom of the model's first element (any known one would do)."""
        return self.node_attr_table[self.model_species[0]].unsqueeze(0)


@contextlib.contextmanager
def _matmul_precision(precision: str) -> Iterator[None]:
    """torch's float32 GEMM precision for one model call (TF32 when asked), then put back.

    Uses torch's newer ``fp32_precision`` switch where it exists: torch refuses a mix of it and
    the older ``allow_tf32`` in one process. Inside a CUDA graph capture, the GEMMs recorded
    keep the precision they were captured with.
    """
    if precision != "tf32":
        yield
        return
    matmul = torch.backends.cuda.matmul
    newer = hasattr(matmul, "fp32_precision")
    before = matmul.fp32_precision if newer else matmul.allow_tf32
    if newer:
        matmul.fp32_precision = "tf32"
    else:
        matmul.allow_tf32 = True
    try:
        yield
    finally:
        if newer:
            matmul.fp32_precision = before
        else:
            matmul.allow_tf32 = before


def _compiled(
    model: torch.nn.Module, *, share_pair_radials: bool = False, backend: str = "inductor"
) -> Callable[..., dict[str, torch.Tensor]]:
    """A copy of ``model`` made traceable, under torch.compile; the caller's model is untouched.

    As mace-torch's own compile mode does: e3nn's TorchScript code generation cannot be traced
    by Dynamo, so an e3nn model is rebuilt from its configuration with code generation off,
    and mace's registered blocks are simplified by ``torch.fx``. Models converted to
    cuEquivariance or OpenEquivariance keep their kernels (registered torch operators) and are
    only simplified, on a copy that shares their weights (no deep copy: see
    dynamics/module_copy.py). With ``share_pair_radials`` the copy computes radial weights once
    per pair (`pair_shared_model`; only for mirrored edges). Forces stay outside the compiled
    region (autograd over its output), so Dynamo's autograd settings are left alone.
    Inductor's and Triton's caches go to the cache root (docs/environment.md), set before the
    first compilation.

    Compilation happens at the first call (forward) and the first backward pass: both run
    inside :func:`_compile_settings`. ``backend`` is torch.compile's (tests use "eager":
    Dynamo's tracing and guards without Inductor's code generation).
    """
    from fastmace.runtime import cache, environment

    traceable = _traceable(model, share_pair_radials)
    environment.configure_compile_caches(cache.cache_root().path)
    compiled = torch.compile(traceable, backend=backend)

    def call(data: dict[str, torch.Tensor], **kwargs: object) -> dict[str, torch.Tensor]:
        # A regrown list changes only the number of edges: compiled with that size symbolic,
        # the model is compiled once per run, not once per capacity (a minute each on a GPU).
        for key, dimension in EDGE_DIMENSIONS:
            torch._dynamo.maybe_mark_dynamic(data[key], dimension)
        return compiled(data, **kwargs)

    return call


def _tables_for(
    model: torch.nn.Module, species: Sequence[int]
) -> tuple[torch.nn.Module, TableReport]:
    """``model`` with radial tables: of the distance where its blocks allow, else one per pair
    of the elements ``species`` (MH-1's blocks, distance transforms). Raises TableError, also
    where the float64 build runs out of device memory (a planner's choice then falls back)."""
    try:
        if table_refusal(model) is None:
            return tabulated_model(model)
        return pair_tabulated_model(model, species)
    except torch.OutOfMemoryError as error:
        raise TableError(
            "the radial weights cannot be tabulated: building the tables ran out of device "
            f"memory ({str(error).splitlines()[0][:200]}); run without radial_table"
        ) from error


def _traceable(model: torch.nn.Module, share_pair_radials: bool) -> torch.nn.Module:
    """The copy of ``model`` that torch.compile traces (see :func:`_compiled`)."""
    from mace.tools.compile import disable_e3nn_codegen, simplify

    accelerated = _has_accelerated_kernels(model)
    tables = (RadialTable, PairRadialTable)
    if not accelerated and any(isinstance(module, tables) for module in model.modules()):
        # Refused before anything is set up for compilation.
        raise ModelCompileError(
            "torch.compile rebuilds an e3nn model from its configuration, which has no radial "
            "tables: run the e3nn backend with radial_table or compile, not both (both run "
            "together on the cueq, oeq and hybrid backends)"
        )
    with disable_e3nn_codegen():
        if accelerated:
            traceable = weight_sharing_copy(model)
        else:
            # Imported here: scripts_utils imports mace-torch's trainer (seconds), which a
            # converted model's compilation does not need.
            from mace.tools.scripts_utils import extract_model

            # Rebuilt under the model's dtype: e3nn keeps some constants outside its buffers.
            # A model build like any other, so inside contained() (its coefficients in float64).
            with contained(), default_dtype(model_dtype(model)):
                traceable = extract_model(model, map_location=str(model_device(model)))
            # The rebuild loads weights leniently: put FastMACE's replaced modules back, and
            # refuse a rebuild that left any other weight at its random initial value.
            traceable = copy_modules_of(model, traceable, (SpeciesLinear, IrrepsLinear))
            lost = set(model.state_dict()) ^ set(traceable.state_dict())
            if lost:
                raise ModelCompileError(
                    "rebuilding the model for torch.compile did not keep its weights (names "
                    f"that differ: {sorted(lost)}); run without EngineConfig(compile=True)"
                )
        if share_pair_radials:
            traceable = pair_shared_model(traceable)
        # e3nn's Activation as a module Dynamo traces (mace-torch's readouts hold it; a model
        # built in this process also had it registered for simplify: scalar_activation.py).
        replace_activations(traceable)
        traceable = simplify(traceable)
    # Weights are constants of the compiled graph: AOTAutograd's backward then computes only
    # the gradients the forces need.
    traceable.requires_grad_(False)
    return traceable


@contextlib.contextmanager
def _compile_errors_named(active: bool) -> Iterator[None]:
    """Dynamo's and Inductor's errors, from the forward pass or the backward pass (compiled at
    its first call), as a :class:`ModelCompileError` that says what to do instead."""
    if not active:
        yield
        return
    from torch._dynamo.exc import TorchDynamoException

    try:
        yield
    except TorchDynamoException as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise ModelCompileError(
            f"torch.compile could not compile this model ({type(error).__name__}: "
            f"{first_line}); run without EngineConfig(compile=True)"
        ) from error


def _compile_settings() -> contextlib.AbstractContextManager[None]:
    """Inductor settings for FastMACE's compilations only, put back after each model call.

    Precompiled C++ headers are off: Inductor keeps them in a directory of its own outside
    the cache root, shared with every other torch on the machine, where a lock file another
    process left behind (a kernel lock's file, or a soft lock of a killed compilation) makes
    a soft-locking process wait ten minutes and fail.
    """
    from torch._inductor import config as inductor_config

    if not hasattr(inductor_config, "cpp_cache_precompile_headers"):
        return contextlib.nullcontext()
    return inductor_config.patch(cpp_cache_precompile_headers=False)


class ModelCompileError(RuntimeError):
    """torch.compile failed on the model (the message says what to do instead)."""


def _has_accelerated_kernels(model: torch.nn.Module) -> bool:
    """Whether the model was converted to cuEquivariance or OpenEquivariance modules."""
    prefixes = ("cuequivariance", "openequivariance")
    return any(type(module).__module__.startswith(prefixes) for module in model.modules())


@dataclass
class _Graph:
    data: dict[str, torch.Tensor]
    positions: torch.Tensor
    displacement: torch.Tensor | None


def _padding_node_of_slot(edge_index: torch.Tensor, mirrored: bool, padding: int) -> torch.Tensor:
    """(E,) which padding node (0 .. padding - 1) each slot's edge goes to if it is padding:
    slot by slot in turn, and for mirrored edges the same node for both halves of a pair."""
    slots = edge_index.shape[1]
    slot = torch.arange(slots, device=edge_index.device)
    if mirrored:
        slot = slot % (slots // 2)  # a mirrored list holds at least one pair
    return slot % padding


def _real_edges(
    state: State, edges: Edges, r_max: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Edge index and unit shifts with padding slots sanitised, and the (E,) real-edge mask.

    An edge is real when it is not padding and its float64 length is in (0, r_max): the
    pairs mace-torch's own neighbour list would give. Padding slots are set to atom 0 and a
    zero shift first, so whatever they held (even NaN) cannot reach a gradient.
    """
    return _sanitised_real_edges(
        state.positions,
        state.cell,
        systems_of_atoms(state),
        edges.edge_index,
        edges.unit_shifts,
        edges.mask,
        r_max,
    )


@fusible
def _sanitised_real_edges(
    positions: torch.Tensor,
    cell: torch.Tensor,
    system: torch.Tensor | None,
    edge_index: torch.Tensor,
    unit_shifts: torch.Tensor,
    mask: torch.Tensor,
    r_max: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`_real_edges` on tensors (``system``: every atom's, None for a batch of one)."""
    edge_index = torch.where(mask, edge_index, 0)
    unit_shifts = torch.where(mask.unsqueeze(-1), unit_shifts, 0.0)
    vectors = vectors_of_edges(positions, cell, system, edge_index, unit_shifts)
    length_squared = (vectors * vectors).sum(-1)
    real = mask & (length_squared < r_max * r_max) & (length_squared > 0)
    return edge_index, unit_shifts, real


@fusible
def _model_edges(
    positions: torch.Tensor,
    cell: torch.Tensor,
    displacement: torch.Tensor | None,
    system: torch.Tensor | None,
    edge_index: torch.Tensor,
    unit_shifts: torch.Tensor,
    real: torch.Tensor,
    mirrored: bool,
    padding_shift: torch.Tensor,
    padding: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The model's edge inputs, differentiable in ``positions`` and ``displacement``.

    Returns the (E, 3) edge vectors (an edge that is not real becomes a self-edge of a
    padding node, :func:`_padding_node_of_slot`, with the fixed ``padding_shift``), the cells
    as rows with a zero cell for the padding nodes' system, and the edge index and unit
    shifts in the model's dtype (``padding``: the number of padding nodes after the atoms).
    """
    if displacement is not None:
        positions, cell = _apply_strain(positions, cell, displacement, system)
    unit_shifts = unit_shifts.to(positions.dtype)
    edge_system = None if system is None else system.index_select(0, edge_index[0])
    shifts = per_system_matmul(unit_shifts, cell, edge_system)
    shifts = torch.where(real.unsqueeze(-1), shifts, padding_shift)
    padding_node = positions.shape[0] + _padding_node_of_slot(edge_index, mirrored, padding)
    edge_index = torch.where(real, edge_index, padding_node)
    padded = torch.cat([positions, positions.new_zeros(padding, 3)])
    # index_select's backward is an atomic index_add; mace's own x[index] gathers would be
    # differentiated by a sort-based kernel, 4.6 ms per step at 13,824 atoms (H200).
    vectors = padded.index_select(0, edge_index[1]) - padded.index_select(0, edge_index[0])
    cell_rows = torch.cat([cell, cell.new_zeros(1, 3, 3)]).view(-1, 3)
    return vectors + shifts, cell_rows, edge_index, unit_shifts


@fusible
def _model_nodes(
    atomic_numbers: torch.Tensor,
    system: torch.Tensor,
    node_attr_table: torch.Tensor,
    padding_attrs: torch.Tensor,
    n_systems: int,
    padding: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The model's node inputs: one-hot elements, system of each node and the systems'
    first rows, for the atoms and then ``padding`` padding nodes (system ``n_systems``)."""
    node_attrs = torch.cat(
        [node_attr_table.index_select(0, atomic_numbers), padding_attrs.expand(padding, -1)]
    )
    batch = torch.cat([system, system.new_full((padding,), n_systems)])
    boundaries = torch.arange(n_systems + 2, dtype=batch.dtype, device=batch.device)
    return node_attrs, batch, torch.searchsorted(batch, boundaries)


@fusible
def _system_energies(
    node_energy: torch.Tensor, system: torch.Tensor, n_systems: int
) -> torch.Tensor:
    """(S,) float64 energy of each system from the model's node energies (the atoms' rows
    first, then the padding nodes', which are left out)."""
    atoms = node_energy[: system.shape[0]].to(ENERGY_DTYPE)
    return atoms.new_zeros(n_systems).index_add(0, system, atoms)


@fusible
def _forces(position_gradient: torch.Tensor) -> torch.Tensor:
    return -position_gradient.to(ENERGY_DTYPE)


@fusible
def _forces_and_stress(
    position_gradient: torch.Tensor, strain_gradient: torch.Tensor, cell: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Forces, virials and stresses (zero for a system without a cell) in float64 from the
    energy's gradients by the positions and the strain."""
    energy_strain_derivative = strain_gradient.to(ENERGY_DTYPE)
    volume = _cell_volume(cell).view(-1, 1, 1)
    stress = torch.where(volume > 0, energy_strain_derivative / volume, torch.zeros_like(volume))
    return _forces(position_gradient), -energy_strain_derivative, stress


def _strained(
    positions: torch.Tensor, cell: torch.Tensor, system: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Positions and cells under a symmetric strain ε = 0 that autograd can differentiate.

    The same construction as mace-torch's ``get_symmetric_displacement`` (after NequIP):
    r -> r (1 + ε_sym), cell -> cell (1 + ε_sym), so dE/dε is the virial's negative.
    """
    displacement = _zero_strain(cell.shape[0], positions)
    return *_apply_strain(positions, cell, displacement, system), displacement


def _zero_strain(n_systems: int, like: torch.Tensor) -> torch.Tensor:
    """(S, 3, 3) zero displacement gradient, the leaf that the virial is differentiated by."""
    return like.new_zeros((n_systems, 3, 3)).requires_grad_(True)


def _apply_strain(
    positions: torch.Tensor,
    cell: torch.Tensor,
    displacement: torch.Tensor,
    system: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    strain = 0.5 * (displacement + displacement.transpose(-1, -2))
    return positions + per_system_matmul(positions, strain, system), cell + cell @ strain


def _cell_volume(cell: torch.Tensor) -> torch.Tensor:
    """(S,) |det(cell)| by the triple product: no LAPACK call, so nothing synchronises."""
    return torch.abs((torch.linalg.cross(cell[:, 0], cell[:, 1]) * cell[:, 2]).sum(-1))


def _check_model(model: torch.nn.Module) -> None:
    kind = type(model).__name__
    if kind not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"a {kind} is not supported: Potential drives energy models "
            f"({', '.join(SUPPORTED_MODEL_TYPES)}); MACELES and dipole models need inputs and "
            "outputs it does not provide"
        )
    if hasattr(model, "joint_embedding"):
        raise UnsupportedModelError(
            f"this {kind} embeds extra inputs ({', '.join(model.embedding_specs)}) that "
            "Potential does not provide"
        )


def _resolve_head(head: str | None, heads: tuple[str, ...]) -> str:
    if head is None:
        if len(heads) == 1:
            return heads[0]
        raise ValueError(f"the model has {len(heads)} heads ({', '.join(heads)}): choose one")
    if head not in heads:
        raise ValueError(f"the model has no head {head!r}; its heads are: {', '.join(heads)}")
    return head


def _species_tuple(species: Iterable[int] | torch.Tensor) -> tuple[int, ...]:
    if isinstance(species, torch.Tensor):
        species = species.detach().to("cpu").reshape(-1).tolist()
    return tuple(sorted({int(z) for z in species}))


def _element_list(numbers: Iterable[int]) -> str:
    symbols = ase.data.chemical_symbols
    return ", ".join(symbols[z] if 0 < z < len(symbols) else f"Z={z}" for z in numbers)


# --- Conformance check ------------------------------------------------------------------------


def check_potential(
    potential: Potential,
    build_edges: Callable[[State], Edges],
    structures: Sequence[ase.Atoms] | None = None,
    extra_padding: int = 64,
) -> None:
    """Raise PotentialCheckError unless ``potential`` behaves as every potential must.

    The checks (after TorchSim's ``validate_model_outputs``): output shapes, dtypes and
    devices; finite energies, forces and stresses; inputs left unchanged; a batch gives each
    system the energy, forces and stress it has alone; ``extra_padding`` more padding slots
    change nothing; no stress unless asked. ``build_edges`` is the neighbour list to use.
    ``structures`` default to two systems of the potential's species: a periodic 12-atom cell
    and an 7-atom cluster without a cell, so the batch mixes periodic and free systems.
    """
    if structures is None:
        structures = _check_structures(potential.species)
    device = potential.node_attr_table.device
    state = State.from_atoms(structures, device=device)
    edges = build_edges(state)
    before = (copy.deepcopy(state), copy.deepcopy(edges))
    batch = potential(state, edges, compute_stress=True)
    _check_unchanged(before, state, edges)
    _check_outputs(batch, state)
    dtype = potential.node_attr_table.dtype
    loosening = precision_loosening(dtype, potential.matmul_precision)
    for index, atoms in enumerate(structures):
        single = State.from_atoms([atoms], device=device)
        alone = potential(single, build_edges(single), compute_stress=True)
        rows = state.system == index
        _check_close(
            f"system {index} in a batch of {len(structures)} vs alone",
            dtype,
            loosening,
            (batch.energy[index : index + 1], batch.forces[rows], batch.stress[index]),
            (alone.energy, alone.forces, alone.stress[0]),
        )
    padded = potential(state, pad_edges(edges, extra_padding), compute_stress=True)
    _check_close(
        f"{extra_padding} extra padding slots",
        dtype,
        loosening,
        (batch.energy, batch.forces, batch.stress),
        (padded.energy, padded.forces, padded.stress),
    )
    plain = potential(state, edges)
    if plain.stress is not None or plain.virial is not None:
        raise PotentialCheckError("stress was returned although compute_stress=False")


def pad_edges(edges: Edges, extra: int) -> Edges:
    """``edges`` with ``extra`` more padding slots (self-edges of atom 0, zero shift)."""
    device = edges.edge_index.device
    return Edges(
        edge_index=torch.cat(
            [edges.edge_index, torch.zeros((2, extra), dtype=torch.int64, device=device)], 1
        ),
        unit_shifts=torch.cat([edges.unit_shifts, edges.unit_shifts.new_zeros(extra, 3)]),
        mask=torch.cat([edges.mask, torch.zeros(extra, dtype=torch.bool, device=device)]),
        count=edges.count.clone(),
        overflow=edges.overflow.clone(),
    )


def _check_structures(species: Sequence[int]) -> list[ase.Atoms]:
    periodic = check_structure(tuple(species), seed=0)
    cluster = check_structure(tuple(species), seed=1)[:7]
    cluster.set_cell(np.zeros((3, 3)))
    cluster.set_pbc(False)
    return [periodic, cluster]


def _check_unchanged(before: tuple[State, Edges], state: State, edges: Edges) -> None:
    for name, old, new in (("state", before[0], state), ("edges", before[1], edges)):
        for field, value in vars(old).items():
            now = getattr(new, field)
            same = torch.equal(value, now) if isinstance(value, torch.Tensor) else value == now
            if not same:
                raise PotentialCheckError(f"the potential changed its input {name}.{field}")


def _check_outputs(output: PotentialOutput, state: State) -> None:
    n, s = state.n_atoms, state.n_systems
    expected = {
        "energy": (s,),
        "forces": (n, 3),
        "virial": (s, 3, 3),
        "stress": (s, 3, 3),
    }
    for name, shape in expected.items():
        value = getattr(output, name)
        if value is None:
            raise PotentialCheckError(f"{name} is missing although compute_stress=True")
        if tuple(value.shape) != shape or value.dtype != ENERGY_DTYPE:
            raise PotentialCheckError(
                f"{name} is {value.dtype} of shape {tuple(value.shape)}; expected float64 of "
                f"shape {shape}"
            )
        if value.device != state.device:
            raise PotentialCheckError(f"{name} is on {value.device}, the state on {state.device}")
        if not bool(torch.isfinite(value).all()):
            raise PotentialCheckError(f"{name} has non-finite values: {value}")


def _check_close(
    what: str,
    dtype: torch.dtype,
    loosening: float,
    actual: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    expected: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
) -> None:
    """Energy, forces and stress equal to the model dtype's rounding (models/backends.py),
    ``loosening`` times wider for a reduced-precision tier."""
    energy, forces, stress = (t.detach().to("cpu", ENERGY_DTYPE).numpy() for t in expected)
    energy_tolerance, force_tolerance = (
        tolerance * loosening
        for tolerance in rounding_tolerances(
            dtype, float(np.abs(energy).max()), forces, len(forces)
        )
    )
    scale = max(float(np.abs(stress).max()), 0.01)
    stress_tolerance = 1000 * torch.finfo(dtype).eps * scale * loosening
    names = ("energy", "forces", "stress")
    tolerances = (energy_tolerance, force_tolerance, stress_tolerance)
    for name, got, want, tolerance in zip(names, actual, expected, tolerances, strict=True):
        error = float((got - want).abs().max()) if got.numel() else 0.0
        if not error <= tolerance:
            raise PotentialCheckError(
                f"{what}: {name} differs by {error:.3g} (tolerance {tolerance:.3g})"
            )
