"""The model's equivariant linear layers as a few batched GEMMs instead of one GEMM per path.

cuEquivariance runs an equivariant linear map (MACE's ``linear_up``, ``linear`` and the product
blocks' ``linear``) as one GEMM per path, a pair of an input and an output entry of one irrep
type: ten for the convolution's output in each of MP-0 medium's blocks. At a few hundred atoms
each is a small call whose time is its launch: at 216 atoms they were 50 launches and 0.28 of
the 0.92 ms of an H200's step (docs/validation/performance.md). The same map is one matrix per
irrep type applied to each of the type's 2l+1 components (dynamics/irreps_linear.py), so the
types whose matrices have the same shape share one batched GEMM, every component of every such
type a batch entry: a gather of the input's columns, one ``bmm`` per shape, a gather of the
output's columns (each gather left out where it would be the identity). The products and sums
are the module's own, in another order: the results agree to float32 rounding, and each map is
checked against the module it replaces when it is built.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fastmace.dynamics.irreps_linear import (
    CUEQ_LINEAR,
    IrrepsLinear,
    LinearReadError,
    Segment,
    class_name,
    is_equivariant_linear,
    read_linear,
)
from fastmace.dynamics.module_copy import with_replaced


class StackedLinear(torch.nn.Module):
    """An :class:`IrrepsLinear` computed as one batched GEMM per shape of its matrices.

    ``group_{g}_weight`` is (batch, channels in, channels out): the matrix of the irrep type of
    each batch entry; ``group_{g}_columns`` (batch, channels in) the input columns each entry
    reads (absent where the input already is that (batch, channels in) block in order);
    ``output_columns`` where each output column is found in the groups' results laid side by
    side, the last index being a column of zeros for types without inputs (absent where that
    is the identity).
    """

    def __init__(self, linear: IrrepsLinear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.description = linear.extra_repr()
        inputs = _columns_by_type(linear.inputs, linear.layout)
        outputs = _columns_by_type(linear.outputs, linear.layout)
        shapes: dict[tuple[int, int], list[str]] = {}
        for irrep in linear.irreps:
            matrix = linear.matrix(irrep)
            if matrix.shape[0] > 0:
                shapes.setdefault(tuple(matrix.shape), []).append(irrep)
        self.groups = len(shapes)
        position = torch.full((self.out_features,), -1, dtype=torch.long)
        placed = 0
        for group, irreps in enumerate(shapes.values()):
            weights, columns = [], []
            for irrep in irreps:
                components = inputs[irrep].shape[0]
                weights.append(linear.matrix(irrep).expand(components, -1, -1))
                columns.append(inputs[irrep])
                # The group's result is (nodes, batch, channels out), read row by row.
                produced = outputs[irrep].reshape(-1)
                position[produced] = placed + torch.arange(produced.numel())
                placed += produced.numel()
            weight = torch.cat(weights).contiguous()
            self.register_buffer(f"group_{group}_weight", weight)
            read = torch.cat(columns)
            in_order = read.numel() == self.in_features and torch.equal(
                read.reshape(-1), torch.arange(self.in_features)
            )
            self.register_buffer(f"group_{group}_columns", None if in_order else read)
        self.zero_column = bool((position < 0).any())
        position[position < 0] = placed  # types without inputs read the column of zeros
        identity = not self.zero_column and torch.equal(position, torch.arange(placed))
        self.register_buffer("output_columns", None if identity else position)
        # The column indices were made on the CPU: on the weights' device a call copies
        # nothing from the host (which a CUDA graph's capture refuses).
        self.to(linear.matrix(linear.irreps[0]).device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        nodes = x.shape[0]
        results = []
        for group in range(self.groups):
            weight = getattr(self, f"group_{group}_weight")
            columns = getattr(self, f"group_{group}_columns")
            batch, rows_in, _ = weight.shape
            block = x.reshape(nodes, batch, rows_in) if columns is None else x[:, columns]
            product = torch.bmm(block.transpose(0, 1), weight)  # (batch, nodes, channels out)
            results.append(product.transpose(0, 1).reshape(nodes, -1))
        if self.zero_column:
            results.append(x.new_zeros((nodes, 1)))
        joined = results[0] if len(results) == 1 else torch.cat(results, dim=1)
        return joined if self.output_columns is None else joined[:, self.output_columns]

    def extra_repr(self) -> str:
        return f"{self.description}, {self.groups} batched GEMM(s)"


def _columns_by_type(entries: Sequence[Segment], layout: str) -> dict[str, torch.Tensor]:
    """For each irrep type, (components, channels of that type) column indices: the entries of
    the type side by side in list order, as the type's matrix rows (or columns) are."""
    found: dict[str, list[torch.Tensor]] = {}
    start = 0
    for entry in entries:
        channel, component = torch.meshgrid(
            torch.arange(entry.channels), torch.arange(entry.components), indexing="xy"
        )
        if layout == "ir_mul":  # components outer: column = component * channels + channel
            offsets = component * entry.channels + channel
        else:  # e3nn's mul_ir, channels outer
            offsets = channel * entry.components + component
        found.setdefault(entry.irrep, []).append(start + offsets)
        start += entry.width
    return {irrep: torch.cat(blocks, dim=1) for irrep, blocks in found.items()}


def paths(linear: IrrepsLinear) -> int:
    """The GEMMs cuEquivariance's naive execution runs: one per (input, output) entry pair of
    one irrep type."""
    count = 0
    for entry in linear.outputs:
        count += sum(1 for source in linear.inputs if source.irrep == entry.irrep)
    return count


def stacked_model(
    model: torch.nn.Module,
) -> tuple[torch.nn.Module, list[str], dict[str, str]]:
    """A copy of ``model`` (weights shared, the model untouched) whose cuEquivariance linear
    layers with more paths than shapes run as :class:`StackedLinear`, their names, and the
    layers left as they were because their replacement differed from them on random features
    beyond rounding (name: what differed). The run then keeps those layers' GEMMs."""
    replacements: dict[str, torch.nn.Module] = {}
    refused: dict[str, str] = {}
    for name, module in model.named_modules():
        if class_name(module) != CUEQ_LINEAR or not is_equivariant_linear(module):
            continue
        try:
            linear = read_linear(module)
        except LinearReadError:
            continue  # a map of another form stays cuEquivariance's
        stacked = StackedLinear(linear)
        if stacked.groups >= paths(linear):
            continue  # no launches to save
        difference = disagreement(stacked, module, name)
        if difference is not None:  # cannot happen for a map read right: kept, recorded
            refused[name] = difference
            continue
        replacements[name] = stacked
    if not replacements:
        return model, [], refused
    return with_replaced(model, replacements), list(replacements), refused


def disagreement(stacked: StackedLinear, module: torch.nn.Module, name: str) -> str | None:
    """What differs between ``stacked`` and the layer ``name`` it replaces on random features,
    beyond float rounding (1000 epsilons of the largest output), or None."""
    parameter = next(module.parameters())
    generator = torch.Generator().manual_seed(0)
    x = torch.randn((5, stacked.in_features), generator=generator, dtype=parameter.dtype)
    x = x.to(parameter.device)
    with torch.no_grad():
        expected, got = module(x), stacked(x)
    tolerance = 1000 * torch.finfo(x.dtype).eps * max(float(expected.abs().max()), 1e-30)
    error = float((got - expected).abs().max())
    if error <= tolerance:
        return None
    return (
        f"{name}: the stacked map differs from the layer by {error:.3g} (tolerance {tolerance:.3g})"
    )
