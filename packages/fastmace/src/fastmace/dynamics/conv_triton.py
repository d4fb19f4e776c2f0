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

The two kernels that depend on the coupling, the forward and the edges' backward, are
generated for it (conv_codegen.py, under the key its ``register`` returns). Backward, for
forces and stress (one order: MD needs no second derivative):

1. the generated ``_backward`` (receiver order) gives, per edge, dL/dw (P, C), dL/dY (D2, one
   partial row per channel tile) and h = dL/d(x[s]) (D1, C), the edge's share of its sender's
   gradient;
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

from dataclasses import dataclass
from types import ModuleType

import torch
import triton
import triton.language as tl

from fastmace.dynamics import conv_codegen

# Channels per program. One warp won stage 79 on an H100 at 1,728 and 13,824 atoms, 1.2-1.8x
# faster than four warps (128 channels, one a thread): its dL/dY sums over the channels need no
# barrier between warps. One warp of 64 channels, two a thread, which share the per-edge
# scalars m_ik every thread computes, then beat 32 in every kernel (stage 109, H100, 13,824
# atoms: from the table the second block 5.88 to 5.54 ms, the first 2.87 to 2.60; the default
# MD step 14.4 to 13.5 ms, stage 110); four a thread lost 50 % in the second block and two
# warps of 64 lost 27 % (stage 111).
THREADS = 64
# Warps per program (None: one channel per thread).
WARPS: int | None = 1
# An atom's edges taken this many at a time by each iteration of the generated kernels (a
# power of two), or None: two where the senders' features have one component (a model's first
# block, scalars in), else one. Stage 111 (H100, 13,824 atoms, 64 channels on one warp): two
# edges a step took the first block from 2.61 to 2.33 ms and the second from 5.63 to 8.63.
STEP: int | None = None
# Registers a thread of the generated kernels may hold (ptxas's .maxnreg), or None for as many
# as ptxas likes. Unbounded, MP-0 medium's second-block backward from the radial table takes
# 246 (tools/validation/kernel_registers.py), so an SM holds eight of its one-warp programs;
# yet no cap was faster on an H100 at 13,824 atoms (stage 102: 5.79 ms uncapped, 6.04 within
# 128, slower still below where the kernels spill), so ptxas chooses.
REGISTERS: int | None = None
# Whether each step of the generated kernels loads the next step's edge slots, senders and
# lengths (conv_codegen's PREFETCH). Off: on an H200 (stage 106, 13,824 atoms) it took the
# second block reading per-pair weights from 5.72 to 5.21 ms but the table's kernels, which the
# default path runs, from 2.82 to 3.08 and 5.65 to 6.18 ms.
PREFETCH = False
EDGES = 128  # edges per program of the zeroing kernel


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


def runs(index: torch.Tensor, atoms: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Edges sorted by ``index`` (stable) and each atom's run in that order: (E,), (atoms+1,).
    Device work only (no synchronisation), so it can be captured in a CUDA graph."""
    order = torch.argsort(index, stable=True)
    bounds = torch.arange(atoms + 1, device=index.device, dtype=index.dtype)
    return order, torch.searchsorted(index[order], bounds)


@dataclass(frozen=True)
class Launch:
    """How the generated kernels are launched: ``threads`` channels per program at most (a
    power of two from 32), on ``warps`` warps (None: one channel per thread; fewer warps give
    each thread several channels, which share its per-edge scalars), ``step`` of an atom's
    edges per iteration (None: :data:`STEP`'s rule), at most ``registers`` registers per
    thread (None: ptxas's choice), and with ``prefetch`` each step loading the next one's
    edge indices."""

    threads: int = THREADS
    step: int | None = STEP
    registers: int | None = REGISTERS
    prefetch: bool = PREFETCH
    warps: int | None = WARPS

    def edges_per_step(self, components: int) -> int:
        """``step``, or :data:`STEP`'s rule for senders' features of ``components`` (D1)."""
        return self.step or (2 if components == 1 else 1)


def _launch(key: str, features: torch.Tensor, launch: Launch) -> tuple[ModuleType, int, dict]:
    """The generated kernels for the features' dtype, the channel tiles per atom and the
    launch's options: all of an atom's channels in one program where they fit, else tiles
    that divide them down to 32 (96 channels: three of 32, not two of 64 half idle)."""
    channels = features.shape[2]
    width = min(launch.threads, triton.next_power_of_2(channels))
    while width > 32 and channels > width and channels % width:
        width //= 2
    module = conv_codegen.kernels(key, literal=features.dtype == torch.float32)
    warps = max(1, width // 32) if launch.warps is None else launch.warps
    step = launch.edges_per_step(features.shape[1])
    options = {"CHANNELS": width, "STEP": step, "PREFETCH": launch.prefetch,
               "num_warps": warps}  # fmt: skip
    if launch.registers is not None:
        options["maxnreg"] = launch.registers
    return module, triton.cdiv(channels, width), options


def forward(
    key: str,
    features: torch.Tensor,
    harmonics: torch.Tensor,
    weights: torch.Tensor,
    coefficients: torch.Tensor,
    sender: torch.Tensor,
    receiver_runs: tuple[torch.Tensor, torch.Tensor],
    skip: int,
    launch: Launch = Launch(),
) -> torch.Tensor:
    """(N, D1, C) features -> (N, D3, C) messages summed over each atom's incoming edges,
    with the kernels of the coupling registered under ``key`` (``coefficients`` is its T)."""
    return _forward("_forward", (weights,), weights.shape[0], (), key, features, harmonics,
                    coefficients, sender, receiver_runs, skip, launch)  # fmt: skip


def forward_from_table(
    key: str,
    features: torch.Tensor,
    harmonics: torch.Tensor,
    lengths: torch.Tensor,
    table: torch.Tensor,
    inverse_spacing: torch.Tensor,
    coefficients: torch.Tensor,
    sender: torch.Tensor,
    receiver_runs: tuple[torch.Tensor, torch.Tensor],
    skip: int,
    launch: Launch = Launch(),
    start: torch.Tensor | None = None,
    intervals: int | None = None,
) -> torch.Tensor:
    """:func:`forward` with each edge's weights interpolated from a radial table (N, 4, P*C;
    radial_table.py) at ``lengths`` (rows,), edge e reading row e mod rows. With ``start``
    (rows,), tables of ``intervals`` rows one per pair of elements (pair_table.py), row e's
    beginning at ``start[e]``."""
    reads, extra = _table_reads(lengths, table, inverse_spacing, start, intervals)
    return _forward(
        "_forward_table", reads, lengths.shape[0], extra, key, features, harmonics,
        coefficients, sender, receiver_runs, skip, launch,
    )  # fmt: skip


def _table_reads(
    lengths: torch.Tensor,
    table: torch.Tensor,
    inverse_spacing: torch.Tensor,
    start: torch.Tensor | None,
    intervals: int | None,
) -> tuple[tuple[torch.Tensor, ...], tuple]:
    """The table kernels' inputs and their integers after ``weight_rows``."""
    reads = (lengths, table, inverse_spacing, lengths if start is None else start)
    return reads, (table.shape[0] if intervals is None else intervals, start is not None)


def _forward(
    kernel: str,
    reads: tuple[torch.Tensor, ...],
    rows: int,
    extra: tuple[int, ...],
    key: str,
    features: torch.Tensor,
    harmonics: torch.Tensor,
    coefficients: torch.Tensor,
    sender: torch.Tensor,
    receiver_runs: tuple[torch.Tensor, torch.Tensor],
    skip: int,
    launch: Launch,
) -> torch.Tensor:
    atoms, _, channels = features.shape
    out = torch.empty((atoms, coefficients.shape[2], channels), dtype=features.dtype,
                      device=features.device)  # fmt: skip
    if skip:
        out[atoms - skip :].zero_()
    if atoms - skip > 0:
        module, tiles, tile = _launch(key, features, launch)
        order, starts = receiver_runs
        getattr(module, kernel)[(atoms - skip, tiles)](
            features, harmonics, *reads, coefficients, sender, order, starts, out, channels,
            rows, *extra, **tile,
        )  # fmt: skip
    return out


def backward(
    key: str,
    grad: torch.Tensor,
    features: torch.Tensor,
    harmonics: torch.Tensor,
    weights: torch.Tensor,
    coefficients: torch.Tensor,
    edge_index: torch.Tensor,
    receiver_runs: tuple[torch.Tensor, torch.Tensor],
    sender_runs: tuple[torch.Tensor, torch.Tensor],
    skip: int,
    launch: Launch = Launch(),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dL/d(features) (N, D1, C), dL/d(harmonics) (E, D2), dL/dw per edge (E, P, C)."""
    edges, paths, channels = harmonics.shape[0], weights.shape[1], features.shape[2]
    grad_weights = torch.empty((edges, paths, channels), dtype=grad.dtype, device=grad.device)
    grad_features, grad_harmonics = _backward(
        "_backward", (weights,), weights.shape[0], (), grad_weights, key, grad, features,
        harmonics, coefficients, edge_index, receiver_runs, sender_runs, skip, launch,
    )  # fmt: skip
    return grad_features, grad_harmonics, grad_weights


def backward_from_table(
    key: str,
    grad: torch.Tensor,
    features: torch.Tensor,
    harmonics: torch.Tensor,
    lengths: torch.Tensor,
    table: torch.Tensor,
    inverse_spacing: torch.Tensor,
    coefficients: torch.Tensor,
    edge_index: torch.Tensor,
    receiver_runs: tuple[torch.Tensor, torch.Tensor],
    sender_runs: tuple[torch.Tensor, torch.Tensor],
    skip: int,
    launch: Launch = Launch(),
    start: torch.Tensor | None = None,
    intervals: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dL/d(features) (N, D1, C), dL/d(harmonics) (E, D2), dL/d(length) per edge (E,): the
    weights' gradient meets the table's slope inside the kernel and is never written.
    ``start`` and ``intervals`` as for :func:`forward_from_table`."""
    edges = harmonics.shape[0]
    _, tiles, _ = _launch(key, features, launch)
    partial = torch.empty((edges, tiles), dtype=grad.dtype, device=grad.device)
    reads, extra = _table_reads(lengths, table, inverse_spacing, start, intervals)
    grad_features, grad_harmonics = _backward(
        "_backward_table", reads, lengths.shape[0], extra, partial, key, grad, features,
        harmonics, coefficients, edge_index, receiver_runs, sender_runs, skip, launch,
    )  # fmt: skip
    return grad_features, grad_harmonics, partial.sum(dim=1)


def _backward(
    kernel: str,
    reads: tuple[torch.Tensor, ...],
    rows: int,
    extra: tuple[int, ...],
    per_edge: torch.Tensor,
    key: str,
    grad: torch.Tensor,
    features: torch.Tensor,
    harmonics: torch.Tensor,
    coefficients: torch.Tensor,
    edge_index: torch.Tensor,
    receiver_runs: tuple[torch.Tensor, torch.Tensor],
    sender_runs: tuple[torch.Tensor, torch.Tensor],
    skip: int,
    launch: Launch,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernels of either backward; ``per_edge`` (E, ...) receives the radial gradient."""
    atoms, d1, channels = features.shape
    edges, d2 = harmonics.shape
    device, dtype = features.device, features.dtype
    module, tiles, tile = _launch(key, features, launch)
    partial_harmonics = torch.empty((edges, tiles, d2), dtype=dtype, device=device)
    shares = torch.empty((edges, d1, channels), dtype=dtype, device=device)
    grad_features = torch.empty_like(features)
    if skip:
        grad_features[atoms - skip :].zero_()
    sender, receiver = edge_index[0], edge_index[1]
    if atoms - skip > 0:
        getattr(module, kernel)[(atoms - skip, tiles)](
            grad, features, harmonics, *reads, coefficients, sender, receiver_runs[0],
            receiver_runs[1], per_edge, partial_harmonics, shares, channels, rows, *extra,
            **tile,
        )  # fmt: skip
        _sum_by_sender[(atoms - skip, tiles)](
            shares, receiver, atoms - skip, sender_runs[0], sender_runs[1], grad_features,
            channels, D1=d1, D1P=triton.next_power_of_2(d1), CHANNELS=tile["CHANNELS"],
            num_warps=tile["num_warps"],
        )  # fmt: skip
    if skip and edges:
        _zero_skipped_edges[(triton.cdiv(edges, EDGES),)](
            receiver, atoms - skip, per_edge, partial_harmonics, edges,
            per_edge[0].numel(), tiles * d2, EDGES=EDGES, COLUMNS=64,
        )  # fmt: skip
    return grad_features, partial_harmonics.sum(dim=1)
