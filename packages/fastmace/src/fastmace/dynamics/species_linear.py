"""Per-element linear maps in place of MACE's skip tensor product, for the elements of one run.

An interaction block's ``skip_tp`` is a tensor product of the node features with the node
attributes, a one-hot vector over the model's elements, computed as an outer product and a
GEMM as wide as features x elements. For an atom of element e it is one linear map, x @ M_e.
:func:`specialise_for_species` replaces each such ``skip_tp`` by a :class:`SpeciesLinear`
holding M_e for the run's elements only, read off the module itself and checked against it.
Checked against mace-torch 0.3.16 (``mace/modules/blocks.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from fastmace.dynamics.module_copy import shallow_copy
from fastmace.dynamics.reduced_matmul import matmul
from fastmace.models.checkpoint import import_mace

# mace-torch 0.3.16's interaction blocks that call ``self.skip_tp(features, node_attrs)``; the
# others (RealAgnosticResidualNonLinearInteractionBlock: a Linear of the features alone) are
# left as they are.
ELEMENT_SKIP_TP_BLOCKS = (
    "RealAgnosticInteractionBlock",
    "RealAgnosticResidualInteractionBlock",
    "RealAgnosticDensityInteractionBlock",
    "RealAgnosticDensityResidualInteractionBlock",
)
_CHECK_NODES_PER_ELEMENT = 8


class SpecialisationError(RuntimeError):
    """A model could not be specialised, or the specialised block disagrees with the original."""


class SpeciesLinear(torch.nn.Module):
    """``node_feats @ M_e`` for each node's element e, for the elements of one run.

    Exact wherever ``node_attrs`` is one-hot over the model's elements: the other elements'
    terms are multiplied by exact zeros. A node of no listed element gets NaN (rather than a
    silently missing term). One GEMM, static shapes, no host synchronisation.

    Args:
        matrices: (E, d_in, d_out) the map of each listed element, in the model's dtype.
        columns: the node-attribute column of each listed element, in the order of
            ``matrices``.
        num_attrs: the width of the node attributes (the number of the model's elements).
    """

    def __init__(self, matrices: torch.Tensor, columns: Sequence[int], num_attrs: int) -> None:
        super().__init__()
        count, self.in_features, self.out_features = matrices.shape
        if count != len(columns):
            raise ValueError(f"{count} matrices for {len(columns)} columns")
        self.columns = tuple(int(column) for column in columns)
        self.num_attrs = int(num_attrs)
        self.precision = "float32"  # its GEMM's (dynamics/reduced_matmul.py): "bf16" in that tier
        # (d_in, E * d_out): every element's map in one GEMM.
        stacked = matrices.detach().permute(1, 0, 2).reshape(self.in_features, -1)
        self.register_buffer("matrices", stacked.contiguous())
        self.register_buffer(
            "attr_columns", torch.tensor(self.columns, dtype=torch.int64, device=matrices.device)
        )

    def forward(self, node_feats: torch.Tensor, node_attrs: torch.Tensor) -> torch.Tensor:
        weights = node_attrs.index_select(-1, self.attr_columns).unsqueeze(-1)  # (N, E, 1)
        per_element = matmul(node_feats, self.matrices, self.precision).unflatten(
            -1, (len(self.columns), -1)
        )
        out = (weights * per_element).sum(-2)
        listed = weights.sum(-2) != 0  # (N, 1)
        return out.masked_fill(~listed, float("nan"))

    def matrix(self, column: int) -> torch.Tensor:
        """(d_in, d_out) the map of the element in node-attribute column ``column``."""
        index = self.columns.index(column)
        return self.matrices[:, index * self.out_features : (index + 1) * self.out_features]

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"columns={self.columns}, num_attrs={self.num_attrs}"
        )


def specialise_for_species(model: torch.nn.Module, species: Iterable[int]) -> torch.nn.Module:
    """A copy of the mace-torch ``model`` whose element skip tensor products are SpeciesLinear.

    Only the elements in ``species`` (atomic numbers, each one of ``model.atomic_numbers``)
    are kept: the copy gives NaN for atoms of any other element. Each replaced block is
    checked on random features against the original; SpecialisationError if they disagree
    beyond rounding. ``model`` is not changed.
    """
    model_species = [int(z) for z in model.atomic_numbers]
    wanted = sorted({int(z) for z in species})
    unknown = [z for z in wanted if z not in model_species]
    if not wanted:
        raise SpecialisationError("no elements given: a model for no atoms has nothing to keep")
    if unknown:
        raise SpecialisationError(
            f"atomic numbers {unknown} are not among the model's elements {model_species}"
        )
    columns = [model_species.index(z) for z in wanted]
    # New containers along the path to each replaced module, every other module shared with
    # ``model``: no deep copy (cuEquivariance's naive modules and OpenEquivariance's
    # convolution do not survive one on CUDA) and no second copy of the weights.
    specialised = shallow_copy(model)
    interactions = getattr(model, "interactions", None)
    if interactions is None:
        return specialised
    blocks = shallow_copy(interactions)
    specialised.interactions = blocks
    for index, block in enumerate(interactions):
        if not _has_element_skip_tp(block):
            continue
        name = f"interactions.{index}.skip_tp"
        original = block.skip_tp
        replacement = species_linear(original, columns, len(model_species), name)
        replacement.train(original.training)
        check_species_linear(original, replacement, name)
        changed = shallow_copy(block)
        changed.skip_tp = replacement
        blocks[index] = changed
    return specialised


def species_linear(
    skip_tp: torch.nn.Module, columns: Sequence[int], num_attrs: int, name: str = "skip_tp"
) -> SpeciesLinear:
    """The SpeciesLinear of ``skip_tp`` for the elements in node-attribute ``columns``.

    The tensor product is bilinear, so its value on the identity (d_in nodes) with the
    one-hot attributes of element e is M_e, row by row.
    """
    d_in, width, _ = _dimensions(skip_tp)
    if width != num_attrs:
        raise SpecialisationError(
            f"{name} takes {width} node attributes, but the model has {num_attrs} elements: "
            "its second input is not the one-hot element vector"
        )
    if isinstance(skip_tp, SpeciesLinear) and not set(columns) <= set(skip_tp.columns):
        raise SpecialisationError(
            f"{name} was specialised for node-attribute columns {list(skip_tp.columns)}, not "
            f"{sorted(columns)}: specialise the original model instead"
        )
    dtype, device = _dtype_and_device(skip_tp)
    identity = torch.eye(d_in, dtype=dtype, device=device)
    matrices = []
    with torch.no_grad():
        for column in columns:
            attrs = torch.zeros((d_in, num_attrs), dtype=dtype, device=device)
            attrs[:, column] = 1.0
            matrices.append(skip_tp(identity, attrs))
    return SpeciesLinear(torch.stack(matrices), columns, num_attrs)


def check_species_linear(
    original: torch.nn.Module, replacement: SpeciesLinear, name: str = "skip_tp"
) -> None:
    """SpecialisationError unless ``replacement`` gives ``original``'s output to rounding.

    Random features on nodes of each of the replacement's elements; the tolerance is 1000
    machine epsilons of the largest output.
    """
    dtype, device = _dtype_and_device(original)
    columns = torch.tensor(replacement.columns).repeat_interleave(_CHECK_NODES_PER_ELEMENT)
    generator = torch.Generator().manual_seed(0)
    feats = torch.randn((len(columns), replacement.in_features), generator=generator)
    feats = feats.to(dtype=dtype, device=device)
    attrs = torch.zeros((len(columns), replacement.num_attrs), dtype=dtype, device=device)
    attrs[torch.arange(len(columns)), columns.to(device)] = 1.0
    with torch.no_grad():
        expected = original(feats, attrs)
        actual = replacement(feats, attrs)
    tolerance = 1000 * torch.finfo(dtype).eps * float(expected.abs().max())
    error = float((actual - expected).abs().max())
    if not error <= tolerance:
        raise SpecialisationError(
            f"{name}: the per-element maps differ from the tensor product by {error:.3g} "
            f"(tolerance {tolerance:.3g}, {dtype}): the module is not the bilinear map of "
            "features and one-hot attributes this replacement assumes, or matrix products "
            "ran in reduced precision (TF32: torch.backends.cuda.matmul.allow_tf32)"
        )


def _has_element_skip_tp(block: torch.nn.Module) -> bool:
    import_mace()
    from mace.modules import blocks

    kinds = tuple(getattr(blocks, kind) for kind in ELEMENT_SKIP_TP_BLOCKS)
    # The exact class: a subclass may call its skip_tp differently.
    return type(block) in kinds and hasattr(block, "skip_tp")


def _dimensions(skip_tp: torch.nn.Module) -> tuple[int, int, int]:
    """(d_in, node-attribute width, d_out) of an e3nn or cuEquivariance tensor product."""
    if isinstance(skip_tp, SpeciesLinear):
        return skip_tp.in_features, skip_tp.num_attrs, skip_tp.out_features
    return skip_tp.irreps_in1.dim, skip_tp.irreps_in2.dim, skip_tp.irreps_out.dim


def _dtype_and_device(module: torch.nn.Module) -> tuple[torch.dtype, torch.device]:
    weight = module.matrices if isinstance(module, SpeciesLinear) else next(module.parameters())
    return weight.dtype, weight.device
