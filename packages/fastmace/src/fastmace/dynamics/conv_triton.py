"""MACE's interaction convolution as Triton kernels, one program per receiving atom (CUDA).

The convolution of an interaction block (mace-torch's ``conv_tp`` followed by the sum over
each atom's incoming edges) is, per edge e from sender s to receiver n and per channel c,

    message[n, k, c] += w[e, path(k), c] * sum_i x[s, i, c] * M_e[i, k],
    M_e[i, k] = sum_j T[i, j, k] * Y[e, j],

with x the sender's features (components i of its irreps, channels c; cuEquivariance's
``ir_mul`` layout), Y the edge's spherical harmonics, T the coupling coefficients of every
path (normalisation included, one dense tensor; fused_conv.py takes it from the model's own
module) and w the radial weights, one row per path and channel. Output component k belongs to
exactly one path: that is what makes the product "channel-wise" (mace's "uvu").

Layouts (all contiguous): x (N, D1, C); Y (E, D2); w (Pw, P, C), edge e reading row e mod Pw
(Pw = E/2 for mirrored pairs, whose two edges share their weights); T (D1, D2, D3); out
(N, D3, C). Edges are walked in receiver order (``order``, with ``starts`` giving each
atom's run), so the sum over an atom's edges stays in registers: no atomics, and the same
inputs give the same bits. The per-edge messages and their weights' products are never
written to memory.

Backward, for forces and stress (one order: MD needs no second derivative):

1. ``_edges_backward`` (receiver order) gives, per edge, dL/dw (P, C), dL/dY (D2, one partial
   row per channel tile) and h = dL/d(x[s]) (D1, C), the edge's share of its sender's gradient;
2. ``_sum_by_sender`` (sender order) sums h over each atom's outgoing edges.

``skip`` trailing atoms (FastMACE's padding atom, whose edges are all the capacity's padding)
get no program: their messages and gradients are zero, and their incoming edges' rows of dL/dw
and dL/dY are zeroed by ``_zero_skipped_edges`` so that no uninitialised memory leaves. That
is the convolution only for atoms with no edge to or from an atom that is not skipped, as the
padding atom is (dynamics/potential.py).

``tests/test_fused_conv.py`` checks every kernel against fused_conv.py's torch formulas in
Triton's interpreter on the CPU (and compiled on a GPU).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CHANNELS = 32  # channels per program
EDGES = 128  # edges per program of the zeroing kernel


@triton.jit
def _coupling(coefficients, D1: tl.constexpr, D2: tl.constexpr, D3: tl.constexpr,
              D1P: tl.constexpr, D2P: tl.constexpr, D3P: tl.constexpr):  # fmt: skip
    """T as a (D1P, D2P, D3P) register tensor, zero in the padding."""
    i = tl.arange(0, D1P)[:, None, None]
    j = tl.arange(0, D2P)[None, :, None]
    k = tl.arange(0, D3P)[None, None, :]
    mask = (i < D1) & (j < D2) & (k < D3)
    return tl.load(coefficients + (i * D2 + j) * D3 + k, mask=mask, other=0.0)


@triton.jit
def _edge(order, sender, harmonics, pos, coupling, D2: tl.constexpr, D2P: tl.constexpr):
    """Edge at sorted position ``pos``: its index, sender and M = T . Y (D1P, D3P)."""
    edge = tl.load(order + pos)
    source = tl.load(sender + edge)
    j = tl.arange(0, D2P)
    y = tl.load(harmonics + edge * D2 + j, mask=j < D2, other=0.0)
    return edge, source, tl.sum(coupling * y[None, :, None], axis=1)


@triton.jit
def _conv_forward(features, harmonics, weights, coefficients, path_of, sender, order, starts,
                  out, channels, weight_rows,
                  D1: tl.constexpr, D2: tl.constexpr, D3: tl.constexpr, PATHS: tl.constexpr,
                  D1P: tl.constexpr, D2P: tl.constexpr, D3P: tl.constexpr,
                  CHANNELS: tl.constexpr):  # fmt: skip
    atom = tl.program_id(0)
    c = tl.program_id(1) * CHANNELS + tl.arange(0, CHANNELS)
    i = tl.arange(0, D1P)
    k = tl.arange(0, D3P)
    c_ok = c < channels
    x_mask = (i < D1)[:, None] & c_ok[None, :]
    k_mask = (k < D3)[:, None] & c_ok[None, :]
    coupling = _coupling(coefficients, D1, D2, D3, D1P, D2P, D3P)
    path = tl.load(path_of + k, mask=k < D3, other=0)
    total = tl.zeros([D3P, CHANNELS], dtype=out.dtype.element_ty)
    for pos in range(tl.load(starts + atom), tl.load(starts + atom + 1)):
        edge, source, m = _edge(order, sender, harmonics, pos, coupling, D2, D2P)
        x = tl.load(features + (source * D1 + i[:, None]) * channels + c[None, :],
                    mask=x_mask, other=0.0)  # fmt: skip
        u = tl.sum(m[:, :, None] * x[:, None, :], axis=0)
        row = (edge % weight_rows) * PATHS
        w = tl.load(weights + (row + path[:, None]) * channels + c[None, :],
                    mask=k_mask, other=0.0)  # fmt: skip
        total += w * u
    tl.store(out + (atom * D3 + k[:, None]) * channels + c[None, :], total, mask=k_mask)


@triton.jit
def _edges_backward(grad, features, harmonics, weights, coefficients, path_of, sender, order,
                    starts, grad_weights, grad_harmonics, shares, channels, weight_rows,
                    D1: tl.constexpr, D2: tl.constexpr, D3: tl.constexpr, PATHS: tl.constexpr,
                    D1P: tl.constexpr, D2P: tl.constexpr, D3P: tl.constexpr,
                    CHANNELS: tl.constexpr):  # fmt: skip
    atom = tl.program_id(0)
    tile = tl.program_id(1)
    tiles = tl.num_programs(1)
    c = tile * CHANNELS + tl.arange(0, CHANNELS)
    i = tl.arange(0, D1P)
    j = tl.arange(0, D2P)
    k = tl.arange(0, D3P)
    c_ok = c < channels
    x_mask = (i < D1)[:, None] & c_ok[None, :]
    k_mask = (k < D3)[:, None] & c_ok[None, :]
    coupling = _coupling(coefficients, D1, D2, D3, D1P, D2P, D3P)
    path = tl.load(path_of + k, mask=k < D3, other=0)
    g = tl.load(grad + (atom * D3 + k[:, None]) * channels + c[None, :], mask=k_mask, other=0.0)
    for pos in range(tl.load(starts + atom), tl.load(starts + atom + 1)):
        edge, source, m = _edge(order, sender, harmonics, pos, coupling, D2, D2P)
        x = tl.load(features + (source * D1 + i[:, None]) * channels + c[None, :],
                    mask=x_mask, other=0.0)  # fmt: skip
        row = (edge % weight_rows) * PATHS
        w = tl.load(weights + (row + path[:, None]) * channels + c[None, :],
                    mask=k_mask, other=0.0)  # fmt: skip
        # dL/dw: each path's components of g * (x . M), summed.
        gu = g * tl.sum(m[:, :, None] * x[:, None, :], axis=0)
        for p in tl.static_range(PATHS):
            part = tl.sum(tl.where((path == p)[:, None], gu, 0.0), axis=0)
            tl.store(grad_weights + (edge * PATHS + p) * channels + c, part, mask=c_ok)
        gw = g * w
        # The sender's share: h[i, c] = sum_k M[i, k] g[k, c] w[k, c].
        h = tl.sum(m[:, :, None] * gw[None, :, :], axis=1)
        tl.store(shares + (edge * D1 + i[:, None]) * channels + c[None, :], h, mask=x_mask)
        # dL/dY[j] = sum_{i,k} T[i, j, k] sum_c x[i, c] g[k, c] w[k, c] (this tile's channels).
        a = tl.sum(x[:, None, :] * gw[None, :, :], axis=2)
        gy = tl.sum(tl.sum(coupling * a[:, None, :], axis=2), axis=0)
        tl.store(grad_harmonics + (edge * tiles + tile) * D2 + j, gy, mask=j < D2)


@triton.jit
def _sum_by_sender(shares, receiver, first_skipped, order, starts, grad_features, channels,
                   D1: tl.constexpr, D1P: tl.constexpr, CHANNELS: tl.constexpr):  # fmt: skip
    atom = tl.program_id(0)
    c = tl.program_id(1) * CHANNELS + tl.arange(0, CHANNELS)
    i = tl.arange(0, D1P)
    mask = (i < D1)[:, None] & (c < channels)[None, :]
    total = tl.zeros([D1P, CHANNELS], dtype=grad_features.dtype.element_ty)
    for pos in range(tl.load(starts + atom), tl.load(starts + atom + 1)):
        edge = tl.load(order + pos)
        counted = tl.load(receiver + edge) < first_skipped  # a skipped receiver wrote no share
        total += tl.load(shares + (edge * D1 + i[:, None]) * channels + c[None, :],
                         mask=mask & counted, other=0.0)  # fmt: skip
    tl.store(grad_features + (atom * D1 + i[:, None]) * channels + c[None, :], total, mask=mask)


@triton.jit
def _zero_skipped_edges(receiver, first_skipped, grad_weights, grad_harmonics, edges,
                        weight_width, harmonic_width,
                        EDGES: tl.constexpr, COLUMNS: tl.constexpr):  # fmt: skip
    edge = tl.program_id(0) * EDGES + tl.arange(0, EDGES)
    skipped = (edge < edges) & (tl.load(receiver + edge, mask=edge < edges, other=0)
                                >= first_skipped)  # fmt: skip
    for start in range(0, weight_width, COLUMNS):
        column = start + tl.arange(0, COLUMNS)
        mask = skipped[:, None] & (column < weight_width)[None, :]
        tl.store(grad_weights + edge[:, None] * weight_width + column[None, :], 0.0, mask=mask)
    for start in range(0, harmonic_width, COLUMNS):
        column = start + tl.arange(0, COLUMNS)
        mask = skipped[:, None] & (column < harmonic_width)[None, :]
        tl.store(grad_harmonics + edge[:, None] * harmonic_width + column[None, :], 0.0,
                 mask=mask)  # fmt: skip


def _padded(size: int) -> int:
    return triton.next_power_of_2(max(size, 1))


def _shape(features: torch.Tensor, coefficients: torch.Tensor, paths: int) -> dict[str, int]:
    d1, d2, d3 = coefficients.shape
    return {"D1": d1, "D2": d2, "D3": d3, "PATHS": paths,
            "D1P": _padded(d1), "D2P": _padded(d2), "D3P": _padded(d3)}  # fmt: skip


def runs(index: torch.Tensor, atoms: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Edges sorted by ``index`` (stable) and each atom's run in that order: (E,), (atoms+1,).
    Device work only (no synchronisation), so it can be captured in a CUDA graph."""
    order = torch.argsort(index, stable=True)
    bounds = torch.arange(atoms + 1, device=index.device, dtype=index.dtype)
    return order, torch.searchsorted(index[order], bounds)


def forward(
    features: torch.Tensor,
    harmonics: torch.Tensor,
    weights: torch.Tensor,
    coefficients: torch.Tensor,
    path_of: torch.Tensor,
    sender: torch.Tensor,
    receiver_runs: tuple[torch.Tensor, torch.Tensor],
    skip: int,
) -> torch.Tensor:
    """(N, D1, C) features -> (N, D3, C) messages summed over each atom's incoming edges."""
    atoms, _, channels = features.shape
    paths = weights.shape[1]
    shape = _shape(features, coefficients, paths)
    out = torch.empty((atoms, shape["D3"], channels), dtype=features.dtype, device=features.device)
    if skip:
        out[atoms - skip :].zero_()
    order, starts = receiver_runs
    grid = (atoms - skip, triton.cdiv(channels, CHANNELS))
    if grid[0] > 0:
        _conv_forward[grid](features, harmonics, weights, coefficients, path_of, sender, order,
                            starts, out, channels, weights.shape[0], CHANNELS=CHANNELS,
                            **shape)  # fmt: skip
    return out


def backward(
    grad: torch.Tensor,
    features: torch.Tensor,
    harmonics: torch.Tensor,
    weights: torch.Tensor,
    coefficients: torch.Tensor,
    path_of: torch.Tensor,
    edge_index: torch.Tensor,
    receiver_runs: tuple[torch.Tensor, torch.Tensor],
    sender_runs: tuple[torch.Tensor, torch.Tensor],
    skip: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dL/d(features) (N, D1, C), dL/d(harmonics) (E, D2), dL/dw per edge (E, P, C)."""
    atoms, _, channels = features.shape
    edges = harmonics.shape[0]
    paths = weights.shape[1]
    shape = _shape(features, coefficients, paths)
    tiles = triton.cdiv(channels, CHANNELS)
    device, dtype = features.device, features.dtype
    grad_weights = torch.empty((edges, paths, channels), dtype=dtype, device=device)
    partial_harmonics = torch.empty((edges, tiles, shape["D2"]), dtype=dtype, device=device)
    shares = torch.empty((edges, shape["D1"], channels), dtype=dtype, device=device)
    grad_features = torch.empty_like(features)
    if skip:
        grad_features[atoms - skip :].zero_()
    sender, receiver = edge_index[0], edge_index[1]
    if atoms - skip > 0:
        _edges_backward[(atoms - skip, tiles)](
            grad, features, harmonics, weights, coefficients, path_of, sender,
            receiver_runs[0], receiver_runs[1], grad_weights, partial_harmonics, shares,
            channels, weights.shape[0], CHANNELS=CHANNELS, **shape,
        )  # fmt: skip
        _sum_by_sender[(atoms - skip, tiles)](
            shares, receiver, atoms - skip, sender_runs[0], sender_runs[1], grad_features,
            channels,
            D1=shape["D1"], D1P=shape["D1P"], CHANNELS=CHANNELS,
        )  # fmt: skip
    if skip and edges:
        _zero_skipped_edges[(triton.cdiv(edges, EDGES),)](
            receiver, atoms - skip, grad_weights, partial_harmonics, edges, paths * channels,
            tiles * shape["D2"], EDGES=EDGES, COLUMNS=64,
        )  # fmt: skip
    return grad_features, partial_harmonics.sum(dim=1), grad_weights
