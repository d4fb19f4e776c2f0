"""Radial tables for each ordered pair of the run's elements (MH-1's blocks, distance transforms).

radial_table.py tabulates blocks whose convolution weights are a function of the distance
alone. MH-1's blocks (``RealAgnosticResidualNonLinearInteractionBlock``) feed their radial MLP
the radial features next to per-element embeddings of the sender and the receiver, and feed the
same to a second MLP (``density_fn``) whose output normalises the messages; a distance
transform (Agnesi, Soft) makes the radial features themselves depend on the two elements. Each
of these is still a function of the distance and of the ordered pair of elements (a, b): for a
run of S elements, S^2 functions of the distance. Each is tabulated as radial_table.py
tabulates MP-0's one, to the same tolerance, and the tables of a block are stacked so that one
lookup kernel serves every edge: edge e reads the table of its pair from row ``start[e]`` on.

At 1,728 atoms of the MH-1 template these MLPs are 8.2 of the 14.8 ms of a compiled MD step on
an H100 (first layer 1,034 wide; 2,048 and 1,280 weights per edge), in float32 GEMMs on CUDA
cores (benchmarks/results/2026-12-06-h100/stage89-profile).

The block's own forward still runs, as trained: the model's radial embedding is replaced by
:class:`ElementPairEmbedding` (each edge's length and the index of its pair of elements, and
the cutoff where the model applies it outside the embedding), the per-element embeddings by
:class:`NoFeatures` (the tables hold what they contributed), and each MLP by a
:class:`PairRadialTable`. The density MLP's output is tabulated before the block's tanh, square
and cutoff, which the block applies itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fastmace.dynamics.edge_chunks import radial_width
from fastmace.dynamics.module_copy import shallow_copy
from fastmace.dynamics.radial_table import (
    FIRST_INTERVALS,
    TABLE_BLOCKS,
    TABLE_TOLERANCE,
    RadialTable,
    TableError,
    TableReport,
    _float64_copy,
    radial_table,
)

# mace-torch 0.3.16's blocks whose radial MLPs (conv_tp_weights, and density_fn where there is
# one) read the radial features and, in the non-linear block, per-element embeddings of the
# edge's two atoms (source_embedding, target_embedding) and nothing else.
PAIR_TABLE_BLOCKS = TABLE_BLOCKS | {
    "RealAgnosticDensityInteractionBlock",
    "RealAgnosticDensityResidualInteractionBlock",
    "RealAgnosticResidualNonLinearInteractionBlock",
}
# The tables of all blocks together may take this much memory (S^2 grows fast with S: MH-1
# with 10 elements and 256 intervals needs about 1.4 GB).
MOST_MEGABYTES = 2048.0


def pair_table_refusal(model: torch.nn.Module) -> str | None:
    """Why ``model``'s radial functions cannot be tabulated per pair of elements, or None."""
    embedding = getattr(model, "radial_embedding", None)
    interactions = getattr(model, "interactions", None)
    if embedding is None or interactions is None:
        return f"a {type(model).__name__} has no radial embedding and interaction blocks"
    for block in interactions:
        kind = type(block).__name__
        if kind not in PAIR_TABLE_BLOCKS or not hasattr(block, "conv_tp_weights"):
            return f"its {kind} feeds its radial MLP more than the distance and the elements"
        embeddings = (hasattr(block, "source_embedding"), hasattr(block, "target_embedding"))
        if any(embeddings) and not all(embeddings):
            return f"its {kind} embeds the elements of one end of an edge only"
    return None


def pair_tabulated_model(
    model: torch.nn.Module,
    species: Sequence[int],
    tolerance: float = TABLE_TOLERANCE,
    most_megabytes: float = MOST_MEGABYTES,
) -> tuple[torch.nn.Module, TableReport]:
    """A copy of ``model`` whose blocks read their radial functions from one table per ordered
    pair of the elements ``species`` (atomic numbers).

    The copy shares every other weight with ``model``. Nodes of another element (FastMACE's
    padding node) read the first element's tables: their results are never used. Raises
    :class:`TableError` for a model that :func:`pair_table_refusal` refuses, for tables that
    miss ``tolerance`` or would take more than ``most_megabytes``.
    """
    refusal = pair_table_refusal(model)
    if refusal is not None:
        raise TableError(f"the radial weights cannot be tabulated: {refusal}")
    numbers = [int(z) for z in model.atomic_numbers]
    missing = [z for z in species if z not in numbers]
    if missing:
        raise TableError(
            f"the model has no element of atomic number {missing[0]}: its radial functions "
            "cannot be tabulated for it; run without radial_table"
        )
    columns = list(dict.fromkeys(numbers.index(int(z)) for z in species))
    pairs = [(a, b) for a in columns for b in columns]
    like = next(model.interactions[0].conv_tp_weights.parameters())
    widths = [_output_width(block) for block in model.interactions]
    smallest = sum(len(pairs) * FIRST_INTERVALS * 4 * w * like.element_size() for w in widths)
    if smallest / 2**20 > most_megabytes:
        raise TableError(_too_large(len(columns), smallest / 2**20, most_megabytes))
    embedding = model.radial_embedding
    cutoff_outside = not getattr(embedding, "apply_cutoff", True)
    r_max = float(model.r_max)
    tabulated = shallow_copy(model)
    tabulated.radial_embedding = ElementPairEmbedding(
        columns, len(numbers), embedding.cutoff_fn if cutoff_outside else None, like.device
    )
    blocks = shallow_copy(model.interactions)
    tabulated.interactions = blocks
    inputs = _PairInputs(embedding, model.atomic_numbers, len(numbers), pairs, like.device)
    tables: list[PairRadialTable] = []
    for index, original in enumerate(model.interactions):
        block = shallow_copy(original)
        elements = _element_features(original, inputs)
        for name in ("conv_tp_weights", "density_fn"):
            if hasattr(original, name):
                radial = inputs.function(_float64_copy(getattr(original, name)), elements)
                left = most_megabytes - sum(t.megabytes for t in tables)
                table = PairRadialTable.build(radial, len(pairs), r_max, tolerance, like, left)
                setattr(block, name, table)
                tables.append(table)
        if hasattr(original, "source_embedding"):
            block.source_embedding, block.target_embedding = NoFeatures(), NoFeatures()
        blocks[index] = block
    megabytes = sum(t.megabytes for t in tables)
    if megabytes > most_megabytes:
        raise TableError(_too_large(len(columns), megabytes, most_megabytes))
    report = TableReport(
        blocks=len(model.interactions),
        intervals=max(t.intervals for t in tables),
        spacing_A=min(t.spacing for t in tables),
        max_relative_error=max(t.max_relative_error for t in tables),
        megabytes=megabytes,
        element_pairs=len(pairs),
    )
    return tabulated, report


def _too_large(elements: int, megabytes: float, most: float) -> str:
    return (
        f"the radial weights cannot be tabulated: {elements} elements need {elements**2} "
        f"tables per block, {megabytes:.0f} MB or more, above {most:.0f} MB; run without "
        "radial_table"
    )


def _output_width(block: torch.nn.Module) -> int:
    """The values a block's tables hold per distance: its weights, and its density's one."""
    return radial_width(block.conv_tp_weights) + int(hasattr(block, "density_fn"))


class _PairInputs:
    """The radial features of every pair of elements at given distances, in float64."""

    def __init__(
        self,
        embedding: torch.nn.Module,
        atomic_numbers: torch.Tensor,
        num_attrs: int,
        pairs: list[tuple[int, int]],
        device: torch.device,
    ) -> None:
        self.embedding = _float64_copy(embedding)
        self.atomic_numbers = atomic_numbers
        self.pairs = pairs
        # Two nodes per pair (a, then b): node_attrs one-hot, as the model's are.
        attrs = torch.zeros(2 * len(pairs), num_attrs, dtype=torch.float64, device=device)
        for p, (a, b) in enumerate(pairs):
            attrs[2 * p, a] = attrs[2 * p + 1, b] = 1.0
        self.node_attrs = attrs

    def features(self, r: torch.Tensor) -> torch.Tensor:
        """(pairs, len(r), F): each pair's radial features, the cutoff left as the model
        leaves it (inside the features, or applied by the block)."""
        m = r.shape[0]
        lengths = r.clamp_min(1e-9)[:, None].repeat(len(self.pairs), 1)  # divides by r
        first = torch.arange(len(self.pairs), device=r.device).repeat_interleave(m) * 2
        edge_index = torch.stack([first, first + 1])
        features, _ = self.embedding(lengths, self.node_attrs, edge_index, self.atomic_numbers)
        return features.reshape(len(self.pairs), m, -1)

    def function(self, mlp: torch.nn.Module, elements: torch.Tensor | None):
        """r -> (values, slopes), each (len(r), pairs * W): ``mlp`` of each pair's features
        (and its element embeddings ``elements``, (pairs, E)) side by side."""

        def values(r: torch.Tensor) -> torch.Tensor:
            features = self.features(r)
            if elements is not None:
                extra = elements[:, None, :].expand(-1, r.shape[0], -1)
                features = torch.cat([features, extra], dim=-1)
            out = mlp(features.reshape(-1, features.shape[-1]))
            out = out.reshape(len(self.pairs), r.shape[0], -1)  # (pairs, M, W)
            return out.permute(1, 0, 2).reshape(r.shape[0], -1)

        def both(r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            with torch.no_grad():
                return torch.func.jvp(values, (r,), (torch.ones_like(r),))

        return both


def _element_features(block: torch.nn.Module, inputs: _PairInputs) -> torch.Tensor | None:
    """(pairs, 2 D): the sender's and the receiver's embeddings of each pair, or None for a
    block without them. Computed once (they do not depend on the distance), by the block's
    own modules in the model's dtype, as a run computes them: a linear map of a one-hot row
    (cuEquivariance's, whose float64 copy would not run) picks one row of its weights."""
    if not hasattr(block, "source_embedding"):
        return None
    like = next(block.conv_tp_weights.parameters())
    attrs = inputs.node_attrs.to(like.dtype)
    with torch.no_grad():
        source = block.source_embedding(attrs)[0::2]
        target = block.target_embedding(attrs)[1::2]
    return torch.cat([source, target], dim=-1).to(torch.float64)


class ElementPairEmbedding(torch.nn.Module):
    """Stands in for mace's radial embedding: each edge's features are its length and the
    index of its ordered pair of elements (as a float, exact below 2^24), which the blocks'
    :class:`PairRadialTable` read; the cutoff is returned where the model applies it outside
    the embedding (``apply_cutoff=False``), else None."""

    def __init__(
        self,
        columns: Sequence[int],
        num_attrs: int,
        cutoff_fn: torch.nn.Module | None,
        device: torch.device,
    ) -> None:
        super().__init__()
        local = torch.zeros(num_attrs, dtype=torch.long, device=device)
        local[torch.tensor(list(columns), device=device)] = torch.arange(
            len(columns), device=device
        )
        self.register_buffer("element_of_column", local)
        self.elements = len(columns)
        self.cutoff_fn = cutoff_fn
        self.apply_cutoff = cutoff_fn is None  # as chunking and pair_radials read it

    def forward(
        self,
        edge_lengths: torch.Tensor,
        node_attrs: torch.Tensor,
        edge_index: torch.Tensor,
        atomic_numbers: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        element = self.element_of_column[node_attrs.argmax(dim=1)]
        pair = element[edge_index[0]] * self.elements + element[edge_index[1]]
        features = torch.cat([edge_lengths, pair.to(edge_lengths.dtype)[:, None]], dim=1)
        cutoff = None if self.cutoff_fn is None else self.cutoff_fn(edge_lengths)
        return features, cutoff


class NoFeatures(torch.nn.Module):
    """Stands in for a block's per-element embedding: nothing, as the tables hold it."""

    def forward(self, node_attrs: torch.Tensor) -> torch.Tensor:
        return node_attrs[:, :0]


class PairRadialTable(torch.nn.Module):
    """A radial function tabulated for each ordered pair of elements: ``coefficients`` holds
    each pair's :class:`~fastmace.dynamics.radial_table.RadialTable` rows one after another,
    (pairs x intervals, 4, W). Reads the features of :class:`ElementPairEmbedding`."""

    def __init__(
        self, coefficients: torch.Tensor, intervals: int, spacing: float, error: float
    ) -> None:
        super().__init__()
        self.register_buffer("coefficients", coefficients.contiguous())
        self.register_buffer("inverse_spacing", coefficients.new_tensor(1.0 / spacing))
        self.intervals = int(intervals)
        self.spacing = float(spacing)
        self.max_relative_error = float(error)

    @classmethod
    def build(
        cls,
        radial,
        pairs: int,
        r_max: float,
        tolerance: float,
        like: torch.Tensor,
        most_megabytes: float | None = None,
    ) -> PairRadialTable:
        """Tabulate ``radial`` (r -> values and slopes, (len(r), pairs * W)): all pairs share
        the intervals, doubled until every pair's table meets ``tolerance``, and refused
        before the tables outgrow ``most_megabytes``."""
        table = RadialTable.build(radial, r_max, tolerance, like, most_megabytes)
        intervals, _, columns = table.coefficients.shape
        stacked = table.coefficients.reshape(intervals, 4, pairs, columns // pairs)
        stacked = stacked.permute(2, 0, 1, 3).reshape(pairs * intervals, 4, columns // pairs)
        return cls(stacked, intervals, table.spacing, table.max_relative_error)

    @property
    def megabytes(self) -> float:
        return self.coefficients.numel() * self.coefficients.element_size() / 2**20

    def lengths_and_starts(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's length and the first row of its pair's table, from the features of
        :class:`ElementPairEmbedding`."""
        return features[:, 0].contiguous(), features[:, 1].long() * self.intervals

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        lengths, start = self.lengths_and_starts(features)
        return radial_table(lengths, self.coefficients, self.inverse_spacing, start, self.intervals)
