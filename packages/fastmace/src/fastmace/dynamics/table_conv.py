"""FastMACE's own convolution with the radial table read inside it (the weights never stored).

A block with radial tables (radial_table.py) computes each edge's (or pair's) convolution
weights w(r) from the table, P x C numbers, writes them, and the convolution reads them back;
backward, the convolution writes dL/dw for every edge and the table turns it into one number,
dL/dr. Here the convolution (conv_triton.py's ``_forward_table`` and ``_backward_table``)
takes the lengths and the table and interpolates the weights where it uses them, and meets
dL/dw with the table's slope in registers: per edge it reads one length instead of P x C
weights, and writes dL/dr instead of P x C weight gradients (the FlashTP idea, for tables).

The model's block keeps its calling convention: its ``conv_tp_weights`` becomes
:class:`TableLengths`, which hands the block's edge features (the lengths, under
radial_table.DistanceEmbedding) through, and its ``conv_tp`` a :class:`TabulatedConvolution`
holding the table. Off CUDA the same formulas run in torch, through the table's and the
convolution's reference formulas.
"""

from __future__ import annotations

import torch

from fastmace.dynamics import kernel_sources
from fastmace.dynamics.fused_conv import (
    ConvolutionError,
    FusedConvolution,
    _dtype_device,
    _fold,
    convolve_backward_reference,
    convolve_reference,
    edge_runs,
)
from fastmace.dynamics.module_copy import shallow_copy
from fastmace.dynamics.pair_table import PairRadialTable
from fastmace.dynamics.radial_table import RadialTable, _evaluate


def _table_weights(
    lengths: torch.Tensor,
    table: torch.Tensor,
    inverse_spacing: torch.Tensor,
    paths: int,
    start: torch.Tensor | None = None,
    intervals: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The weights (rows, P, C) at ``lengths`` and their slopes h dw/dr, from the table (with
    ``start``, from each row's table of ``intervals`` rows: pair_table.py)."""
    values, slopes = _evaluate(lengths * inverse_spacing, table, start, intervals or None)
    rows = lengths.shape[0]
    return values.reshape(rows, paths, -1), slopes.reshape(rows, paths, -1)


def table_conv_reference(
    features: torch.Tensor,
    harmonics: torch.Tensor,
    lengths: torch.Tensor,
    table: torch.Tensor,
    inverse_spacing: torch.Tensor,
    coefficients: torch.Tensor,
    path_of: torch.Tensor,
    edge_index: torch.Tensor,
    skip: int,
    start: torch.Tensor | None = None,
    intervals: int = 0,
) -> torch.Tensor:
    """:func:`table_conv` in torch: the table's weights, then the convolution's formulas."""
    paths = int(path_of.max()) + 1
    weights, _ = _table_weights(lengths, table, inverse_spacing, paths, start, intervals)
    return convolve_reference(features, harmonics, weights, coefficients, path_of, edge_index,
                              skip)  # fmt: skip


def table_conv_backward_reference(
    grad: torch.Tensor,
    features: torch.Tensor,
    harmonics: torch.Tensor,
    lengths: torch.Tensor,
    table: torch.Tensor,
    inverse_spacing: torch.Tensor,
    coefficients: torch.Tensor,
    path_of: torch.Tensor,
    edge_index: torch.Tensor,
    skip: int,
    start: torch.Tensor | None = None,
    intervals: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`table_conv_backward` in torch: dL/dw from the convolution's formulas, met with
    the table's slopes for dL/dr (one number per row)."""
    paths, rows = int(path_of.max()) + 1, lengths.shape[0]
    weights, slopes = _table_weights(lengths, table, inverse_spacing, paths, start, intervals)
    grad_features, grad_harmonics, grad_weights = convolve_backward_reference(
        grad, features, harmonics, weights, coefficients, path_of, edge_index, skip
    )
    grad_lengths = (_fold(grad_weights, rows) * slopes).sum(dim=(1, 2)) * inverse_spacing
    return grad_features, grad_harmonics, grad_lengths


@torch.library.custom_op("fastmace::table_conv", mutates_args=())
def table_conv(
    features: torch.Tensor,
    harmonics: torch.Tensor,
    lengths: torch.Tensor,
    table: torch.Tensor,
    inverse_spacing: torch.Tensor,
    coefficients: torch.Tensor,
    path_of: torch.Tensor,
    edge_index: torch.Tensor,
    receiver_order: torch.Tensor,
    receiver_starts: torch.Tensor,
    sender_order: torch.Tensor,
    sender_starts: torch.Tensor,
    skip: int,
    key: str,
    start: torch.Tensor | None = None,
    intervals: int = 0,
) -> torch.Tensor:
    """(N, D1, C), (E, D2), (rows,) -> (N, D3, C); differentiable in the first three. The
    runs: fused_conv.edge_runs'. With ``start`` (rows,), one table of ``intervals`` rows per
    pair of elements, row e's from ``start[e]`` on (pair_table.py)."""
    if kernel_sources.kernels_run(features):
        from fastmace.dynamics import conv_triton

        return conv_triton.forward_from_table(
            key, features, harmonics, lengths, table, inverse_spacing, coefficients,
            edge_index[0], (receiver_order, receiver_starts), skip, start=start,
            intervals=intervals or None,
        )  # fmt: skip
    return table_conv_reference(features, harmonics, lengths, table, inverse_spacing,
                                coefficients, path_of, edge_index, skip, start,
                                intervals).contiguous()  # fmt: skip


@table_conv.register_fake
def _table_conv_shape(features, harmonics, lengths, table, inverse_spacing, coefficients, *rest):
    return features.new_empty((features.shape[0], coefficients.shape[2], features.shape[2]))


@torch.library.custom_op("fastmace::table_conv_backward", mutates_args=())
def table_conv_backward(
    grad: torch.Tensor,
    features: torch.Tensor,
    harmonics: torch.Tensor,
    lengths: torch.Tensor,
    table: torch.Tensor,
    inverse_spacing: torch.Tensor,
    coefficients: torch.Tensor,
    path_of: torch.Tensor,
    edge_index: torch.Tensor,
    receiver_order: torch.Tensor,
    receiver_starts: torch.Tensor,
    sender_order: torch.Tensor,
    sender_starts: torch.Tensor,
    skip: int,
    key: str,
    start: torch.Tensor | None = None,
    intervals: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of :func:`table_conv` (not differentiable again: forces need one order)."""
    if kernel_sources.kernels_run(features):
        from fastmace.dynamics import conv_triton

        grad_features, grad_harmonics, per_edge = conv_triton.backward_from_table(
            key, grad, features, harmonics, lengths, table, inverse_spacing, coefficients,
            edge_index, (receiver_order, receiver_starts), (sender_order, sender_starts), skip,
            start=start, intervals=intervals or None,
        )  # fmt: skip
        return grad_features, grad_harmonics, _fold(per_edge, lengths.shape[0])
    found = table_conv_backward_reference(grad, features, harmonics, lengths, table,
                                          inverse_spacing, coefficients, path_of, edge_index,
                                          skip, start, intervals)  # fmt: skip
    # Laid out as the fake says (contiguous), as fused_conv_backward's.
    return tuple(grad.contiguous() for grad in found)


@table_conv_backward.register_fake
def _table_conv_backward_shape(grad, features, harmonics, lengths, *rest):
    return torch.empty_like(features), torch.empty_like(harmonics), torch.empty_like(lengths)


def _setup(ctx, inputs, output) -> None:
    *tensors, skip, key, start, intervals = inputs
    ctx.save_for_backward(*tensors, *([] if start is None else [start]))
    ctx.skip, ctx.key, ctx.intervals, ctx.has_start = skip, key, intervals, start is not None


def _backward(ctx, grad):
    tensors, start = ctx.saved_tensors, None
    if ctx.has_start:
        *tensors, start = tensors
    grads = table_conv_backward(grad.contiguous(), *tensors, ctx.skip, ctx.key, start,
                                ctx.intervals)  # fmt: skip
    # Gradients for features, harmonics and lengths; none for the other thirteen inputs.
    return *grads, *([None] * 13)


table_conv.register_autograd(_backward, setup_context=_setup)


class TableLengths(torch.nn.Module):
    """Stands in for a block's radial table when the convolution reads the table itself: the
    block's edge features, the lengths (radial_table.DistanceEmbedding), go through."""

    weights_per_row = 1  # what a row of "weights" holds now (edge_chunks.py sizes by it)

    def forward(self, edge_feats: torch.Tensor) -> torch.Tensor:
        return edge_feats


class TabulatedConvolution(FusedConvolution):
    """:class:`FusedConvolution` that takes each row's length instead of its weights and
    interpolates them from ``table``: ``forward(node_feats, edge_attrs, lengths (rows, 1),
    edge_index)``. With a :class:`~fastmace.dynamics.pair_table.PairRadialTable`, each row
    is (length, index of its pair of elements), as pair_table.ElementPairEmbedding gives."""

    def __init__(self, convolution: FusedConvolution, table: RadialTable | PairRadialTable) -> None:
        torch.nn.Module.__init__(self)  # the same coupling: nothing of FusedConvolution's to redo
        self.register_buffer("coefficients", convolution.coefficients)
        self.register_buffer("path_of", convolution.path_of)
        self.channels, self.paths = convolution.channels, convolution.paths
        self.skip, self.key = convolution.skip, convolution.key
        self.table = table

    def forward(
        self,
        node_feats: torch.Tensor,
        edge_attrs: torch.Tensor,
        tp_weights: torch.Tensor,
        edge_index: torch.Tensor,
    ) -> torch.Tensor:
        atoms, channels = node_feats.shape[0], self.channels
        features = node_feats.reshape(atoms, -1, channels).contiguous()
        lengths, start, intervals = tp_weights.reshape(-1), None, 0
        if isinstance(self.table, PairRadialTable):
            lengths, start = self.table.lengths_and_starts(tp_weights)
            intervals = self.table.intervals
        out = table_conv(
            features, edge_attrs.contiguous(), lengths.contiguous(), self.table.coefficients,
            self.table.inverse_spacing, self.coefficients, self.path_of, edge_index,
            *edge_runs(edge_index, features), self.skip, self.key, start, intervals,
        )  # fmt: skip
        return out.reshape(atoms, -1)


def table_disagreement(
    ours: TabulatedConvolution, block: torch.nn.Module, atoms: int = 7, edges: int = 23,
    seed: int = 3,
) -> float:  # fmt: skip
    """Largest difference between ``ours`` as it runs (its kernels on CUDA) and the block's
    table followed by its convolution, on the same random inputs (lengths from 0 to past
    the table's end), relative to the largest message."""
    dtype, device = _dtype_device(block)
    generator = torch.Generator().manual_seed(seed)
    d1, d2 = ours.coefficients.shape[:2]
    reach = ours.table.intervals * ours.table.spacing * 1.05

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=generator, dtype=torch.float64).to(device, dtype)

    features, harmonics = draw(atoms, d1 * ours.channels), draw(edges, d2)
    lengths = torch.rand(edges, 1, generator=generator, dtype=torch.float64) * reach
    lengths = lengths.to(device, dtype)
    if isinstance(ours.table, PairRadialTable):  # rows of (length, pair of elements)
        pairs = ours.table.coefficients.shape[0] // ours.table.intervals
        pair = torch.randint(0, pairs, (edges, 1), generator=generator)
        lengths = torch.cat([lengths, pair.to(device, dtype)], dim=1)
    edge_index = torch.randint(0, atoms - ours.skip, (2, edges), generator=generator).to(device)
    with torch.no_grad():
        want = block.conv_tp(features, harmonics, ours.table(lengths), edge_index).double()
        got = ours(features, harmonics, lengths, edge_index).double()
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-300))


def table_convolution_model(
    model: torch.nn.Module, tolerance: float | None = None
) -> torch.nn.Module:
    """A copy of ``model`` (one made by fused_conv.fused_convolution_model from a model with
    radial tables) whose blocks read their tables inside the convolution, each checked
    against its table and convolution as they were (:func:`table_disagreement`, by default
    within 1e-5 in float32, 1e-12 in float64). Blocks without a table stay as they are, and
    so do tables per pair of elements where the model applies its cutoff after the radial
    MLP: the block multiplies what ``conv_tp_weights`` returns by it, which must then be
    weights, not lengths."""
    copy = shallow_copy(model)
    blocks = shallow_copy(model.interactions)
    copy.interactions = blocks
    cutoff_after = not getattr(model.radial_embedding, "apply_cutoff", True)
    for index, original in enumerate(model.interactions):
        table = original.conv_tp_weights
        movable = isinstance(table, RadialTable) or (
            isinstance(table, PairRadialTable) and not cutoff_after
        )
        if not (movable and isinstance(original.conv_tp, FusedConvolution)):
            continue
        dtype, _ = _dtype_device(original)
        bound = tolerance if tolerance is not None else (
            1e-12 if dtype == torch.float64 else 1e-5)  # fmt: skip
        ours = TabulatedConvolution(original.conv_tp, table)
        try:
            disagreement = table_disagreement(ours, original)
        except Exception as error:  # a kernel that does not compile or run: the same answer
            raise ConvolutionError(
                f"interaction block {index}: the table's kernels did not run: {error}"
            ) from error
        if not disagreement <= bound:
            raise ConvolutionError(
                f"interaction block {index}: the convolution reading its table differs from "
                f"the table and convolution by {disagreement:.2e} (relative), more than "
                f"{bound:.0e}"
            )
        block = shallow_copy(original)
        block.conv_tp, block.conv_tp_weights = ours, TableLengths()
        blocks[index] = block
    return copy
