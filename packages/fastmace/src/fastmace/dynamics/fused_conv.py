"""FastMACE's own interaction convolution: a drop-in for a block's ``conv_tp``.

mace-torch's interaction blocks compute, for every edge, a channel-wise tensor product of the
sender's features with the edge's spherical harmonics, weighted by the radial weights, and sum
the products into each receiver. :class:`FusedConvolution` does both in one pass per
direction (dynamics/conv_triton.py on CUDA; the same formulas in torch elsewhere), with the
coupling coefficients taken from the block's own module: :func:`coupling_of` evaluates that
module on unit inputs, so normalisation and ordering are the model's by construction, and
:func:`coupling_disagreement` checks the result against the module on random inputs before
it is used.

Only the convolution changes: the radial MLP (or table), the linear layers and the product
basis stay as they are. Weights may come one row per edge or one per mirrored pair (E/2 rows,
``PairSharedRadial(both_halves=False)``): edge e reads row e mod rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fastmace.dynamics import kernel_sources
from fastmace.dynamics.module_copy import shallow_copy


class ConvolutionError(ValueError):
    """The block's convolution is not one this kernel computes (the message says why)."""


@dataclass(frozen=True)
class Coupling:
    """What a block's channel-wise convolution computes, apart from its inputs.

    Attributes:
        coefficients: (D1, D2, D3) float64: output component k of a channel gets
            ``sum_ij coefficients[i, j, k] x[i] Y[j]`` times the weight of k's path.
        path_of: (D3,) int64, the path (row of weights) of each output component.
        channels: C, the multiplicity shared by every input and output irrep.
    """

    coefficients: torch.Tensor
    path_of: torch.Tensor
    channels: int

    @property
    def paths(self) -> int:
        return int(self.path_of.max()) + 1


# ----------------------------------------------------------------------------- torch formulas


def _rows(weights: torch.Tensor, edges: int) -> torch.Tensor:
    """Each edge's row of weights (edge e reads row e mod rows)."""
    if weights.shape[0] == edges:
        return weights
    return weights.repeat(edges // weights.shape[0], 1, 1)


def _skipped(receiver: torch.Tensor, atoms: int, skip: int) -> torch.Tensor:
    return receiver >= atoms - skip


def convolve_reference(
    features: torch.Tensor,
    harmonics: torch.Tensor,
    weights: torch.Tensor,
    coefficients: torch.Tensor,
    path_of: torch.Tensor,
    edge_index: torch.Tensor,
    skip: int = 0,
) -> torch.Tensor:
    """The convolution in torch: (N, D1, C) features -> (N, D3, C) summed messages."""
    sender, receiver = edge_index[0], edge_index[1]
    atoms, edges = features.shape[0], harmonics.shape[0]
    coupled = torch.einsum("ej,ijk->eik", harmonics, coefficients)
    products = torch.einsum("eik,eic->ekc", coupled, features[sender])
    messages = products * _rows(weights, edges)[:, path_of, :]
    messages = torch.where(_skipped(receiver, atoms, skip)[:, None, None], 0.0, messages)
    out = torch.zeros((atoms, *messages.shape[1:]), dtype=features.dtype, device=features.device)
    return out.index_add_(0, receiver, messages)


def convolve_backward_reference(
    grad: torch.Tensor,
    features: torch.Tensor,
    harmonics: torch.Tensor,
    weights: torch.Tensor,
    coefficients: torch.Tensor,
    path_of: torch.Tensor,
    edge_index: torch.Tensor,
    skip: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dL/d(features), dL/d(harmonics), dL/dw per edge (E, P, C), as conv_triton.backward."""
    sender, receiver = edge_index[0], edge_index[1]
    atoms, edges = features.shape[0], harmonics.shape[0]
    keep = ~_skipped(receiver, atoms, skip)
    g = grad[receiver] * keep[:, None, None]
    coupled = torch.einsum("ej,ijk->eik", harmonics, coefficients)
    x = features[sender]
    gu = g * torch.einsum("eik,eic->ekc", coupled, x)
    paths = weights.shape[1]
    grad_weights = torch.zeros((edges, paths, features.shape[2]), dtype=grad.dtype,
                               device=grad.device).index_add_(1, path_of, gu)  # fmt: skip
    gw = g * _rows(weights, edges)[:, path_of, :]
    shares = torch.einsum("eik,ekc->eic", coupled, gw)
    grad_features = torch.zeros_like(features).index_add_(0, sender, shares)
    if skip:
        grad_features[atoms - skip :] = 0.0
    grad_harmonics = torch.einsum("ijk,eic,ekc->ej", coefficients, x, gw)
    return grad_features, grad_harmonics, grad_weights


# ----------------------------------------------------------------------------- the operator


def _fold(grad_weights: torch.Tensor, rows: int) -> torch.Tensor:
    """Per-edge dL/dw summed into the rows the edges read (E/rows edges per row)."""
    edges = grad_weights.shape[0]
    if rows == edges:
        return grad_weights
    return grad_weights.view(edges // rows, rows, *grad_weights.shape[1:]).sum(dim=0)


def edge_runs(edge_index: torch.Tensor, features: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The kernels' walk over the edges: each atom's incoming edges (receiver order and each
    atom's start in it), then its outgoing ones (conv_triton.runs), found once per call of a
    block's convolution and used by its forward and backward both; empty where the torch
    formulas run instead. Plain torch operations, which a compiled graph sees as the same
    work on the same edges in every block."""
    if not kernel_sources.kernels_run(features):
        empty = edge_index.new_empty(0)
        return empty, empty, empty, empty
    from fastmace.dynamics import conv_triton

    atoms = features.shape[0]
    return (*conv_triton.runs(edge_index[1], atoms), *conv_triton.runs(edge_index[0], atoms))


@torch.library.custom_op("fastmace::fused_conv", mutates_args=())
def fused_conv(
    features: torch.Tensor,
    harmonics: torch.Tensor,
    weights: torch.Tensor,
    coefficients: torch.Tensor,
    path_of: torch.Tensor,
    edge_index: torch.Tensor,
    receiver_order: torch.Tensor,
    receiver_starts: torch.Tensor,
    sender_order: torch.Tensor,
    sender_starts: torch.Tensor,
    skip: int,
    key: str,
) -> torch.Tensor:
    """(N, D1, C), (E, D2), (rows, P, C) -> (N, D3, C); differentiable in the first three.
    ``key``: the coupling's, from conv_codegen.register (the kernels are generated for it);
    the runs: :func:`edge_runs`'."""
    if kernel_sources.kernels_run(features):
        from fastmace.dynamics import conv_triton

        receiver_runs = (receiver_order, receiver_starts)
        return conv_triton.forward(key, features, harmonics, weights, coefficients,
                                   edge_index[0], receiver_runs, skip)  # fmt: skip
    return convolve_reference(features, harmonics, weights, coefficients, path_of, edge_index,
                              skip).contiguous()  # fmt: skip


@fused_conv.register_fake
def _fused_conv_shape(features, harmonics, weights, coefficients, *rest):
    return features.new_empty((features.shape[0], coefficients.shape[2], features.shape[2]))


@torch.library.custom_op("fastmace::fused_conv_backward", mutates_args=())
def fused_conv_backward(
    grad: torch.Tensor,
    features: torch.Tensor,
    harmonics: torch.Tensor,
    weights: torch.Tensor,
    coefficients: torch.Tensor,
    path_of: torch.Tensor,
    edge_index: torch.Tensor,
    receiver_order: torch.Tensor,
    receiver_starts: torch.Tensor,
    sender_order: torch.Tensor,
    sender_starts: torch.Tensor,
    skip: int,
    key: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of :func:`fused_conv` (not differentiable again: forces need one order)."""
    if kernel_sources.kernels_run(features):
        from fastmace.dynamics import conv_triton

        found = conv_triton.backward(
            key, grad, features, harmonics, weights, coefficients, edge_index,
            (receiver_order, receiver_starts), (sender_order, sender_starts), skip,
        )  # fmt: skip
    else:
        found = convolve_backward_reference(grad, features, harmonics, weights, coefficients,
                                            path_of, edge_index, skip)  # fmt: skip
    grad_features, grad_harmonics, grad_weights = found
    # Laid out as the fake says (contiguous): a compiled graph plans its buffers from the fake,
    # and the torch formulas' dL/dY comes out transposed.
    folded = _fold(grad_weights, weights.shape[0])
    return grad_features.contiguous(), grad_harmonics.contiguous(), folded.contiguous()


@fused_conv_backward.register_fake
def _fused_conv_backward_shape(grad, features, harmonics, weights, *rest):
    return torch.empty_like(features), torch.empty_like(harmonics), torch.empty_like(weights)


def _setup(ctx, inputs, output) -> None:
    *tensors, skip, key = inputs
    ctx.save_for_backward(*tensors)
    ctx.skip, ctx.key = skip, key


def _backward(ctx, grad):
    grads = fused_conv_backward(grad.contiguous(), *ctx.saved_tensors, ctx.skip, ctx.key)
    # Gradients for features, harmonics and weights; none for the other nine inputs.
    return *grads, *([None] * 9)


fused_conv.register_autograd(_backward, setup_context=_setup)


# ----------------------------------------------------------------------------- the module


class FusedConvolution(torch.nn.Module):
    """A block's convolution with mace's fused calling convention.

    ``forward(node_feats (N, D1*C), edge_attrs (E, D2), tp_weights (rows, P*C), edge_index)``
    returns the summed messages (N, D3*C), in cuEquivariance's ``ir_mul`` layout as the
    module it replaces. ``skip`` trailing atoms get no messages (FastMACE's padding atom,
    conv_triton.py says when that is exact).
    """

    def __init__(self, coupling: Coupling, dtype: torch.dtype, device: torch.device,
                 skip: int = 0) -> None:  # fmt: skip
        from fastmace.dynamics import conv_codegen

        super().__init__()
        self.key = conv_codegen.register(coupling.coefficients, coupling.path_of)
        self.register_buffer("coefficients", coupling.coefficients.to(dtype=dtype, device=device))
        self.register_buffer("path_of", coupling.path_of.to(device))
        self.channels = coupling.channels
        self.paths = coupling.paths
        self.skip = int(skip)

    def forward(
        self,
        node_feats: torch.Tensor,
        edge_attrs: torch.Tensor,
        tp_weights: torch.Tensor,
        edge_index: torch.Tensor,
    ) -> torch.Tensor:
        atoms, channels = node_feats.shape[0], self.channels
        features = node_feats.reshape(atoms, -1, channels).contiguous()
        weights = tp_weights.reshape(tp_weights.shape[0], self.paths, channels).contiguous()
        out = fused_conv(features, edge_attrs.contiguous(), weights, self.coefficients,
                         self.path_of, edge_index, *edge_runs(edge_index, features), self.skip,
                         self.key)  # fmt: skip
        return out.reshape(atoms, -1)


# ----------------------------------------------------------------------------- from a model


@dataclass(frozen=True)
class _Dimensions:
    d1: int
    d2: int
    d3: int
    channels: int
    path_sizes: tuple[int, ...]  # the components of each path's output irrep, in order

    @property
    def paths(self) -> int:
        return len(self.path_sizes)


def _dimensions(block: torch.nn.Module) -> _Dimensions:
    """The sizes of the block's convolution, from its irreps (mace-torch's own rule)."""
    from mace.modules.irreps_tools import tp_out_irreps_with_instructions

    try:
        first, harmonics = block.edge_irreps, block.edge_attrs_irreps
        middle, _ = tp_out_irreps_with_instructions(first, harmonics, block.target_irreps)
    except AttributeError as error:
        raise ConvolutionError(
            f"a {type(block).__name__} has no irreps to read: {error}"
        ) from error
    multiplicities = {mul for mul, _ in first} | {mul for mul, _ in middle}
    if len(multiplicities) != 1 or any(mul != 1 for mul, _ in harmonics):
        raise ConvolutionError(
            f"{type(block).__name__}: the kernel needs one multiplicity for every irrep of "
            f"the features and messages ({first} -> {middle}) and harmonics of multiplicity "
            "1: leave fused_convolution off for this model"
        )
    channels = multiplicities.pop()
    return _Dimensions(first.dim // channels, harmonics.dim, middle.dim // channels, channels,
                       tuple(ir.dim for _, ir in middle))  # fmt: skip


def _dtype_device(block: torch.nn.Module) -> tuple[torch.dtype, torch.device]:
    """The block's floating dtype and device (radial tables have buffers, not parameters)."""
    for tensor in (*block.parameters(), *block.buffers()):
        if tensor.is_floating_point():
            return tensor.dtype, tensor.device
    raise ConvolutionError(f"a {type(block).__name__} holds no floating-point tensor")


def _module_messages(
    block: torch.nn.Module,
    features: torch.Tensor,
    harmonics: torch.Tensor,
    weights: torch.Tensor,
    edge_index: torch.Tensor,
) -> torch.Tensor:
    """The block's own convolution summed into receivers: (N, D1*C) -> (N, D3*C)."""
    convolution = block.conv_tp
    if hasattr(block, "conv_fusion"):
        return convolution(features, harmonics, weights, edge_index)
    products = convolution(features[edge_index[0]], harmonics, weights)
    out = products.new_zeros((features.shape[0], products.shape[1]))
    return out.index_add_(0, edge_index[1], products)


def coupling_of(block: torch.nn.Module) -> Coupling:
    """The coefficients of ``block``'s convolution, read from the block's own module.

    One evaluation on unit inputs: edge (i, j) carries component i of channel 0 of its
    sender's features and harmonic j, with every weight 1, to a receiver of its own; output
    component k of channel 0 is then ``coefficients[i, j, k]`` times 1. Output k's path is its
    irrep's position in the block's message irreps (mace sorts its paths by output).
    """
    sizes = _dimensions(block)
    dtype, device = _dtype_device(block)
    d1, d2, c = sizes.d1, sizes.d2, sizes.channels
    probes = d1 * d2
    features = torch.zeros((d1, d1, c), dtype=dtype, device=device)
    features[torch.arange(d1), torch.arange(d1), 0] = 1.0
    harmonics = torch.eye(d2, dtype=dtype, device=device).repeat(d1, 1)
    weights = torch.ones((probes, sizes.paths * c), dtype=dtype, device=device)
    sender = torch.arange(d1, device=device).repeat_interleave(d2)
    receiver = d1 + torch.arange(probes, device=device)
    nodes = torch.cat([features, features.new_zeros((probes, d1, c))]).reshape(d1 + probes, -1)
    with torch.no_grad():
        out = _module_messages(block, nodes, harmonics, weights,
                               torch.stack([sender, receiver]))  # fmt: skip
    coefficients = out[d1:].reshape(d1, d2, sizes.d3, c)[..., 0]
    path_of = torch.repeat_interleave(torch.tensor(sizes.path_sizes))
    return Coupling(coefficients.double().cpu().contiguous(), path_of, c)


def coupling_disagreement(
    block: torch.nn.Module, coupling: Coupling, atoms: int = 7, edges: int = 23, seed: int = 0
) -> float:
    """Largest difference between the block's module and the formulas with ``coupling`` on
    random inputs, relative to the largest message (float64 arithmetic for the formulas)."""
    dtype, device = _dtype_device(block)
    generator = torch.Generator().manual_seed(seed)
    c, d1 = coupling.channels, coupling.coefficients.shape[0]
    d2, paths = coupling.coefficients.shape[1], coupling.paths

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=generator, dtype=torch.float64).to(device, dtype)

    features, harmonics, weights = draw(atoms, d1 * c), draw(edges, d2), draw(edges, paths * c)
    edge_index = torch.randint(0, atoms, (2, edges), generator=generator).to(device)
    with torch.no_grad():
        module = _module_messages(block, features, harmonics, weights, edge_index).double()
    formula = convolve_reference(
        features.double().reshape(atoms, d1, c), harmonics.double(),
        weights.double().reshape(edges, paths, c), coupling.coefficients.to(device),
        coupling.path_of.to(device), edge_index,
    ).reshape(atoms, -1)  # fmt: skip
    return float((module - formula).abs().max() / formula.abs().max().clamp_min(1e-300))


def module_disagreement(
    ours: FusedConvolution, block: torch.nn.Module, atoms: int = 7, edges: int = 23, seed: int = 2
) -> float:
    """Largest difference between ``ours`` as it runs (its kernels on CUDA) and the block's
    own convolution, on the same random inputs in the block's dtype and device, relative to
    the largest message. No edge touches ``ours``'s skipped atoms, which get no messages."""
    dtype, device = _dtype_device(block)
    generator = torch.Generator().manual_seed(seed)
    c, d1 = ours.channels, ours.coefficients.shape[0]
    d2 = ours.coefficients.shape[1]

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=generator, dtype=torch.float64).to(device, dtype)

    features, harmonics = draw(atoms, d1 * c), draw(edges, d2)
    weights = draw(edges, ours.paths * c)
    edge_index = torch.randint(0, atoms - ours.skip, (2, edges), generator=generator).to(device)
    with torch.no_grad():
        want = _module_messages(block, features, harmonics, weights, edge_index).double()
        got = ours(features, harmonics, weights, edge_index).double()
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-300))


def fused_convolution_model(
    model: torch.nn.Module, skip: int = 0, tolerance: float | None = None
) -> torch.nn.Module:
    """A copy of ``model`` whose interaction blocks convolve with :class:`FusedConvolution`.

    The copy shares every weight with ``model``. Each block's coupling is read from its own
    module and checked against it (:func:`coupling_disagreement`), then the module that will
    run, its kernels on CUDA, against the block's own convolution
    (:func:`module_disagreement`), each within ``tolerance`` (by default 1e-5 in float32,
    1e-12 in float64); a block that fails, or whose convolution is not channel-wise in one
    multiplicity, raises :class:`ConvolutionError` saying which.
    """
    interactions = getattr(model, "interactions", None)
    if interactions is None:
        raise ConvolutionError(f"a {type(model).__name__} has no interaction blocks")
    copy = shallow_copy(model)
    blocks = shallow_copy(interactions)
    copy.interactions = blocks
    for index, original in enumerate(interactions):
        coupling = coupling_of(original)
        dtype, device = _dtype_device(original)
        bound = tolerance if tolerance is not None else (
            1e-12 if dtype == torch.float64 else 1e-5)  # fmt: skip
        disagreement = coupling_disagreement(original, coupling)
        if not disagreement <= bound:
            raise ConvolutionError(
                f"interaction block {index}: the kernel's formulas differ from the block's own "
                f"convolution by {disagreement:.2e} (relative), more than {bound:.0e}; the "
                "kernel reads cuEquivariance's feature layout: convert the model with "
                "backend='cueq', or leave fused_convolution off"
            )
        convolution = FusedConvolution(coupling, dtype, device, skip)
        try:
            running = module_disagreement(convolution, original)
        except Exception as error:  # a kernel that does not compile or run: the same answer
            raise ConvolutionError(
                f"interaction block {index}: the kernels did not run: {error}"
            ) from error
        if not running <= bound:
            raise ConvolutionError(
                f"interaction block {index}: the kernels differ from the block's own "
                f"convolution by {running:.2e} (relative), more than {bound:.0e}"
            )
        block = shallow_copy(original)
        block.conv_tp = convolution
        block.conv_fusion = True  # mace's blocks take the fused calling convention then
        blocks[index] = block
    return copy
