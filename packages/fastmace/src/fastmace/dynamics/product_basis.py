"""FastMACE's own product basis: a drop-in for a block's symmetric contraction.

MACE's product basis raises each atom's features to a polynomial of degree up to the model's
correlation order (3 for the foundation models), channel by channel, with weights that depend
on the atom's element. Per atom n of element z and channel c, with x the atom's features of
that channel (D_in components, cuEquivariance's ``ir_mul`` layout) and x̃ = (x, 1):

    out[n, i, c] = sum_m coefficients[z, i, m, c] * x̃[j_m] x̃[k_m] x̃[l_m]

over the monomials m = (j_m <= k_m <= l_m) of degree up to three (the constant 1 at index
D_in makes lower degrees monomials of the same form). The coefficients are the element's
weights times a basis that depends on the irreps alone: :func:`polynomial_of` reads that
basis from the block's own module (cuEquivariance's description of the polynomial it
evaluates) and keeps the monomials that occur, and :func:`product_disagreement` checks the
result against the module on random inputs before it is used. The coefficients are made for
the elements of one run, as the skip connection's maps are (dynamics/species_linear.py).

On CUDA the sum runs as Triton kernels generated from the basis's nonzero terms
(dynamics/product_codegen.py), forward and backward; elsewhere as the same formulas in torch.
Only the symmetric contraction changes: the linear map after it and the skip connection stay
as they are. docs/design/product-basis.md says how it works and where it stands.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from fastmace.dynamics import kernel_sources
from fastmace.dynamics.module_copy import shallow_copy


class ProductBasisError(ValueError):
    """The block's product basis is not one these formulas compute (the message says why)."""


@dataclass(frozen=True)
class ProductPolynomial:
    """What a block's symmetric contraction computes, for the elements of one run.

    Attributes:
        monomials: (M, S) int32, each monomial's S indices into x̃ (D_in means 1), S the
            correlation order: the monomials of degree up to S, as products of S factors.
        coefficients: (E, D_out, M, C) float64: element row e's coefficient of monomial m in
            output component i of channel c.
        rows: (model elements,) int32, each model element's row of ``coefficients`` (-1 for
            the elements the run does not have).
        inputs: D_in, the components of one channel's features.
        basis: (M, P, D_out) float64, the coefficients' element-independent part
            (:func:`polynomial_basis`), and ``weights`` (E, P, C) float64 the kept elements'
            weights: ``coefficients[e, i, m, c] = sum_p basis[m, p, i] weights[e, p, c]``.
    """

    monomials: torch.Tensor
    coefficients: torch.Tensor
    rows: torch.Tensor
    inputs: int
    basis: torch.Tensor | None = None
    weights: torch.Tensor | None = None

    @property
    def outputs(self) -> int:
        return self.coefficients.shape[1]

    @property
    def channels(self) -> int:
        return self.coefficients.shape[3]


# ----------------------------------------------------------------------------- torch formulas


def _monomial_values(x: torch.Tensor, monomials: torch.Tensor) -> torch.Tensor:
    """(N, D_in, C) features -> (N, M, C) the value of each monomial."""
    extended = torch.cat([x, x.new_ones((x.shape[0], 1, x.shape[2]))], dim=1)
    index = monomials.long()
    values = extended[:, index[:, 0]]
    for slot in range(1, index.shape[1]):
        values = values * extended[:, index[:, slot]]
    return values


def contract_reference(
    x: torch.Tensor, rows: torch.Tensor, monomials: torch.Tensor, coefficients: torch.Tensor
) -> torch.Tensor:
    """The product basis in torch: (N, D_in, C) features, each node's coefficient row (N,)
    (-1: an element the run does not have, NaN out) -> (N, D_out, C). Differentiable in x."""
    values = _monomial_values(x, monomials)
    # Every row's sum, then each node's own picked out: no host synchronisation, and E small.
    out = _picked(torch.einsum("nmc,eimc->enic", values, coefficients.to(x.dtype)), rows)
    return out.masked_fill((rows < 0)[:, None, None], float("nan"))


def _picked(per_row: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """(E, N, ...) -> (N, ...): each node's own row (row 0 where it has none)."""
    return per_row[rows.long().clamp_min(0), torch.arange(per_row.shape[1], device=rows.device)]


def contract_backward_reference(
    grad: torch.Tensor,
    x: torch.Tensor,
    rows: torch.Tensor,
    coefficients: torch.Tensor,
    entries: torch.Tensor,
    offsets: torch.Tensor,
) -> torch.Tensor:
    """dL/dx of :func:`contract_reference` for dL/d(out) = ``grad``, from the derivative
    tables (:func:`derivative_entries`) as the backward kernel reads them."""
    atoms, inputs, channels = x.shape
    extended = torch.cat([x, x.new_ones((atoms, 1, channels))], dim=1)
    table = entries.long()
    weighted = _picked(torch.einsum("nic,eimc->enmc", grad, coefficients.to(x.dtype)), rows)
    shares = weighted[:, table[:, 0]] * table[:, -1].to(x.dtype)[None, :, None]
    for slot in range(1, table.shape[1] - 1):
        shares = shares * extended[:, table[:, slot]]
    counts = (offsets[1:] - offsets[:-1]).long()
    variable = torch.repeat_interleave(torch.arange(inputs, device=x.device), counts)
    found = x.new_zeros((atoms, inputs, channels)).index_add_(
        1, variable, shares[:, : len(variable)]
    )
    return found.masked_fill((rows < 0)[:, None, None], float("nan"))


def all_monomials(inputs: int, degree: int) -> torch.Tensor:
    """Every monomial of degree up to ``degree`` in ``inputs`` variables, as (M, degree)
    sorted index tuples into x̃ (index ``inputs`` is the constant 1)."""
    found = itertools.combinations_with_replacement(range(inputs + 1), degree)
    return torch.tensor(list(found), dtype=torch.int32)


def derivative_entries(monomials: torch.Tensor, inputs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The monomials' first derivatives, grouped by variable: for variable j, the rows
    ``offsets[j]:offsets[j+1]`` of ``entries`` (K, S + 1) are (m, the S - 1 other factors,
    count): d(monomial m)/dx_j is ``count`` times the product of x̃ at the other factors.
    Int32: the backward kernel's tables."""
    slots = monomials.shape[1]
    by_variable: list[list[tuple[int, ...]]] = [[] for _ in range(inputs)]
    for m, factors in enumerate(monomials.tolist()):
        for j in sorted(set(factors) - {inputs}):
            rest = list(factors)
            rest.remove(j)
            by_variable[j].append((m, *rest, factors.count(j)))
    entries = [entry for group in by_variable for entry in group]
    offsets = [0, *itertools.accumulate(len(group) for group in by_variable)]
    empty = (0, *[inputs] * (slots - 1), 0)  # one harmless row: no tensor of zero rows
    table = torch.tensor(entries or [empty], dtype=torch.int32).reshape(-1, slots + 1)
    return table, torch.tensor(offsets, dtype=torch.int32)


# ----------------------------------------------------------------------------- the operator


@torch.library.custom_op("fastmace::product_basis_terms", mutates_args=())
def product_basis_terms(
    x: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor, coefficients: torch.Tensor,
    key: str,
) -> torch.Tensor:  # fmt: skip
    """The product basis with kernels generated for the basis registered under ``key``
    (dynamics/product_codegen.py): (N, D_in, C) -> (N, D_out, C); differentiable in x.
    ``weights`` (E, P, C) are the kept elements', ``coefficients`` (T,) the basis's terms'."""
    from fastmace.dynamics import product_codegen

    if kernel_sources.kernels_run(x):
        return product_codegen.forward(key, x, rows, weights, coefficients)
    monomials, basis, _ = product_codegen.basis_of(key)
    table = torch.einsum("mpi,epc->eimc", basis.to(weights), weights)
    return contract_reference(x, rows, monomials.to(x.device), table)


@product_basis_terms.register_fake
def _product_basis_terms_shape(x, rows, weights, coefficients, key):
    from fastmace.dynamics import product_codegen

    outputs = product_codegen.basis_of(key)[1].shape[2]
    return x.new_empty((x.shape[0], outputs, x.shape[2]))


@torch.library.custom_op("fastmace::product_basis_terms_backward", mutates_args=())
def product_basis_terms_backward(
    grad: torch.Tensor, x: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor,
    coefficients: torch.Tensor, key: str,
) -> torch.Tensor:  # fmt: skip
    """dL/dx of :func:`product_basis_terms` (not differentiable again)."""
    from fastmace.dynamics import product_codegen

    if kernel_sources.kernels_run(x):
        return product_codegen.backward(key, grad, x, rows, weights, coefficients)
    monomials, basis, inputs = product_codegen.basis_of(key)
    table = torch.einsum("mpi,epc->eimc", basis.to(weights), weights)
    entries, offsets = derivative_entries(monomials, inputs)
    return contract_backward_reference(grad, x, rows, table, entries.to(x.device),
                                       offsets.to(x.device))  # fmt: skip


@product_basis_terms_backward.register_fake
def _product_basis_terms_backward_shape(grad, x, rows, weights, coefficients, key):
    return torch.empty_like(x)


def _setup_terms(ctx, inputs, output) -> None:
    x, rows, weights, coefficients, key = inputs
    ctx.save_for_backward(x, rows, weights, coefficients)
    ctx.key = key


def _backward_terms(ctx, grad):
    x, rows, weights, coefficients = ctx.saved_tensors
    found = product_basis_terms_backward(grad.contiguous(), x, rows, weights, coefficients,
                                         ctx.key)  # fmt: skip
    return found, None, None, None, None


product_basis_terms.register_autograd(_backward_terms, setup_context=_setup_terms)


class ProductBasis(torch.nn.Module):
    """A block's symmetric contraction with cuEquivariance's calling convention.

    ``forward(x (N, D_in*C), indices (N,))``, ``indices`` each node's element as the model
    numbers them, returns (N, D_out*C) in the layout of the module it replaces (whose input
    and output transposes it keeps). A node of an element the run does not have gets NaN.
    """

    def __init__(
        self,
        polynomial: ProductPolynomial,
        original: torch.nn.Module,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        super().__init__()
        from fastmace.dynamics import product_codegen

        assert polynomial.basis is not None and polynomial.weights is not None
        basis = (polynomial.monomials, polynomial.basis, polynomial.inputs)
        self.key = product_codegen.register(*basis)
        terms = product_codegen.term_coefficients(*basis)
        self.register_buffer("weights", polynomial.weights.to(device, dtype))
        self.register_buffer("term_coefficients", terms.to(device, dtype))
        self.register_buffer("rows", polynomial.rows.to(device))
        self.inputs, self.channels = polynomial.inputs, polynomial.channels
        self.transpose_in, self.transpose_out = original.transpose_in, original.transpose_out

    def forward(self, x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        atoms = x.shape[0]
        features = self.transpose_in(x).reshape(atoms, self.inputs, self.channels).contiguous()
        rows = self.rows[indices.long()]
        out = product_basis_terms(features, rows, self.weights, self.term_coefficients,
                                  self.key)  # fmt: skip
        return self.transpose_out(out.reshape(atoms, -1))


# ----------------------------------------------------------------------------- from a model


def _is_cueq_contraction(module: torch.nn.Module) -> bool:
    return hasattr(module, "etp") and hasattr(module, "weight") and hasattr(module, "transpose_in")


def _effective_weights(module: torch.nn.Module) -> torch.Tensor:
    """(model elements, P, C) float64: the weights the module's polynomial is linear in
    (cuEquivariance applies ``original_mace``'s projection to its stored weights first)."""
    weight = module.weight.detach().double()
    projection = getattr(module, "projection", None)
    if projection is not None:
        weight = torch.einsum("zau,ab->zbu", weight, projection.detach().double())
    return weight


def _dimensions(module: torch.nn.Module) -> tuple[int, int, int, int]:
    """D_in, D_out, C and the correlation order of a cuEquivariance SymmetricContraction."""
    channels = module.irreps_in.muls[0]
    return (module.irreps_in.dim // channels, module.irreps_out.dim // channels, channels,
            int(module.contraction_degree))  # fmt: skip


def polynomial_basis(module: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """The monomials (M, S) the module's polynomial uses and its basis (M, P, D_out) float64:
    with weights w (P, C) of an element, output i of channel c is
    ``sum_m sum_p basis[m, p, i] w[p, c] * monomial m of x[:, c]``.

    Read from the module's own description of what it computes (cuEquivariance's segmented
    polynomial): each path multiplies weight segment p, feature components j, k, ... and adds
    to output component i, with one coefficient, channel by channel. A description of another
    form is refused."""
    if not _is_cueq_contraction(module):
        raise ProductBasisError(
            f"a {type(module).__name__} is not cuEquivariance's SymmetricContraction: the "
            "product basis reads cuEquivariance's description of it; convert the model with "
            "backend='cueq', or leave the own product basis off"
        )
    inputs, outputs, _, degree = _dimensions(module)
    directions = _effective_weights(module).shape[1]
    terms: dict[tuple[tuple[int, ...], int, int], float] = {}
    for operation, product in module.etp.polynomial.operations:
        buffers = tuple(operation.buffers)
        factors = len(buffers) - 2
        channel_wise = product.subscripts == ",".join(["u"] * len(buffers))
        if not channel_wise or buffers != (0, *[1] * factors, 2) or factors > degree:
            raise ProductBasisError(
                f"a term of the symmetric contraction is not weight x features^k -> output, "
                f"channel by channel ({product.subscripts}, operands {buffers}): not a form "
                "these formulas compute"
            )
        for path in product.paths:
            p, *features, i = (int(index) for index in path.indices)
            key = (tuple(sorted(features)) + (inputs,) * (degree - factors), p, i)
            terms[key] = terms.get(key, 0.0) + float(path.coefficients)
    monomials = sorted({key[0] for key, value in terms.items() if value != 0.0})
    position = {monomial: m for m, monomial in enumerate(monomials)}
    basis = torch.zeros((len(monomials), directions, outputs), dtype=torch.float64)
    for (monomial, p, i), value in terms.items():
        if value != 0.0:
            basis[position[monomial], p, i] = value
    return torch.tensor(monomials, dtype=torch.int32).reshape(-1, degree), basis


def polynomial_of(module: torch.nn.Module, columns: list[int]) -> ProductPolynomial:
    """The :class:`ProductPolynomial` of ``module`` for the model elements ``columns`` (their
    indices in the model's element list), from its basis and those elements' weights."""
    monomials, basis = polynomial_basis(module)
    weights = _effective_weights(module).cpu()
    coefficients = torch.einsum("mpi,epc->eimc", basis, weights[list(columns)])
    rows = torch.full((weights.shape[0],), -1, dtype=torch.int32)
    rows[list(columns)] = torch.arange(len(columns), dtype=torch.int32)
    inputs = _dimensions(module)[0]
    kept = weights[list(columns)].contiguous()
    return ProductPolynomial(monomials, coefficients.contiguous(), rows, inputs, basis, kept)


def _random_inputs(
    polynomial: ProductPolynomial, atoms: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(atoms, D_in, C) float64 random features and (atoms,) model element indices drawn from
    the polynomial's elements: what the checks compare a block's modules on."""
    generator = torch.Generator().manual_seed(seed)
    listed = torch.nonzero(polynomial.rows >= 0).flatten()
    indices = listed[torch.randint(0, len(listed), (atoms,), generator=generator)]
    x = torch.randn((atoms, polynomial.inputs, polynomial.channels), generator=generator,
                    dtype=torch.float64)  # fmt: skip
    return x, indices


def product_disagreement(
    module: torch.nn.Module, polynomial: ProductPolynomial, atoms: int = 11, seed: int = 1
) -> float:
    """Largest difference between ``module`` and the formulas with ``polynomial`` on random
    features of the polynomial's elements, relative to the largest output (the formulas in
    float64, the module in its own dtype)."""
    dtype = module.weight.dtype
    device = module.weight.device
    x, indices = _random_inputs(polynomial, atoms, seed)
    with torch.no_grad():
        raw = module(x.flatten(1).to(device, dtype), indices.to(device, torch.int32))
        wanted = module.transpose_out(
            contract_reference(x, polynomial.rows[indices], polynomial.monomials,
                               polynomial.coefficients).flatten(1).to(device, dtype)
        ).double()  # fmt: skip
    return float((raw.double() - wanted).abs().max() / wanted.abs().max().clamp_min(1e-300))


def product_basis_model(
    model: torch.nn.Module, species: list[int], tolerance: float | None = None
) -> torch.nn.Module:
    """A copy of ``model`` whose product blocks contract with :class:`ProductBasis`, made for
    the elements ``species`` (atomic numbers, each one of the model's).

    The copy shares every weight with ``model``. Each block's polynomial is read from its own
    module and checked against it (:func:`product_disagreement`, within ``tolerance``: by
    default 1e-5 in float32, 1e-12 in float64), and so is the module that replaces it, as it
    will run (:func:`module_disagreement`: on CUDA, its kernels); a block that fails, whose
    kernels fail to compile or run, or that is not cuEquivariance's, raises
    :class:`ProductBasisError` saying which.
    """
    products = getattr(model, "products", None)
    if products is None:
        raise ProductBasisError(f"a {type(model).__name__} has no product blocks")
    model_species = [int(z) for z in model.atomic_numbers]
    columns = sorted({model_species.index(int(z)) for z in species})
    copy = shallow_copy(model)
    blocks = shallow_copy(products)
    copy.products = blocks
    for index, block in enumerate(products):
        original = block.symmetric_contractions
        # A product that ignores the element (mace's use_agnostic_product) has one row of
        # weights, which every node reads.
        agnostic = getattr(original, "weight", None) is not None and original.weight.shape[0] == 1
        polynomial = polynomial_of(original, [0] if agnostic else columns)
        dtype, device = original.weight.dtype, original.weight.device
        bound = tolerance if tolerance is not None else (
            1e-12 if dtype == torch.float64 else 1e-5)  # fmt: skip
        disagreement = product_disagreement(original, polynomial)
        if not disagreement <= bound:
            raise ProductBasisError(
                f"product block {index}: the formulas differ from the block's own symmetric "
                f"contraction by {disagreement:.2e} (relative), more than {bound:.0e}"
            )
        ours = ProductBasis(polynomial, original, dtype, device)
        try:  # the module that will run: on CUDA, the kernels generated for this basis
            difference = module_disagreement(ours, original, polynomial)
        except Exception as failure:  # a kernel that cannot compile or run
            raise ProductBasisError(
                f"product block {index}: FastMACE's kernels failed: "
                f"{type(failure).__name__}: {str(failure)[:300]}"
            ) from failure
        if not difference <= bound:
            raise ProductBasisError(
                f"product block {index}: FastMACE's kernels differ from the block's own "
                f"symmetric contraction by {difference:.2e} (relative), more than {bound:.0e}"
            )
        changed = shallow_copy(block)
        changed.symmetric_contractions = ours
        blocks[index] = changed
    return copy


def module_disagreement(
    ours: torch.nn.Module,
    original: torch.nn.Module,
    polynomial: ProductPolynomial,
    atoms: int = 11,
    seed: int = 2,
) -> float:
    """Largest difference between ``ours`` (a :class:`ProductBasis`, whose kernels run on
    CUDA) and the block's ``original`` module, on the same random features of the polynomial's
    elements, relative to the largest output; both in the module's dtype."""
    dtype, device = original.weight.dtype, original.weight.device
    features, indices = _random_inputs(polynomial, atoms, seed)
    x = features.flatten(1).to(device, dtype)
    indices = indices.to(device, torch.int32)
    with torch.no_grad():
        want = original(x, indices).double()
        got = ours(x, indices).double()
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-300))
