"""Radial weights computed once per pair of atoms instead of once per edge.

Each of MACE's interaction blocks turns every edge's radial features into the weights of its
convolution with a radial MLP (``conv_tp_weights``): at 13,824 atoms of MP-0 medium that is
[545k, 64] x [64, 1280] and the hidden layers, 8 ms of a 30 ms step on an H200
(docs/validation/performance.md). In the blocks listed in :data:`SHARED_RADIAL_BLOCKS` the
MLP's input is the radial embedding alone, a function of the pair's distance and, through a
distance transform, of the two elements symmetrically: edges i -> j and j -> i get the same
weights. When the model's edges come *mirrored* (`Edges.mirrored`: slot ``e + E/2`` holds
slot ``e``'s pair the other way round, as `NeighbourList.cutoff_edges` lays them out), the MLP
runs on the first half and its output serves both halves. Forces stay exact: a pair's two
distances are the same function of the positions, so the gradient reaching the first half's
distance is the one both edges would have sent.

How the weights reach both halves: cuEquivariance's fused convolution (mace's cuEq backend on
a GPU) takes an index for each operand, so it reads edge ``e``'s weights from row ``e mod E/2``
of the half-size tensor (:class:`PairIndexedConvolution`), and FastMACE's own convolution
(dynamics/fused_conv.py) reads them so by itself; any other convolution gets the
weights copied into both halves, which costs a copy forward and a sum backward (about 3 ms of
the 29 ms step at 13,824 atoms on an H200, docs/validation/performance.md).
"""

from __future__ import annotations

import torch

from fastmace.dynamics.fused_conv import FusedConvolution
from fastmace.dynamics.module_copy import shallow_copy

# Blocks whose radial MLP reads `edge_feats` alone (mace-torch 0.3.16, modules/blocks.py).
# The non-linear and attention blocks append per-element embeddings of the sender and the
# receiver, which differ between the two directions of a pair.
SHARED_RADIAL_BLOCKS = frozenset(
    {
        "RealAgnosticInteractionBlock",
        "RealAgnosticResidualInteractionBlock",
        "RealAgnosticDensityInteractionBlock",
        "RealAgnosticDensityResidualInteractionBlock",
    }
)
# Distance transforms that treat the pair's two elements symmetrically (their mean radius).
SYMMETRIC_TRANSFORMS = frozenset({"AgnesiTransform", "SoftTransform"})


class PairSharedRadial(torch.nn.Module):
    """A radial MLP evaluated on the first half of mirrored edges.

    With ``both_halves`` its output is repeated for the second half (E rows); without, it is
    one row per pair (E/2 rows), for a convolution that reads a pair's row itself.
    """

    def __init__(self, radial: torch.nn.Module, both_halves: bool = True) -> None:
        super().__init__()
        self.radial = radial
        self.both_halves = both_halves

    def forward(self, edge_feats: torch.Tensor) -> torch.Tensor:
        half = edge_feats.shape[0] // 2
        weights = self.radial(edge_feats[:half])
        return torch.cat([weights, weights]) if self.both_halves else weights


class PairIndexedConvolution(torch.nn.Module):
    """mace's fused cuEquivariance convolution with one row of weights per pair.

    The same call as mace-torch's ``with_cueq_conv_fusion`` (senders index the node features,
    receivers the output), plus an index for the weights: edge ``e`` reads row ``e mod E/2``.
    """

    def __init__(self, convolution: torch.nn.Module) -> None:
        super().__init__()
        self.convolution = convolution

    def forward(
        self,
        node_feats: torch.Tensor,
        edge_attrs: torch.Tensor,
        tp_weights: torch.Tensor,
        edge_index: torch.Tensor,
    ) -> torch.Tensor:
        return indexed_messages(self.convolution, node_feats, edge_attrs, tp_weights, edge_index)


def indexed_messages(
    convolution: torch.nn.Module,
    node_feats: torch.Tensor,
    edge_attrs: torch.Tensor,
    weights: torch.Tensor,
    edge_index: torch.Tensor,
) -> torch.Tensor:
    """mace's fused cuEquivariance ``convolution`` with edge e reading weight row e mod rows
    (senders index the node features, receivers the output)."""
    slots = torch.arange(edge_index.shape[1], device=edge_index.device)
    rows = torch.remainder(slots, weights.shape[0])
    return convolution.original_forward(
        [weights, node_feats, edge_attrs],
        {0: rows, 1: edge_index[0]},
        {0: node_feats},
        {0: edge_index[1]},
    )[0]


def pair_shared_model(model: torch.nn.Module) -> torch.nn.Module | None:
    """A copy of ``model`` whose eligible blocks compute radial weights once per pair.

    The copy shares every weight with ``model`` (only the module objects on the path to a
    changed block are new) and must only be given mirrored edges. None when no block of the
    model can share its weights (an unknown block class, or a distance transform that is not
    known to be symmetric): then the model runs as it is.
    """
    interactions = getattr(model, "interactions", None)
    embedding = getattr(model, "radial_embedding", None)
    if interactions is None or embedding is None or not has_symmetric_radials(model):
        return None
    eligible = [
        index
        for index, block in enumerate(interactions)
        if type(block).__name__ in SHARED_RADIAL_BLOCKS and hasattr(block, "conv_tp_weights")
    ]
    if not eligible:
        return None
    # The cut-off multiplies the weights between the MLP and the convolution when the radial
    # embedding leaves it out (apply_cutoff=False): per edge, so the weights need E rows.
    cutoff_inside = getattr(embedding, "apply_cutoff", True)
    shared = shallow_copy(model)
    blocks = shallow_copy(interactions)
    shared.interactions = blocks
    for index in eligible:
        original = interactions[index]
        block = shallow_copy(original)
        ours = isinstance(original.conv_tp, FusedConvolution)  # reads row e mod rows itself
        indexed = cutoff_inside and (ours or is_fused_cueq_convolution(original))
        block.conv_tp_weights = PairSharedRadial(original.conv_tp_weights, not indexed)
        if indexed and not ours:
            block.conv_tp = PairIndexedConvolution(original.conv_tp)
        blocks[index] = block
    return shared


def has_symmetric_radials(model: torch.nn.Module) -> bool:
    """Whether the model's radial features treat a pair's two elements alike (no distance
    transform, or a symmetric one): then a pair's two edges have the same features."""
    embedding = getattr(model, "radial_embedding", None)
    transform = getattr(embedding, "distance_transform", None)
    return transform is None or type(transform).__name__ in SYMMETRIC_TRANSFORMS


def is_fused_cueq_convolution(block: torch.nn.Module) -> bool:
    """Whether the block's convolution is mace's fused cuEquivariance one (indexable)."""
    convolution = getattr(block, "conv_tp", None)
    kind = type(convolution)
    return (
        hasattr(block, "conv_fusion")
        and hasattr(convolution, "original_forward")
        and kind.__name__ == "SegmentedPolynomial"
        and kind.__module__.startswith("cuequivariance_torch")
    )
