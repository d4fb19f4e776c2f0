"""The model's equivariant linear layers as plain GEMMs, one per irrep type, in a chosen precision.

An equivariant linear map between irreps (MACE's ``linear_up``, ``linear``, the product
blocks' linear and the readouts; cuEquivariance's ``Linear`` or e3nn's ``o3.Linear``) mixes
channels only within each irrep type: for irrep type r of dimension 2l+1, every component m
of the output is ``x[m] @ W_r`` with one (channels in, channels out) matrix W_r. So the map is
one GEMM per irrep type with (nodes x (2l+1)) rows. :class:`IrrepsLinear` holds those matrices,
read off the module itself (its value on the identity) and checked against it, and runs its
GEMMs through :func:`fastmace.dynamics.reduced_matmul.matmul`: that is where the BF16 tier
(``matmul_precision="bf16"``) puts the linear layers on BF16 tensor cores with float32
accumulation, everything else in the model staying float32.

dynamics/bf16_tier.py puts them, with the model's other GEMMs, in BF16.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

import torch

from fastmace.dynamics.reduced_matmul import PRECISIONS, matmul

LAYOUTS = ("ir_mul", "mul_ir")
CUEQ_LINEAR = "cuequivariance_torch.operations.linear.Linear"  # its class, by full name
_CHECK_NODES = 16
_IRREP = re.compile(r"^(?:(\d+)x)?(\d+)([eo])$")  # "8x1o", or "0e" for one copy


class LinearReadError(RuntimeError):
    """A module is not the equivariant linear map IrrepsLinear computes."""


@dataclasses.dataclass(frozen=True)
class Segment:
    """One entry of an irreps list: ``channels`` copies of irrep type ``irrep`` ("1o")."""

    channels: int
    irrep: str

    @property
    def components(self) -> int:
        return 2 * int(self.irrep[:-1]) + 1

    @property
    def width(self) -> int:
        return self.channels * self.components


def segments(irreps: object) -> tuple[Segment, ...]:
    """The entries of an e3nn or cuEquivariance irreps list, read from its text ("8x0e+8x1o")."""
    found = []
    for term in str(irreps).replace(" ", "").split("+"):
        match = _IRREP.match(term)
        if match is None:
            raise LinearReadError(f"irreps {irreps!s}: cannot read the entry {term!r}")
        found.append(Segment(int(match[1] or 1), f"{match[2]}{match[3]}"))
    return tuple(found)


def _component_major(x: torch.Tensor, segment: Segment, layout: str) -> torch.Tensor:
    """(N, segment.width) in ``layout`` as (N, components, channels)."""
    if layout == "ir_mul":
        return x.unflatten(-1, (segment.components, segment.channels))
    return x.unflatten(-1, (segment.channels, segment.components)).transpose(-1, -2)


def _flattened(y: torch.Tensor, layout: str) -> torch.Tensor:
    """(N, components, channels) back to (N, width) in ``layout``."""
    if layout == "mul_ir":
        y = y.transpose(-1, -2)
    return y.reshape(y.shape[0], -1)


class IrrepsLinear(torch.nn.Module):
    """An equivariant linear map as one GEMM per irrep type.

    Args:
        inputs, outputs: the irreps entries of the input and the output.
        layout: "ir_mul" (cuEquivariance's, components outer) or "mul_ir" (e3nn's).
        matrices: for each irrep type (in the order the types first appear in ``outputs``), the
            (channels of that type in, channels out) matrix, the entries of one type stacked
            in list order.
        precision: "float32" or "bf16" (dynamics/reduced_matmul.py).
    """

    def __init__(
        self,
        inputs: Sequence[Segment],
        outputs: Sequence[Segment],
        layout: str,
        matrices: Sequence[torch.Tensor],
        precision: str = "float32",
    ) -> None:
        super().__init__()
        if layout not in LAYOUTS:
            raise ValueError(f"layout {layout!r}: choose one of {LAYOUTS}")
        if precision not in PRECISIONS:
            raise ValueError(f"precision {precision!r}: choose one of {PRECISIONS}")
        self.inputs, self.outputs = tuple(inputs), tuple(outputs)
        self.layout, self.precision = layout, precision
        self.irreps = tuple(dict.fromkeys(segment.irrep for segment in self.outputs))
        if len(matrices) != len(self.irreps):
            raise ValueError(f"{len(matrices)} matrices for irrep types {self.irreps}")
        for index, matrix in enumerate(matrices):
            self.register_buffer(f"matrix_{index}", matrix.detach().contiguous())

    @property
    def in_features(self) -> int:
        return sum(segment.width for segment in self.inputs)

    @property
    def out_features(self) -> int:
        return sum(segment.width for segment in self.outputs)

    def matrix(self, irrep: str) -> torch.Tensor:
        return getattr(self, f"matrix_{self.irreps.index(irrep)}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        by_type: dict[str, list[torch.Tensor]] = {}
        start = 0
        for segment in self.inputs:
            piece = x[:, start : start + segment.width]
            start += segment.width
            by_type.setdefault(segment.irrep, []).append(
                _component_major(piece, segment, self.layout)
            )
        products = {}
        for index, irrep in enumerate(self.irreps):
            matrix = getattr(self, f"matrix_{index}")
            if irrep not in by_type:  # no input of this type: its outputs are zero
                rows = x.new_zeros((x.shape[0], 2 * int(irrep[:-1]) + 1, matrix.shape[1]))
                products[irrep] = rows
                continue
            pieces = by_type[irrep]
            stacked = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=-1)
            products[irrep] = matmul(stacked, matrix, self.precision)
        out, taken = [], dict.fromkeys(self.irreps, 0)
        for segment in self.outputs:
            first = taken[segment.irrep]
            taken[segment.irrep] += segment.channels
            block = products[segment.irrep][..., first : first + segment.channels]
            out.append(_flattened(block, self.layout))
        return out[0] if len(out) == 1 else torch.cat(out, dim=-1)

    def extra_repr(self) -> str:
        text = lambda entries: "+".join(f"{s.channels}x{s.irrep}" for s in entries)  # noqa: E731
        return (
            f"{text(self.inputs)} -> {text(self.outputs)}, layout={self.layout}, "
            f"precision={self.precision}"
        )


def class_name(module: torch.nn.Module) -> str:
    """The module's class by full name, compared so that neither library is imported here."""
    kind = type(module)
    return f"{kind.__module__}.{kind.__name__}"


def is_equivariant_linear(module: torch.nn.Module) -> bool:
    """cuEquivariance's ``Linear`` with its own shared weights, or e3nn's ``o3.Linear``."""
    name = class_name(module)
    if name == CUEQ_LINEAR:
        return bool(module.internal_weights) and int(module.weight_classes) == 1
    if name == "e3nn.o3._linear.Linear":
        return bool(module.internal_weights) and bool(module.shared_weights)
    return False


def read_linear(module: torch.nn.Module, precision: str = "float32") -> IrrepsLinear:
    """The IrrepsLinear that ``module`` computes: its value on the identity, taken apart into
    one matrix per irrep type in whichever layout reproduces it (LinearReadError if none)."""
    inputs, outputs = segments(module.irreps_in), segments(module.irreps_out)
    parameter = next(module.parameters(), None)
    if parameter is None:
        raise LinearReadError(f"{type(module).__name__} has no weights to read")
    dtype, device = parameter.dtype, parameter.device
    width = sum(segment.width for segment in inputs)
    with torch.no_grad():
        if float(module(torch.zeros((1, width), dtype=dtype, device=device)).abs().max()) != 0:
            raise LinearReadError("the map has a bias: IrrepsLinear computes linear maps only")
        dense = module(torch.eye(width, dtype=dtype, device=device))
    scale = max(float(dense.abs().max()), 1e-30)
    tolerance = 1000 * torch.finfo(dtype).eps * scale
    errors = {}
    for layout in LAYOUTS:
        candidate = IrrepsLinear(inputs, outputs, layout, _matrices(dense, inputs, outputs, layout))
        with torch.no_grad():
            error = float(
                (candidate(torch.eye(width, dtype=dtype, device=device)) - dense).abs().max()
            )
        if error <= tolerance:
            candidate.precision = precision
            return candidate
        errors[layout] = error
    raise LinearReadError(
        f"{type(module).__name__} {inputs} -> {outputs} is not one matrix per irrep type in "
        f"either layout (largest differences {errors}, tolerance {tolerance:.3g})"
    )


def _matrices(
    dense: torch.Tensor, inputs: Sequence[Segment], outputs: Sequence[Segment], layout: str
) -> list[torch.Tensor]:
    """Each irrep type's (channels in, channels out) block of the dense map, read at the
    first component of each input entry (the others are checked by the caller)."""
    rows: dict[str, list[torch.Tensor]] = {}
    start = 0
    for segment in inputs:
        # Row of component 0, channel u of this entry: u (ir_mul) or u * components (mul_ir).
        step = 1 if layout == "ir_mul" else segment.components
        picked = start + step * torch.arange(segment.channels)
        start += segment.width
        # Its image, as (components, channels) per output entry; component 0 is the block.
        rows.setdefault(segment.irrep, []).append(dense[picked.to(dense.device)])
    matrices = []
    for irrep in dict.fromkeys(segment.irrep for segment in outputs):
        columns, begin = [], 0
        for segment in outputs:
            if segment.irrep == irrep:
                step = 1 if layout == "ir_mul" else segment.components
                columns.append(begin + step * torch.arange(segment.channels))
            begin += segment.width
        picked_columns = torch.cat(columns).to(dense.device)
        source = rows.get(irrep)
        if source is None:
            matrices.append(dense.new_zeros((0, len(picked_columns))))
            continue
        matrices.append(torch.cat([block[:, picked_columns] for block in source], dim=0))
    return matrices
