"""MACE's product basis (the symmetric contraction) as Triton kernels, one program per atom and
tile of channels (CUDA).

Per atom n and channel c, with x̃ = (x[n, :, c], 1) and the coefficients of the atom's
element row (dynamics/product_basis.py reads them from the model):

    out[n, i, c] = sum_m coefficients[row(n), i, m, c] * prod_s x̃[monomials[m, s]]

Layouts (all contiguous): x (N, D_in, C) in cuEquivariance's ``ir_mul`` order; rows (N,) int32
(-1: an element the run does not have, NaN out); monomials (M, S) int32, S factors each (index
D_in is the constant 1); coefficients (E, D_out, M, C); out (N, D_out, C). The monomials'
values stay in registers: nothing per monomial is written to memory.

Backward, for forces and stress (one order: MD needs no second derivative), per input
component j: dL/dx[n, j, c] = sum over the monomials that hold x_j of
``(sum_i grad[n, i, c] coefficients[row, i, m, c]) * count * prod(other factors)``, from the
tables of product_basis.derivative_entries (the monomials of each j, grouped), so every sum
is a plain reduction: no atomics, and the same inputs give the same bits.

``tests/test_product_basis.py`` checks both kernels against product_basis.py's torch formulas
in Triton's interpreter on the CPU, and compiles them for sm_90.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CHANNELS = 32  # channels per program
MONOMIALS = 32  # monomials (or derivative entries) per step


@triton.jit
def _factor(x_atom, index, c, c_ok, channels, D_IN: tl.constexpr):
    """x̃ at a block of component indices, for the channels ``c``: (block, CHANNELS); 1 where
    the index is D_in (the constant)."""
    mask = (index < D_IN)[:, None] & c_ok[None, :]
    return tl.load(x_atom + index[:, None] * channels + c[None, :], mask=mask, other=1.0)


@triton.jit
def _coefficients(table, row, i, m, m_ok, c, c_ok, monomials, channels,
                  D_OUT: tl.constexpr):  # fmt: skip
    """The row's coefficients for outputs ``i``, monomials ``m`` and channels ``c``:
    (D_OUT_P, block, CHANNELS), zero in the padding."""
    mask = (i < D_OUT)[:, None, None] & m_ok[None, :, None] & c_ok[None, None, :]
    offset = ((row * D_OUT + i[:, None, None]) * monomials + m[None, :, None]) * channels
    return tl.load(table + offset + c[None, None, :], mask=mask, other=0.0)


@triton.jit
def _product_forward(x, rows, monomial_table, table, out, atoms, monomials, channels,
                     D_IN: tl.constexpr, D_OUT: tl.constexpr, D_OUT_P: tl.constexpr,
                     SLOTS: tl.constexpr, MONOMIALS: tl.constexpr,
                     CHANNELS: tl.constexpr):  # fmt: skip
    atom = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * CHANNELS + tl.arange(0, CHANNELS)
    c_ok = c < channels
    i = tl.arange(0, D_OUT_P)
    row = tl.load(rows + atom)
    safe_row = tl.maximum(row, 0).to(tl.int64)
    x_atom = x + atom * D_IN * channels
    total = tl.zeros([D_OUT_P, CHANNELS], dtype=out.dtype.element_ty)
    for start in range(0, monomials, MONOMIALS):
        m = start + tl.arange(0, MONOMIALS)
        m_ok = m < monomials
        value = tl.full([MONOMIALS, CHANNELS], 1.0, dtype=out.dtype.element_ty)
        for slot in tl.static_range(SLOTS):
            index = tl.load(monomial_table + m * SLOTS + slot, mask=m_ok, other=D_IN)
            value *= _factor(x_atom, index, c, c_ok, channels, D_IN)
        weights = _coefficients(table, safe_row, i, m, m_ok, c, c_ok, monomials, channels, D_OUT)
        total += tl.sum(weights * value[None, :, :], axis=1)
    total = tl.where(row >= 0, total, float("nan"))
    mask = (i < D_OUT)[:, None] & c_ok[None, :]
    tl.store(out + (atom * D_OUT + i[:, None]) * channels + c[None, :], total, mask=mask)


@triton.jit
def _product_backward(grad, x, rows, table, entries, offsets, grad_x, atoms, monomials,
                      channels, D_IN: tl.constexpr, D_OUT: tl.constexpr,
                      D_OUT_P: tl.constexpr, SLOTS: tl.constexpr, MONOMIALS: tl.constexpr,
                      CHANNELS: tl.constexpr):  # fmt: skip
    atom = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * CHANNELS + tl.arange(0, CHANNELS)
    c_ok = c < channels
    i = tl.arange(0, D_OUT_P)
    row = tl.load(rows + atom)
    safe_row = tl.maximum(row, 0).to(tl.int64)
    x_atom = x + atom * D_IN * channels
    g_mask = (i < D_OUT)[:, None] & c_ok[None, :]
    g = tl.load(grad + (atom * D_OUT + i[:, None]) * channels + c[None, :], mask=g_mask,
                other=0.0)  # fmt: skip
    for j in range(D_IN):
        total = tl.zeros([CHANNELS], dtype=grad_x.dtype.element_ty)
        end = tl.load(offsets + j + 1)
        for start in range(tl.load(offsets + j), end, MONOMIALS):
            k = start + tl.arange(0, MONOMIALS)
            k_ok = k < end
            entry = entries + k * (SLOTS + 1)
            m = tl.load(entry, mask=k_ok, other=0)
            count = tl.load(entry + SLOTS, mask=k_ok, other=0).to(grad_x.dtype.element_ty)
            value = tl.full([MONOMIALS, CHANNELS], 1.0, dtype=grad_x.dtype.element_ty)
            for slot in tl.static_range(1, SLOTS):
                index = tl.load(entry + slot, mask=k_ok, other=D_IN)
                value *= _factor(x_atom, index, c, c_ok, channels, D_IN)
            weights = _coefficients(table, safe_row, i, m, k_ok, c, c_ok, monomials, channels,
                                    D_OUT)  # fmt: skip
            weighted = tl.sum(weights * g[:, None, :], axis=0)  # (MONOMIALS, CHANNELS)
            total += tl.sum(weighted * value * count[:, None], axis=0)
        total = tl.where(row >= 0, total, float("nan"))
        tl.store(grad_x + (atom * D_IN + j) * channels + c, total, mask=c_ok)


def _constants(inputs: int, outputs: int, slots: int) -> dict[str, int]:
    return {
        "D_IN": inputs, "D_OUT": outputs, "D_OUT_P": triton.next_power_of_2(outputs),
        "SLOTS": slots, "MONOMIALS": MONOMIALS, "CHANNELS": CHANNELS,
    }  # fmt: skip


def forward(
    x: torch.Tensor, rows: torch.Tensor, monomials: torch.Tensor, coefficients: torch.Tensor
) -> torch.Tensor:
    """(N, D_in, C) -> (N, D_out, C): the product basis of every atom."""
    atoms, _, channels = x.shape
    out = torch.empty((atoms, coefficients.shape[1], channels), dtype=x.dtype, device=x.device)
    grid = (atoms, triton.cdiv(channels, CHANNELS))
    if atoms > 0:
        _product_forward[grid](x, rows, monomials, coefficients, out, atoms,
                               monomials.shape[0], channels,
                               **_constants(x.shape[1], coefficients.shape[1],
                                            monomials.shape[1]))  # fmt: skip
    return out


def backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    rows: torch.Tensor,
    coefficients: torch.Tensor,
    entries: torch.Tensor,
    offsets: torch.Tensor,
) -> torch.Tensor:
    """dL/dx (N, D_in, C) for dL/d(out) = ``grad`` (N, D_out, C)."""
    atoms, _, channels = x.shape
    grad_x = torch.empty_like(x)
    grid = (atoms, triton.cdiv(channels, CHANNELS))
    constants = _constants(x.shape[1], coefficients.shape[1], entries.shape[1] - 1)
    if atoms > 0:
        _product_backward[grid](grad, x, rows, coefficients, entries, offsets, grad_x, atoms,
                                coefficients.shape[2], channels, **constants)  # fmt: skip
    return grad_x
