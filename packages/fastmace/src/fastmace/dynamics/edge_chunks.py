"""Interaction blocks worked through their edges in chunks: memory that grows with atoms.

Each interaction block turns every edge's radial features into convolution weights (its radial
MLP or table) and convolves the senders' features with them into the receivers. Unchunked,
the weights of every edge exist at once, and autograd keeps them for the backward pass: for
MP-0 medium, 1,280 numbers per pair in the second block, about 0.65 MiB per atom with the rest
(157,464 atoms took 99.6 GiB on an H200). A million atoms would need several times an H200.

:class:`ChunkedConvolution` takes the block's radial function and convolution and evaluates
them a chunk of rows at a time, summing each chunk's messages into the receivers. Nothing of a
chunk is kept: the backward pass evaluates the chunk again with autograd on and sends its
gradients to the edge features, the harmonics and the node features (the radial function is
cheap to evaluate again; the convolution's forward runs twice, the price of the memory). Only
the inputs every edge already has (harmonics, radial features) stay whole.

What is summed, and in which order, matches the unchunked block: with plain edges, a chunk is
a range of edge slots and every sum runs over the slots in order, so a CPU evaluation gives
the same bits as the block itself (tests/test_edge_chunks.py). With mirrored edges the weights
are computed once per pair (dynamics/pair_radials.py) and a chunk holds a range of pairs in
both directions, so sums are reordered: equal to float rounding, not bit for bit.

A block is chunked when its radial function reads the radial features alone and gets no
separate cut-off (the blocks of :data:`~fastmace.dynamics.pair_radials.SHARED_RADIAL_BLOCKS`
with the embedding's cut-off inside, as MP-0, OMAT-0 and MACE-OFF): :func:`chunked_model`
says which.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from fastmace.dynamics.fused_conv import FusedConvolution
from fastmace.dynamics.module_copy import shallow_copy
from fastmace.dynamics.pair_radials import (
    SHARED_RADIAL_BLOCKS,
    has_symmetric_radials,
    indexed_messages,
    is_fused_cueq_convolution,
)


class ChunkingError(ValueError):
    """The model has a block whose edges cannot be worked through in chunks (says which)."""


# How a block's convolution is called (and how a chunk's weights reach its edges).
GATHERED = "gathered"  # conv(x[sender], Y, w) per edge, then summed by receiver (e3nn, cuEq CPU)
FUSED = "fused"  # conv(x, Y, w, edge_index) sums itself; w needs one row per edge
INDEXED = "indexed"  # cuEquivariance's fused convolution: w indexed per edge (row e mod rows)
OWN = "own"  # FastMACE's own convolution: reads row e mod rows by itself

# Chunks start at multiples of this many rows. A CPU's BLAS multiplies blocks of rows (of 4,
# 6, 8, 16... by kernel); a chunk starting inside a block puts its first rows in another
# kernel than the whole evaluation did, which changes their last bits (on an AMD EPYC,
# 2026-12-04, the demo model on 2,034 edges: chunks starting at multiples of 8 rows gave the
# whole evaluation's bits, every other chunking tried differed in the last bit). 192 is a
# multiple of every such block height.
ROW_ALIGNMENT = 192


class EdgeFeaturesThrough(torch.nn.Module):
    """Stands in for a chunked block's radial function: the block hands the radial features
    on to its convolution, which computes the weights chunk by chunk."""

    def forward(self, edge_feats: torch.Tensor) -> torch.Tensor:
        return edge_feats


class ChunkedConvolution(torch.nn.Module):
    """A block's radial function and convolution, evaluated ``chunk_rows`` rows at a time.

    Called as mace's fused convolution is, ``(node_feats, edge_attrs, edge_feats,
    edge_index)``, with the radial features where the weights would be; returns the summed
    messages (N, irreps). A row is an edge, or with ``pairs`` a pair of mirrored edges
    (slots e and e + E/2) whose weights are computed once.
    """

    def __init__(
        self,
        radial: torch.nn.Module,
        convolution: torch.nn.Module,
        kind: str,
        chunk_rows: int,
        pairs: bool,
    ) -> None:
        super().__init__()
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be at least 1, got {chunk_rows}")
        self.radial = radial
        self.convolution = convolution
        self.kind = kind
        self.chunk_rows = int(chunk_rows)
        self.pairs = bool(pairs)

    def forward(
        self,
        node_feats: torch.Tensor,
        edge_attrs: torch.Tensor,
        edge_feats: torch.Tensor,
        edge_index: torch.Tensor,
    ) -> torch.Tensor:
        return _ChunkedMessages.apply(self, node_feats, edge_attrs, edge_feats, edge_index)

    def chunks(self, edges: int) -> Iterator[tuple[int, int]]:
        """The row ranges [start, stop) that make up ``edges`` edges: as few as
        ``chunk_rows`` allows, of (nearly) equal size, so that no small last chunk costs a
        launch of every kernel for little work, and starting at multiples of
        ``ROW_ALIGNMENT`` rows where ``chunk_rows`` leaves room for it."""
        rows = edges // 2 if self.pairs else edges
        count = -(-rows // self.chunk_rows)
        size = -(-rows // max(count, 1))
        aligned = -(-size // ROW_ALIGNMENT) * ROW_ALIGNMENT
        if aligned <= self.chunk_rows:
            size = aligned
        for start in range(0, rows, size):
            yield start, min(start + size, rows)

    def slots(self, tensor: torch.Tensor, start: int, stop: int, dim: int = 0) -> torch.Tensor:
        """The chunk's edge slots of ``tensor``: rows start..stop, and with ``pairs`` their
        mirror images in the second half."""
        if not self.pairs:
            return tensor.narrow(dim, start, stop - start)
        half = tensor.shape[dim] // 2
        return torch.cat(
            [
                tensor.narrow(dim, start, stop - start),
                tensor.narrow(dim, half + start, stop - start),
            ],
            dim=dim,
        )

    def weights(self, edge_feats: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """The radial weights of rows start..stop (pairs: from the first half's features)."""
        return self.radial(edge_feats[start:stop])

    def messages(
        self,
        node_feats: torch.Tensor,
        edge_attrs: torch.Tensor,
        weights: torch.Tensor,
        edge_index: torch.Tensor,
    ) -> torch.Tensor:
        """One chunk's convolution: per-edge messages (GATHERED, rows in slot order) or the
        chunk's messages already summed by receiver (N, irreps)."""
        edges = edge_index.shape[1]
        if self.kind == OWN:
            return self.convolution(node_feats, edge_attrs, weights, edge_index)
        if self.kind == INDEXED:
            return indexed_messages(self.convolution, node_feats, edge_attrs, weights, edge_index)
        if weights.shape[0] != edges:
            weights = torch.cat([weights, weights])
        if self.kind == FUSED:
            return self.convolution(node_feats, edge_attrs, weights, edge_index)
        return self.convolution(node_feats, edge_attrs, weights)


def _sum_by_receiver(out: torch.Tensor, messages: torch.Tensor, receiver: torch.Tensor) -> None:
    """``out[receiver[e]] += messages[e]`` in slot order: the operation mace's scatter_sum
    does, so that a chunked sum runs over the edges in the order the whole one does."""
    out.scatter_add_(0, receiver.unsqueeze(-1).expand_as(messages), messages)


class _ChunkedMessages(torch.autograd.Function):
    """The summed messages of a :class:`ChunkedConvolution`, with a backward pass that
    evaluates each chunk again instead of keeping it."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        module: ChunkedConvolution,
        node_feats: torch.Tensor,
        edge_attrs: torch.Tensor,
        edge_feats: torch.Tensor,
        edge_index: torch.Tensor,
    ) -> torch.Tensor:
        out: torch.Tensor | None = None
        for start, stop in module.chunks(edge_index.shape[1]):
            index = module.slots(edge_index, start, stop, dim=1)
            weights = module.weights(edge_feats, start, stop)
            if module.kind == GATHERED:
                messages = module.messages(
                    node_feats[index[0]], module.slots(edge_attrs, start, stop), weights, index
                )
                if out is None:
                    out = messages.new_zeros((node_feats.shape[0], messages.shape[1]))
                _sum_by_receiver(out, messages, index[1])
            else:
                part = module.messages(
                    node_feats, module.slots(edge_attrs, start, stop), weights, index
                )
                out = part if out is None else out.add_(part)
        if out is None:  # no edges at all: the module's own output has one row per node
            raise ValueError("a chunked convolution needs at least one edge")
        ctx.module = module
        ctx.save_for_backward(node_feats, edge_attrs, edge_feats, edge_index)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        module: ChunkedConvolution = ctx.module
        node_feats, edge_attrs, edge_feats, edge_index = ctx.saved_tensors
        _, want_nodes, want_attrs, want_feats, _ = ctx.needs_input_grad
        if not (want_nodes or want_attrs or want_feats):
            return None, None, None, None, None
        grad_nodes = torch.zeros_like(node_feats) if want_nodes else None
        grad_attrs = torch.zeros_like(edge_attrs) if want_attrs else None
        grad_feats = torch.zeros_like(edge_feats) if want_feats else None
        for start, stop in module.chunks(edge_index.shape[1]):
            index = module.slots(edge_index, start, stop, dim=1)
            with torch.enable_grad():
                attrs = module.slots(edge_attrs, start, stop).detach().requires_grad_(want_attrs)
                feats = edge_feats[start:stop].detach().requires_grad_(want_feats)
                weights = module.weights(feats, 0, stop - start)
                if module.kind == GATHERED:
                    # The gathered senders' features are this chunk's own leaf: their gradient
                    # is added to the senders' rows in slot order, as x[sender]'s would be.
                    nodes = node_feats[index[0]].detach().requires_grad_(want_nodes)
                    messages = module.messages(nodes, attrs, weights, index)
                    upstream = grad_out[index[1]]
                else:
                    nodes = node_feats.detach().requires_grad_(want_nodes)
                    messages = module.messages(nodes, attrs, weights, index)
                    upstream = grad_out
            leaves = [(nodes, want_nodes), (attrs, want_attrs), (feats, want_feats)]
            wanted = [leaf for leaf, want in leaves if want]
            grads = iter(torch.autograd.grad(messages, wanted, upstream, allow_unused=True))
            if want_nodes:
                grad = next(grads)
                if grad is not None and module.kind == GATHERED:
                    grad_nodes.index_add_(0, index[0], grad)
                elif grad is not None:
                    grad_nodes.add_(grad)
            if want_attrs:
                _put_slots(module, grad_attrs, next(grads), start, stop)
            if want_feats:
                grad = next(grads)
                if grad is not None:
                    grad_feats[start:stop] = grad
        return None, grad_nodes, grad_attrs, grad_feats, None


def _put_slots(
    module: ChunkedConvolution,
    full: torch.Tensor,
    chunk: torch.Tensor | None,
    start: int,
    stop: int,
) -> None:
    """Write a chunk's per-slot gradient into its slots of the whole tensor."""
    if chunk is None:
        return
    size = stop - start
    full[start:stop] = chunk[:size]
    if module.pairs:
        half = full.shape[0] // 2
        full[half + start : half + stop] = chunk[size:]


# ----------------------------------------------------------------------------- from a model


def chunked_model(model: torch.nn.Module, chunk_rows: int, *, pairs: bool) -> torch.nn.Module:
    """A copy of ``model`` whose interaction blocks work through their edges in chunks.

    The copy shares every weight with ``model``. With ``pairs`` it must only be given mirrored
    edges, and the weights are computed once per pair (when the model's radial functions allow
    it, as for :func:`~fastmace.dynamics.pair_radials.pair_shared_model`). Raises
    :class:`ChunkingError` naming a block that cannot be chunked.
    """
    refusal = chunking_refusal(model)
    if refusal is not None:
        raise ChunkingError(refusal)
    interactions = model.interactions
    pairs = pairs and has_symmetric_radials(model)
    copy = shallow_copy(model)
    blocks = shallow_copy(interactions)
    copy.interactions = blocks
    for index, original in enumerate(interactions):
        block = shallow_copy(original)
        block.conv_tp = ChunkedConvolution(
            original.conv_tp_weights,
            original.conv_tp,
            _convolution_kind(original),
            chunk_rows,
            pairs,
        )
        block.conv_tp_weights = EdgeFeaturesThrough()
        # mace's blocks call a convolution with this attribute as (x, Y, w, edge_index).
        block.conv_fusion = True
        blocks[index] = block
    return copy


def chunking_refusal(model: torch.nn.Module) -> str | None:
    """Why ``model``'s blocks cannot work through their edges in chunks; None when they can."""
    interactions = getattr(model, "interactions", None)
    embedding = getattr(model, "radial_embedding", None)
    if interactions is None or embedding is None:
        return f"a {type(model).__name__} has no interaction blocks to chunk"
    if not getattr(embedding, "apply_cutoff", True):
        return (
            "the model applies its cut-off to the convolution weights outside the radial "
            "function (apply_cutoff=False), which chunked evaluation does not handle"
        )
    for index, block in enumerate(interactions):
        name = type(block).__name__
        if name not in SHARED_RADIAL_BLOCKS or not hasattr(block, "conv_tp_weights"):
            return (
                f"interaction block {index} is a {name}, whose radial weights read more than "
                f"the radial features; chunked evaluation handles "
                f"{', '.join(sorted(SHARED_RADIAL_BLOCKS))}"
            )
    return None


def _convolution_kind(block: torch.nn.Module) -> str:
    if isinstance(block.conv_tp, FusedConvolution):
        return OWN
    if is_fused_cueq_convolution(block):
        return INDEXED
    return FUSED if hasattr(block, "conv_fusion") else GATHERED


# Per row, the radial weights are held about this many times over in an unchunked evaluation:
# the weights themselves (kept for the backward pass), their gradient, and the radial
# function's own intermediates (an MLP's hidden layers, a table's interval and offsets).
ROW_COPIES = 3


def bytes_per_row(model: torch.nn.Module) -> int:
    """What one row (an edge, or a mirrored pair) of an unchunked evaluation holds in radial
    weights and their intermediates, summed over the interaction blocks (every block's weights
    are kept until the backward pass)."""
    itemsize = next(model.parameters()).element_size()
    widths = [radial_width(block.conv_tp_weights) for block in model.interactions]
    return ROW_COPIES * itemsize * sum(widths)


def widest_row(model: torch.nn.Module) -> int:
    """The most radial weights one row gets in any interaction block."""
    return max(radial_width(block.conv_tp_weights) for block in model.interactions)


def radial_width(radial: torch.nn.Module) -> int:
    """The number of weights a radial function gives per edge (MLP or table)."""
    if (stated := getattr(radial, "weights_per_row", None)) is not None:  # table_conv's lengths
        return int(stated)
    coefficients = getattr(radial, "coefficients", None)
    if isinstance(coefficients, torch.Tensor):  # a RadialTable: (intervals, 4, W)
        return int(coefficients.shape[-1])
    if hasattr(radial, "radial"):  # a PairSharedRadial
        return radial_width(radial.radial)
    linears = [m for m in radial.modules() if isinstance(m, torch.nn.Linear)]
    if linears:
        return int(linears[-1].out_features)
    sizes = getattr(radial, "hs", None)  # e3nn's FullyConnectedNet
    if sizes:
        return int(sizes[-1])
    raise ChunkingError(f"cannot tell how many weights a {type(radial).__name__} gives per edge")
