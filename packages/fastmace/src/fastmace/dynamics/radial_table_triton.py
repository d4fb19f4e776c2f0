"""The radial table's lookup and its backward as Triton kernels (CUDA).

The same formulas as ``radial_table._evaluate`` (Horner's rule on each interval's cubic);
``tests/test_radial_table.py`` checks the two against each other in Triton's interpreter on
the CPU and on the GPU. The lookup writes each weight once (the torch formula writes the four
gathered coefficient rows first); the backward sums each pair's row of gradients in registers.
With ``start``, each pair reads its own table among several stacked ones (pair_table.py: one per
pair of elements): its intervals begin at row ``start[pair]`` of the coefficients.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

PAIRS = 32  # pairs per program
COLUMNS = 128  # weights per program (lookup) or per loop step (backward)


@triton.jit
def _interval(lengths, pair, valid, inverse_spacing, intervals, start, HAS_START: tl.constexpr):
    """Row k of the interval, position t in [0, 1] and whether r lies inside the table."""
    x = tl.load(lengths + pair, mask=valid, other=0.0) * tl.load(inverse_spacing)
    k = tl.minimum(tl.maximum(tl.floor(x), 0.0), intervals - 1.0)
    t = tl.minimum(tl.maximum(x - k, 0.0), 1.0)
    row = k.to(tl.int64)
    if HAS_START:
        row += tl.load(start + pair, mask=valid, other=0).to(tl.int64)
    return row, t, x < intervals


@triton.jit
def _lookup(lengths, coefficients, out, pairs, width, inverse_spacing, intervals, start,
            HAS_START: tl.constexpr, PAIRS: tl.constexpr, COLUMNS: tl.constexpr):  # fmt: skip
    # 64-bit: pair * width passes 2^31 beyond 1.6 million pairs of 1,280 weights.
    pair = (tl.program_id(0) * PAIRS + tl.arange(0, PAIRS)).to(tl.int64)
    column = tl.program_id(1) * COLUMNS + tl.arange(0, COLUMNS)
    valid = pair < pairs
    k, t, inside = _interval(lengths, pair, valid, inverse_spacing, intervals, start, HAS_START)
    t = t[:, None]
    mask = valid[:, None] & (column[None, :] < width)
    row = 4 * k[:, None] * width + column[None, :]
    w = tl.load(coefficients + row + 3 * width, mask=mask, other=0.0)
    w = w * t + tl.load(coefficients + row + 2 * width, mask=mask, other=0.0)
    w = w * t + tl.load(coefficients + row + width, mask=mask, other=0.0)
    w = w * t + tl.load(coefficients + row, mask=mask, other=0.0)
    w = tl.where(inside[:, None], w, 0.0)
    tl.store(out + pair[:, None] * width + column[None, :], w, mask=mask)


@triton.jit
def _lookup_backward(grad, lengths, coefficients, out, pairs, width, inverse_spacing,
                     intervals, start, HAS_START: tl.constexpr, PAIRS: tl.constexpr,
                     COLUMNS: tl.constexpr):  # fmt: skip
    # 64-bit: pair * width passes 2^31 beyond 1.6 million pairs of 1,280 weights.
    pair = (tl.program_id(0) * PAIRS + tl.arange(0, PAIRS)).to(tl.int64)
    valid = pair < pairs
    k, t, inside = _interval(lengths, pair, valid, inverse_spacing, intervals, start, HAS_START)
    t = t[:, None]
    total = tl.zeros([PAIRS], dtype=out.dtype.element_ty)
    for start in range(0, width, COLUMNS):
        column = start + tl.arange(0, COLUMNS)
        mask = valid[:, None] & (column[None, :] < width)
        row = 4 * k[:, None] * width + column[None, :]
        slope = 3.0 * t * tl.load(coefficients + row + 3 * width, mask=mask, other=0.0)
        slope = (slope + 2.0 * tl.load(coefficients + row + 2 * width, mask=mask, other=0.0)) * t
        slope += tl.load(coefficients + row + width, mask=mask, other=0.0)
        g = tl.load(grad + pair[:, None] * width + column[None, :], mask=mask, other=0.0)
        total += tl.sum(g * slope, axis=1)
    total = tl.where(inside, total * tl.load(inverse_spacing), 0.0)
    tl.store(out + pair, total, mask=valid)


def lookup(
    lengths: torch.Tensor,
    coefficients: torch.Tensor,
    inverse_spacing: torch.Tensor,
    start: torch.Tensor | None = None,
    intervals: int | None = None,
) -> torch.Tensor:
    """(P,) lengths -> (P, W) weights; with ``start`` (P,) each pair's table begins at that
    row of ``coefficients`` and has ``intervals`` rows."""
    lengths = lengths.contiguous()
    pairs, width = lengths.shape[0], coefficients.shape[2]
    intervals = coefficients.shape[0] if intervals is None else intervals
    out = torch.empty((pairs, width), dtype=coefficients.dtype, device=coefficients.device)
    grid = (triton.cdiv(pairs, PAIRS), triton.cdiv(width, COLUMNS))
    _lookup[grid](lengths, coefficients, out, pairs, width, inverse_spacing, intervals,
                  lengths if start is None else start.contiguous(), HAS_START=start is not None,
                  PAIRS=PAIRS, COLUMNS=COLUMNS)  # fmt: skip
    return out


def lookup_backward(
    grad: torch.Tensor,
    lengths: torch.Tensor,
    coefficients: torch.Tensor,
    inverse_spacing: torch.Tensor,
    start: torch.Tensor | None = None,
    intervals: int | None = None,
) -> torch.Tensor:
    """dL/dw (P, W) -> dL/dr (P,); ``start`` and ``intervals`` as for :func:`lookup`."""
    lengths, grad = lengths.contiguous(), grad.contiguous()
    pairs, width = lengths.shape[0], coefficients.shape[2]
    intervals = coefficients.shape[0] if intervals is None else intervals
    out = torch.empty_like(lengths)
    _lookup_backward[(triton.cdiv(pairs, PAIRS),)](
        grad, lengths, coefficients, out, pairs, width, inverse_spacing, intervals,
        lengths if start is None else start.contiguous(), HAS_START=start is not None,
        PAIRS=PAIRS, COLUMNS=COLUMNS,
    )  # fmt: skip
    return out
