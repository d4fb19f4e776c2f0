"""Matrix products with BF16 inputs and float32 accumulation: the GEMMs of the BF16 tier.

``matmul(x, weight, "bf16")`` rounds both factors to bfloat16 (8 significant bits) and sums
their products in float32, returning float32: what tensor cores do with BF16 inputs. The
products of two bfloat16 numbers are exact in float32 (8 + 8 significant bits fit in 24), so
rounding the factors and multiplying in float32 gives the same numbers up to the order of the
sums; that is how it runs on the CPU (slower than float32 there: it exists to check the
tier's accuracy without a GPU). On CUDA it is one GEMM on BF16 tensor cores with a float32
result (``torch.mm(..., out_dtype=torch.float32)``).

The backward pass (what forces and stress need: the gradient with respect to ``x``) is the
same kind of product, the incoming gradient rounded to BF16 too. Weights get no gradient:
the potential's weights never need one.
"""

from __future__ import annotations

import torch

PRECISIONS = ("float32", "bf16")


def matmul(x: torch.Tensor, weight: torch.Tensor, precision: str = "float32") -> torch.Tensor:
    """``x @ weight`` over the last axis of ``x`` (any leading shape), in ``precision``."""
    if precision == "float32":
        return x @ weight
    if precision != "bf16":
        raise ValueError(f"unknown GEMM precision {precision!r}; choose one of {PRECISIONS}")
    if x.dtype != torch.float32:
        raise ValueError(f"the BF16 tier runs float32 models, got {x.dtype} features")
    rows = x.reshape(-1, x.shape[-1])
    out = _Bf16Matmul.apply(rows, weight)
    return out.reshape(*x.shape[:-1], weight.shape[-1])


def bf16_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(m, k) @ (k, n) with both factors rounded to bfloat16, summed and returned in float32."""
    a16, b16 = a.to(torch.bfloat16), b.to(torch.bfloat16)
    if a.is_cuda and has_tensor_core_path():
        return torch.mm(a16, b16, out_dtype=torch.float32)
    return torch.mm(a16.to(torch.float32), b16.to(torch.float32))


def has_tensor_core_path() -> bool:
    """Whether this torch has ``torch.mm(..., out_dtype=)`` (torch 2.8 and later): without it
    CUDA computes the same numbers the CPU's way, in float32 GEMMs."""
    return "dtype" in torch.ops.aten.mm.overloads()


class _Bf16Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(weight)
        return bf16_mm(rows, weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (weight,) = ctx.saved_tensors
        return bf16_mm(grad.contiguous(), weight.t()), None
