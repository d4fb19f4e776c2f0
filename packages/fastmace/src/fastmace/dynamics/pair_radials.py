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
"""

from __future__ import annotations

import torch

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
    """A radial MLP evaluated on the first half of mirrored edges, its output used twice."""

    def __init__(self, radial: torch.nn.Module) -> None:
        super().__init__()
        self.radial = radial

    def forward(self, edge_feats: torch.Tensor) -> torch.Tensor:
        half = edge_feats.shape[0] // 2
        weights = self.radial(edge_feats[:half])
        return torch.cat([weights, weights])


def pair_shared_model(model: torch.nn.Module) -> torch.nn.Module | None:
    """A copy of ``model`` whose eligible blocks compute radial weights once per pair.

    The copy shares every weight with ``model`` (only the module objects on the path to a
    changed block are new) and must only be given mirrored edges. None when no block of the
    model can share its weights (an unknown block class, or a distance transform that is not
    known to be symmetric): then the model runs as it is.
    """
    interactions = getattr(model, "interactions", None)
    embedding = getattr(model, "radial_embedding", None)
    if interactions is None or embedding is None:
        return None
    transform = getattr(embedding, "distance_transform", None)
    if transform is not None and type(transform).__name__ not in SYMMETRIC_TRANSFORMS:
        return None
    eligible = [
        index
        for index, block in enumerate(interactions)
        if type(block).__name__ in SHARED_RADIAL_BLOCKS and hasattr(block, "conv_tp_weights")
    ]
    if not eligible:
        return None
    shared = shallow_copy(model)
    blocks = shallow_copy(interactions)
    shared.interactions = blocks
    for index in eligible:
        block = shallow_copy(interactions[index])
        block.conv_tp_weights = PairSharedRadial(interactions[index].conv_tp_weights)
        blocks[index] = block
    return shared
