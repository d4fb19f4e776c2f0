"""Convolution weights read from a table of the distance instead of computed by the radial MLP.

In the interaction blocks listed in :data:`TABLE_BLOCKS`, with no distance transform, the
weights of a pair's convolution are a function of its distance alone: w(r) = MLP(embedding(r)),
times the cutoff when the embedding leaves it out. At 13,824 atoms of MP-0 medium the MLPs are
most of the step's float32 GEMMs (docs/validation/performance.md). Here each block's w is
evaluated once, in float64, at N + 1 evenly spaced distances from 0 to r_max, with its
derivative, and a step reads it back by cubic Hermite interpolation: one pass over the weights
forward and one backward, instead of four GEMMs each way.

The number of intervals is doubled until the table's error, measured against the float64 MLP
at three points inside every interval, is below :data:`TABLE_TOLERANCE` of the largest weight
and of the largest slope (forces come from the slope): well under float32 rounding, so the
planner chooses tables for float32 runs on CUDA of models that allow them, and
``EngineConfig(radial_table=False)`` turns them off (docs/md.md); the gate checks a tabulated
run against float64 e3nn with the float32 tolerance.

Beyond r_max the cutoff makes every weight zero, as the table's last node is, so the padding
edges (placed at 2 r_max) read zeros with zero derivative. On CUDA the lookup and its
backward are two Triton kernels (``radial_table_triton.py``); elsewhere torch computes the same
formulas. Both sit behind one custom operator, which ``torch.compile`` and CUDA graphs treat as
a single opaque call.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fastmace.dynamics.module_copy import shallow_copy

# r (float64, 1-D) -> (w(r), dw/dr), each (len(r), W).
_Function = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]

# Blocks whose radial embedding reaches nothing but the radial MLP (mace-torch 0.3.16,
# modules/blocks.py). The density blocks feed it to a second MLP, the non-linear ones append
# per-element embeddings.
TABLE_BLOCKS = frozenset({"RealAgnosticInteractionBlock", "RealAgnosticResidualInteractionBlock"})
# Largest interpolation error allowed, relative to the largest weight and the largest slope.
TABLE_TOLERANCE = 1e-6
FIRST_INTERVALS = 256  # tried first; doubled until the tolerance holds
MOST_INTERVALS = 8192  # beyond this the radial function is not smooth enough to tabulate


class TableError(ValueError):
    """A model whose radial weights cannot be tabulated (what and why is in the message)."""


@dataclass(frozen=True)
class TableReport:
    """How the tables of one model came out (recorded in the plan and metadata)."""

    blocks: int
    intervals: int  # the most any block needed
    spacing_A: float
    max_relative_error: float  # largest error / largest weight or slope, over the blocks
    megabytes: float
    # Tables per radial function, one per ordered pair of the run's elements (pair_table.py);
    # 0 where one table serves every pair (a function of the distance alone).
    element_pairs: int = 0


def table_refusal(model: torch.nn.Module) -> str | None:
    """Why ``model``'s radial weights cannot be tabulated, or None when they can."""
    embedding = getattr(model, "radial_embedding", None)
    interactions = getattr(model, "interactions", None)
    if embedding is None or interactions is None:
        return f"a {type(model).__name__} has no radial embedding and interaction blocks"
    if hasattr(embedding, "distance_transform"):
        kind = type(embedding.distance_transform).__name__
        return f"its radial embedding applies a distance transform ({kind}) of the elements"
    for block in interactions:
        kind = type(block).__name__
        if kind not in TABLE_BLOCKS or not hasattr(block, "conv_tp_weights"):
            return f"its {kind} uses the radial features for more than one radial MLP"
    return None


def tabulated_model(
    model: torch.nn.Module, tolerance: float = TABLE_TOLERANCE
) -> tuple[torch.nn.Module, TableReport]:
    """A copy of ``model`` whose blocks read their radial weights from tables.

    The copy shares every other weight with ``model``; its radial embedding passes the edge
    lengths through, and each block's ``conv_tp_weights`` is a :class:`RadialTable`. Raises
    :class:`TableError` for a model that :func:`table_refusal` refuses or whose radial
    functions need more than ``MOST_INTERVALS`` intervals.
    """
    refusal = table_refusal(model)
    if refusal is not None:
        raise TableError(f"the radial weights cannot be tabulated: {refusal}")
    embedding = model.radial_embedding
    r_max = float(model.r_max)
    cutoff_outside = not getattr(embedding, "apply_cutoff", True)
    tabulated = shallow_copy(model)
    tabulated.radial_embedding = DistanceEmbedding()
    blocks = shallow_copy(model.interactions)
    tabulated.interactions = blocks
    tables = []
    for index, original in enumerate(model.interactions):
        table = RadialTable.build(
            _radial_function(embedding, original.conv_tp_weights, cutoff_outside),
            r_max,
            tolerance,
            like=next(original.conv_tp_weights.parameters()),
        )
        block = shallow_copy(original)
        block.conv_tp_weights = table
        blocks[index] = block
        tables.append(table)
    report = TableReport(
        blocks=len(tables),
        intervals=max(t.intervals for t in tables),
        spacing_A=min(t.spacing for t in tables),
        max_relative_error=max(t.max_relative_error for t in tables),
        megabytes=sum(t.megabytes for t in tables),
    )
    return tabulated, report


class DistanceEmbedding(torch.nn.Module):
    """Stands in for mace's radial embedding: the edge lengths are the blocks' features.

    Its second output, the cutoff kept apart, is None: the tables hold it.
    """

    apply_cutoff = True  # as pair_radials reads it: no per-edge factor after the weights

    def forward(
        self,
        edge_lengths: torch.Tensor,
        node_attrs: torch.Tensor,
        edge_index: torch.Tensor,
        atomic_numbers: torch.Tensor,
    ) -> tuple[torch.Tensor, None]:
        return edge_lengths, None


class RadialTable(torch.nn.Module):
    """w(r) as one cubic per interval [k h, (k + 1) h], k = 0..N-1, from w and w' at the nodes.

    ``coefficients[k]`` holds the cubic's four rows c0..c3 in t = r / h - k (computed in
    float64, then stored in the model's dtype): w = c0 + t (c1 + t (c2 + t c3)). Keeping the
    coefficients rather than the node values means dw/dr = (c1 + t (2 c2 + 3 t c3)) / h
    needs no difference of nearly equal numbers, which in float32 would lose the derivative.
    """

    def __init__(self, coefficients: torch.Tensor, spacing: float, error: float) -> None:
        super().__init__()
        self.register_buffer("coefficients", coefficients.contiguous())
        # A tensor in the table's dtype: the kernels would round a Python float to float32.
        self.register_buffer("inverse_spacing", coefficients.new_tensor(1.0 / spacing))
        self.spacing = float(spacing)
        self.max_relative_error = float(error)

    @classmethod
    def build(
        cls,
        radial: _Function,
        r_max: float,
        tolerance: float,
        like: torch.Tensor,
        most_megabytes: float | None = None,
    ) -> RadialTable:
        """Tabulate ``radial`` on [0, r_max], doubling the intervals until ``tolerance`` holds;
        refused before a doubling whose table would exceed ``most_megabytes`` (in ``like``'s
        dtype: the float64 build needs several times that on the device)."""
        intervals = FIRST_INTERVALS
        spacing, grid = _nodes(r_max, intervals, like.device)
        values, derivatives = radial(grid)
        while True:
            coefficients = _cubic_coefficients(values, derivatives * spacing)
            error, (middle, middle_derivatives) = _table_error(radial, grid, coefficients)
            if error <= tolerance:
                break
            if intervals >= MOST_INTERVALS:
                raise TableError(
                    f"the radial weights cannot be tabulated: with {intervals} intervals the "
                    f"interpolation error is {error:.1e} of the largest weight or slope, "
                    f"above {tolerance:.0e}; run without radial_table"
                )
            intervals *= 2
            megabytes = intervals * 4 * values.shape[1] * like.element_size() / 2**20
            if most_megabytes is not None and megabytes > most_megabytes:
                raise TableError(
                    f"the radial weights cannot be tabulated: {intervals} intervals would take "
                    f"{megabytes:.1f} MB, above the {most_megabytes:.1f} MB left for tables; "
                    "run without radial_table"
                )
            # The finer grid's nodes are the old nodes and the midpoints the error check
            # has just evaluated: the function is not evaluated there again.
            spacing, grid = _nodes(r_max, intervals, like.device)
            values = _interleaved(values, middle)
            derivatives = _interleaved(derivatives, middle_derivatives)
        return cls(coefficients.to(like.dtype), spacing, error)

    @property
    def megabytes(self) -> float:
        return self.coefficients.numel() * self.coefficients.element_size() / 2**20

    @property
    def intervals(self) -> int:
        return self.coefficients.shape[0]

    def forward(self, lengths: torch.Tensor) -> torch.Tensor:
        return radial_table(lengths.reshape(-1), self.coefficients, self.inverse_spacing)


def _cubic_coefficients(values: torch.Tensor, slopes: torch.Tensor) -> torch.Tensor:
    """(N, 4, W) Hermite cubics from w and h w' at N + 1 nodes."""
    v0, v1, s0, s1 = values[:-1], values[1:], slopes[:-1], slopes[1:]
    jump = v1 - v0
    return torch.stack([v0, s0, 3 * jump - 2 * s0 - s1, s0 + s1 - 2 * jump], dim=1)


def _radial_function(
    embedding: torch.nn.Module, mlp: torch.nn.Module, cutoff_outside: bool
) -> _Function:
    """r (float64, 1-D) -> (w(r), dw/dr), each (len(r), W), through float64 copies of both.

    The derivative comes from forward-mode differentiation, exact to float64 rounding.
    """
    embedding64 = _float64_copy(embedding)
    mlp64 = _float64_copy(mlp)
    empty = torch.zeros(0, dtype=torch.long)

    def weights(r: torch.Tensor) -> torch.Tensor:
        # The embedding divides by r: the node at 0 is taken just above it.
        lengths = r.clamp_min(1e-9)[:, None]
        features, cutoff = embedding64(lengths, empty, empty, empty)
        out = mlp64(features)
        return out * cutoff if cutoff_outside and cutoff is not None else out

    def both(r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            return torch.func.jvp(weights, (r,), (torch.ones_like(r),))

    return both


def _table_error(
    radial: _Function, grid: torch.Tensor, coefficients: torch.Tensor
) -> tuple[float, tuple[torch.Tensor, torch.Tensor]]:
    """Largest error of the table between its nodes, in w and in dw/dr, each relative to
    its largest value (forces come from dw/dr, whose error is one order larger in h), and
    the function's values and derivatives at the intervals' midpoints (a finer table's
    nodes). Each interval's cubic is read at a quarter, half and three quarters of it."""
    spacing = float(grid[1] - grid[0])
    c0, c1, c2, c3 = coefficients.unbind(dim=1)
    worst = 0.0
    evaluated = {}
    for fraction in (0.25, 0.5, 0.75):
        evaluated[fraction] = exact, exact_slope = radial(grid[:-1] + fraction * spacing)
        # Horner's rule as _evaluate, at the fraction itself (no row to look up), in place:
        # MH-1's tables are hundreds of MB, each temporary a fresh allocation.
        read = (c3 * fraction).add_(c2).mul_(fraction).add_(c1).mul_(fraction).add_(c0)
        slope = (c3 * (3 * fraction)).add_(c2, alpha=2).mul_(fraction).add_(c1).div_(spacing)
        for error, exact_rows in ((read.sub_(exact), exact), (slope.sub_(exact_slope),
                                                              exact_slope)):  # fmt: skip
            largest = float(exact_rows.abs().max().clamp_min(torch.finfo(torch.float64).tiny))
            worst = max(worst, float(error.abs_().max()) / largest)
    return worst, evaluated[0.5]


def _nodes(r_max: float, intervals: int, device: torch.device) -> tuple[float, torch.Tensor]:
    """The spacing of ``intervals`` equal intervals on [0, r_max] and their nodes (float64)."""
    spacing = r_max / intervals
    return spacing, torch.arange(intervals + 1, dtype=torch.float64, device=device) * spacing


def _interleaved(nodes: torch.Tensor, middles: torch.Tensor) -> torch.Tensor:
    """Rows of ``nodes`` (N + 1) with the N rows of ``middles`` between them."""
    joined = nodes.new_empty((nodes.shape[0] + middles.shape[0], *nodes.shape[1:]))
    joined[0::2] = nodes
    joined[1::2] = middles
    return joined


def _float64_copy(module: torch.nn.Module) -> torch.nn.Module:
    return copy.deepcopy(module).to(torch.float64)


def _evaluate(
    x: torch.Tensor,
    coefficients: torch.Tensor,
    start: torch.Tensor | None = None,
    intervals: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of w and of h dw/dr at x = r / h (1-D); both zero from the table's end on. With
    ``start``, row i reads the table of ``intervals`` rows that begins at ``start[i]``."""
    intervals = coefficients.shape[0] if intervals is None else intervals
    k = x.floor().clamp(0, intervals - 1)
    t = (x - k).clamp(0, 1)[:, None]
    inside = (x < intervals)[:, None]
    row = k.long() if start is None else k.long() + start
    c0, c1, c2, c3 = coefficients[row].unbind(dim=1)
    value = c0 + t * (c1 + t * (c2 + t * c3))
    slope = c1 + t * (2 * c2 + 3 * t * c3)
    return value * inside, slope * inside


@torch.library.custom_op("fastmace::radial_table", mutates_args=())
def radial_table(
    lengths: torch.Tensor,
    coefficients: torch.Tensor,
    inverse_spacing: torch.Tensor,
    start: torch.Tensor | None = None,
    intervals: int = 0,
) -> torch.Tensor:
    """Rows of the tabulated weights at ``lengths`` (1-D); differentiable in ``lengths``. With
    ``start``, row i reads the table of ``intervals`` rows that begins at ``start[i]`` (one
    table per pair of elements, pair_table.py)."""
    if lengths.is_cuda:
        from fastmace.dynamics.radial_table_triton import lookup

        return lookup(lengths, coefficients, inverse_spacing, start, intervals or None)
    return _evaluate(lengths * inverse_spacing, coefficients, start, intervals or None)[0]


@radial_table.register_fake
def _radial_table_shape(lengths, coefficients, inverse_spacing, start=None, intervals=0):
    return lengths.new_empty((lengths.shape[0], coefficients.shape[2]))


@torch.library.custom_op("fastmace::radial_table_backward", mutates_args=())
def radial_table_backward(
    grad: torch.Tensor,
    lengths: torch.Tensor,
    coefficients: torch.Tensor,
    inverse_spacing: torch.Tensor,
    start: torch.Tensor | None = None,
    intervals: int = 0,
) -> torch.Tensor:
    """dL/d(lengths) from dL/d(weights) (not differentiable again: forces need one order)."""
    if lengths.is_cuda:
        from fastmace.dynamics.radial_table_triton import lookup_backward

        return lookup_backward(
            grad, lengths, coefficients, inverse_spacing, start, intervals or None
        )
    slope = _evaluate(lengths * inverse_spacing, coefficients, start, intervals or None)[1]
    return (grad * slope).sum(dim=1) * inverse_spacing


@radial_table_backward.register_fake
def _radial_table_backward_shape(grad, lengths, *rest):
    return torch.empty_like(lengths)


def _setup(ctx, inputs, output) -> None:
    lengths, coefficients, inverse_spacing, start, intervals = inputs
    ctx.save_for_backward(lengths, coefficients, inverse_spacing,
                          *([] if start is None else [start]))  # fmt: skip
    ctx.intervals = intervals


def _backward(ctx, grad):
    lengths, coefficients, inverse_spacing, *start = ctx.saved_tensors
    grad_lengths = radial_table_backward(
        grad.contiguous(), lengths.contiguous(), coefficients, inverse_spacing,
        start[0] if start else None, ctx.intervals,
    )  # fmt: skip
    return grad_lengths, None, None, None, None


radial_table.register_autograd(_backward, setup_context=_setup)
