"""The product basis as Triton kernels written out for one basis (CUDA).

Most entries of the basis (monomials x directions x outputs) are zero, and reading a table of
them per element and channel is what bounded a table-driven kernel (4x slower than this one
on an H200: docs/design/product-basis.md). Here the basis's nonzero terms are written into
the kernel's source instead, as straight-line code: a program holds a tile of atoms x
channels of their D_in features and their elements' P weights in registers, one value per
thread, and each term adds ``coefficient * w[p] * x[a] * x[b] * ...`` to output component i.
The backward writes out each term's derivative for every factor the same way. Memory
traffic is the features, the weights and the outputs; the basis's structure is the code.

The coefficients are literals in float32 kernels (a float32 number written exactly), and
read from ``coefficients`` (T,) in float64 ones (Triton would round a literal to float32).

Inputs (all contiguous): x (N, D_in, C) in cuEquivariance's ``ir_mul`` order; rows (N,)
int32 (-1: an element the run does not have, NaN out); weights (E, P, C), each kept
element's weights in the basis's directions (product_basis._effective_weights); coefficients
(T,), the terms' in the order of :func:`basis_terms`; out (N, D_out, C).

The source is generated once per basis, dtype kind and process and imported from a private
directory (kernel_sources.py); Triton's own cache keeps the compiled kernels by their source.
``tests/test_product_basis.py`` runs the generated kernels in Triton's interpreter against
product_basis.py's torch formulas and compiles them for sm_90.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass
from types import ModuleType

import torch

from fastmace.dynamics import kernel_sources

THREADS = 128  # one value of the tile per thread: 4 warps
_BASES: dict[str, tuple[torch.Tensor, torch.Tensor, int]] = {}


@dataclass(frozen=True)
class Term:
    """``coefficient * w[direction] * prod(x̃[factor])`` added to output ``output``."""

    factors: tuple[int, ...]  # indices below D_in only (the constant's are left out)
    direction: int
    output: int
    coefficient: float


def basis_terms(monomials: torch.Tensor, basis: torch.Tensor, inputs: int) -> list[Term]:
    """The nonzero entries of ``basis`` (M, P, D_out) as terms of the polynomial."""
    terms = []
    for m, p, i in torch.nonzero(basis).tolist():
        factors = tuple(j for j in monomials[m].tolist() if j < inputs)
        terms.append(Term(factors, p, i, float(basis[m, p, i])))
    return terms


def term_coefficients(monomials: torch.Tensor, basis: torch.Tensor, inputs: int) -> torch.Tensor:
    """(T,) float64: each term's coefficient, in the order the generated code reads them."""
    terms = basis_terms(monomials, basis, inputs)
    return torch.tensor([term.coefficient for term in terms], dtype=torch.float64)


def _coefficients(terms: list[Term], literal: bool) -> list[str]:
    """Each term's coefficient as the generated code reads it: a float32 literal (its repr
    is exact, and Triton takes a literal as float32), or a load from ``coefficients``."""
    if literal:
        return [kernel_sources.float32_literal(t.coefficient) for t in terms]
    return [f"tl.load(coefficients + {k})" for k in range(len(terms))]


def _product(names: list[str]) -> str:
    return " * ".join(names) if names else "1.0"


def kernel_source(
    monomials: torch.Tensor, basis: torch.Tensor, inputs: int, literal: bool = False
) -> str:
    """The Triton source of ``_forward`` and ``_backward`` for this basis; ``literal``: the
    coefficients written into the code (float32 kernels)."""
    terms = basis_terms(monomials, basis, inputs)
    coefficient = dict(zip(map(id, terms), _coefficients(terms, literal), strict=True))
    directions, outputs = basis.shape[1], basis.shape[2]
    by_output: dict[tuple[int, int], list[Term]] = defaultdict(list)
    for term in terms:
        by_output[term.output, term.direction].append(term)
    used = sorted({term.direction for term in terms})
    head = [
        "import triton",
        "import triton.language as tl",
        "",
        "",
    ]
    load_x = [
        f"    x{j} = tl.load(features + {j} * channels, mask=ok, other=0.0)" for j in range(inputs)
    ]
    load_w = [f"    w{p} = tl.load(weight + {p} * channels, mask=ok, other=0.0)" for p in used]
    # A tile of ATOMS atoms x CHANNELS channels; ``at(i, width)`` is the offset of component
    # i of each tile element in an (N, width, C) array.
    prologue = [
        "    atom = tl.program_id(0) * ATOMS + tl.arange(0, ATOMS)",
        "    c = tl.program_id(1) * CHANNELS + tl.arange(0, CHANNELS)",
        "    real = atom < atoms",
        "    ok = real[:, None] & (c < channels)[None, :]",
        "    row = tl.load(rows + atom, mask=real, other=0)",
        "    atom = atom.to(tl.int64)[:, None]",
        "    c = c[None, :]",
        f"    features = x + atom * {inputs} * channels + c",
        f"    weight = weights + tl.maximum(row, 0).to(tl.int64)[:, None] * {directions}"
        " * channels + c",
        *load_x,
        *load_w,
        "    missing = (row < 0)[:, None]",
    ]
    arguments = "channels, atoms, ATOMS: tl.constexpr, CHANNELS: tl.constexpr"
    forward = [
        "@triton.jit",
        f"def _forward(x, rows, weights, coefficients, out, {arguments}):",
        *prologue,
    ]
    for i in range(outputs):
        parts = []
        for (output, p), group in sorted(by_output.items()):
            if output != i:
                continue
            inner = [
                f"{coefficient[id(t)]} * {_product([f'x{j}' for j in t.factors])}" for t in group
            ]
            parts.append(f"w{p} * ({kernel_sources.joined_sum(inner, ' ' * 12)})")
        value = kernel_sources.joined_sum(parts, " " * 8) if parts else "x0 * 0.0"
        forward += [
            f"    o{i} = {value}",
            f"    o{i} = tl.where(missing, float('nan'), o{i})",
            f"    tl.store(out + (atom * {outputs} + {i}) * channels + c, o{i}, mask=ok)",
        ]
    backward = [
        "@triton.jit",
        f"def _backward(grad, x, rows, weights, coefficients, grad_x, {arguments}):",
        *prologue,
        *[
            f"    g{i} = tl.load(grad + (atom * {outputs} + {i}) * channels + c, mask=ok, "
            "other=0.0)"
            for i in range(outputs)
        ],
    ]
    pairs = sorted(by_output)
    backward += [f"    gw{i}_{p} = g{i} * w{p}" for i, p in pairs]
    for j in range(inputs):
        parts = []
        for term in terms:
            count = term.factors.count(j)
            if count == 0:
                continue
            rest = list(term.factors)
            rest.remove(j)
            scale = coefficient[id(term)] + ("" if count == 1 else f" * {count}.0")
            parts.append(f"{scale} * gw{term.output}_{term.direction} * "
                         f"{_product([f'x{k}' for k in rest])}")  # fmt: skip
        value = kernel_sources.joined_sum(parts, " " * 8) if parts else "x0 * 0.0"
        backward += [
            f"    d{j} = {value}",
            f"    d{j} = tl.where(missing, float('nan'), d{j})",
            f"    tl.store(grad_x + (atom * {inputs} + {j}) * channels + c, d{j}, mask=ok)",
        ]
    return "\n".join([*head, *forward, "", "", *backward, ""])


def register(monomials: torch.Tensor, basis: torch.Tensor, inputs: int) -> str:
    """A key for this basis, by which :func:`kernels` finds it (a custom op passes the key)."""
    digest = hashlib.sha256()
    for tensor in (monomials, basis):
        digest.update(tensor.contiguous().cpu().numpy().tobytes())
    digest.update(str((tuple(basis.shape), inputs)).encode())
    key = digest.hexdigest()[:24]
    _BASES[key] = (monomials.cpu(), basis.cpu(), inputs)
    return key


def basis_of(key: str) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The monomials, basis and D_in registered under ``key``."""
    return _BASES[key]


def kernels(key: str, literal: bool = False) -> ModuleType:
    """The module holding ``_forward`` and ``_backward`` for the basis registered under
    ``key`` (``literal``: float32 kernels, see :func:`kernel_source`), generated and imported
    once per process."""
    name = module_name(key, literal)
    return kernel_sources.load(name, lambda: kernel_source(*_BASES[key], literal=literal))


def module_name(key: str, literal: bool) -> str:
    return f"product_{key}_{'literal' if literal else 'loaded'}"


def _launch(
    key: str, x: torch.Tensor, threads: int = THREADS
) -> tuple[ModuleType, tuple[int, int], dict[str, int]]:
    """The kernels for ``x``'s dtype, the grid and the tile of ``threads`` values (a power of
    two from 32; benchmarks/product_kernels.py compares sizes): all channels of an atom in one
    program where they fit, else ``threads`` channels, and atoms to fill the rest."""
    import triton

    atoms, _, channels = x.shape
    tile_channels = min(threads, triton.next_power_of_2(channels))
    tile_atoms = threads // tile_channels
    grid = (triton.cdiv(atoms, tile_atoms), triton.cdiv(channels, tile_channels))
    tile = {"ATOMS": tile_atoms, "CHANNELS": tile_channels, "num_warps": threads // 32}
    return kernels(key, literal=x.dtype == torch.float32), grid, tile


def forward(
    key: str, x: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor,
    coefficients: torch.Tensor, threads: int = THREADS,
) -> torch.Tensor:  # fmt: skip
    """(N, D_in, C) -> (N, D_out, C) with the kernels of the basis under ``key``."""
    atoms, _, channels = x.shape
    outputs = _BASES[key][1].shape[2]
    out = torch.empty((atoms, outputs, channels), dtype=x.dtype, device=x.device)
    if atoms > 0:
        module, grid, tile = _launch(key, x, threads)
        module._forward[grid](x, rows, weights, coefficients, out, channels, atoms, **tile)
    return out


def backward(
    key: str,
    grad: torch.Tensor,
    x: torch.Tensor,
    rows: torch.Tensor,
    weights: torch.Tensor,
    coefficients: torch.Tensor,
    threads: int = THREADS,
) -> torch.Tensor:
    """dL/dx (N, D_in, C) for dL/d(out) = ``grad`` with the kernels of the basis under ``key``."""
    atoms, _, channels = x.shape
    grad_x = torch.empty_like(x)
    if atoms > 0:
        module, grid, tile = _launch(key, x, threads)
        module._backward[grid](grad, x, rows, weights, coefficients, grad_x, channels, atoms,
                               **tile)  # fmt: skip
    return grad_x
