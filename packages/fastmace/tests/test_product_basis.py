"""FastMACE's own product basis (dynamics/product_basis.py, product_codegen.py): the polynomial
read from each block is the block's symmetric contraction; the backward formula is the
gradient; the Triton kernels give the torch formulas' numbers in Triton's interpreter (CPU)
and compile for Hopper; a Potential that contracts with them gives mace-torch's float64
energies, forces and stresses."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import pytest
import torch
from conftest import CompileForHopper, cueq_template, python_report
from helpers.potential_checks import assert_matches_reference, model_of, on_cpu
from helpers.structures import ase_edges, cluster, copper_supercell, edges_on, triclinic_mixed

from fastmace.dynamics.potential import Potential, UnsupportedModelError
from fastmace.dynamics.product_basis import (
    ProductBasis,
    ProductBasisError,
    all_monomials,
    contract_backward_reference,
    contract_reference,
    derivative_entries,
    module_disagreement,
    polynomial_of,
    product_basis_model,
    product_disagreement,
)
from fastmace.dynamics.state import State
from fastmace.models import backends
from fastmace.models.templates import template

SPECIES = [29, 8, 6, 1]


@functools.cache
def cueq_model(name: str, dtype: torch.dtype) -> torch.nn.Module:
    if dtype == torch.float64:
        return cueq_template(name)  # conftest's: MP-0 small's, shared with test_species_linear
    return backends.convert(model_of(name, dtype), "cueq", "cpu")


# Correlation 3, as the foundation models' product blocks (vector and scalar out), made as a
# converted model makes them (cuEquivariance's module, mace's reduced basis), for three
# elements. Features to l = 2 rather than MP-0 medium's 3: cuEquivariance takes 30 s to
# describe that block on CI's CPU, 6 s this one. A program's tile is 128 values: 40 channels
# make one tile of two atoms (64 channels each, partly filled), 160 two tiles of one atom.
CORRELATION_3 = {
    "l2/vector": ("40x0e+40x1o+40x2e", "40x0e+40x1o", 3),
    "l2/scalar": ("160x0e+160x1o+160x2e", "160x0e", 3),
}


@functools.cache
def contraction(name: str, dtype: torch.dtype) -> tuple[torch.nn.Module, list[int]]:
    """A product block's symmetric contraction and the element indices the tests keep."""
    if name.startswith("tiny/"):
        model = cueq_model("tiny", dtype)
        numbers = [int(z) for z in model.atomic_numbers]
        kept = sorted(numbers.index(z) for z in SPECIES)
        return model.products[int(name[-1])].symmetric_contractions, kept
    import cuequivariance as cue
    import cuequivariance_torch as cuet

    irreps_in, irreps_out, degree = CORRELATION_3[name]
    torch.manual_seed(0)
    module = cuet.SymmetricContraction(
        cue.Irreps("O3", irreps_in), cue.Irreps("O3", irreps_out), contraction_degree=degree,
        num_elements=3, layout_in=cue.ir_mul, layout_out=cue.ir_mul, dtype=dtype,
        math_dtype=dtype,
    )  # fmt: skip
    return module, [0, 2]


CONTRACTIONS = ("tiny/0", "tiny/1", *CORRELATION_3)


@pytest.mark.parametrize("name", CONTRACTIONS)
def test_the_polynomial_read_from_each_block_is_what_the_block_computes(name):
    float32 = [(torch.float32, 1e-5)] if name != "l2/vector" else []  # the 6 s once is enough
    for dtype, rounding in [(torch.float64, 1e-13), *float32]:
        module, kept = contraction(name, dtype)
        polynomial = polynomial_of(module, kept)
        assert product_disagreement(module, polynomial) <= rounding
        # Only monomials that occur are kept, each of degree <= the correlation order.
        assert polynomial.monomials.shape[1] == module.contraction_degree
        assert (polynomial.coefficients.abs().amax(dim=(0, 1, 3)) > 0).all()


def test_a_polynomial_with_one_coefficient_changed_fails_the_check():
    """The check can fail: the same polynomial with one coefficient altered by 1e-6 of the
    largest is refused at float64's bound."""
    module, kept = contraction("l2/vector", torch.float64)
    polynomial = polynomial_of(module, kept)
    changed = polynomial.coefficients.clone()
    changed[0, 0, 0, 0] += 1e-6 * changed.abs().max()
    altered = type(polynomial)(polynomial.monomials, changed, polynomial.rows, polynomial.inputs)
    assert product_disagreement(module, altered) > 1e-12


def test_the_module_that_runs_is_checked_against_the_blocks_own():
    """What runs (on CUDA, the kernels) is compared with the block's module: right, within
    float64's rounding; with its weights altered by 1e-9, refused."""
    module, kept = contraction("l2/vector", torch.float64)
    polynomial = polynomial_of(module, kept)
    ours = ProductBasis(polynomial, module, torch.float64, torch.device("cpu"))
    assert module_disagreement(ours, module, polynomial) <= 1e-13
    altered = dataclasses.replace(polynomial, weights=polynomial.weights * (1 + 1e-9))
    wrong = ProductBasis(altered, module, torch.float64, torch.device("cpu"))
    assert module_disagreement(wrong, module, polynomial) > 1e-12


def test_an_e3nn_block_is_refused_with_the_reason():
    with pytest.raises(ProductBasisError, match="not cuEquivariance's SymmetricContraction"):
        product_basis_model(model_of("tiny", torch.float64), SPECIES)
    # A potential that may fall back keeps the model's own contraction and says why.
    with pytest.warns(RuntimeWarning, match="cuEquivariance's symmetric contraction runs"):
        potential = Potential(model_of("tiny", torch.float64), SPECIES, product_basis=True,
                              product_basis_fallback=True)  # fmt: skip
    assert not potential.product_basis_used
    assert "not cuEquivariance's SymmetricContraction" in potential.product_basis_failure


def test_a_long_range_model_refuses_the_product_basis_instead_of_dropping_it():
    with pytest.raises(UnsupportedModelError, match="leave product_basis off"):
        Potential(template("polar-tiny", dtype=torch.float32), [1, 8], product_basis=True)


def test_the_backward_formula_is_the_gradient_of_the_forward():
    """contract_backward_reference (the derivative tables, as the kernel reads them) against
    autograd through contract_reference; a node of an element the run lacks gets NaN."""
    polynomial = polynomial_of(*contraction("l2/vector", torch.float64))
    entries, offsets = derivative_entries(polynomial.monomials, polynomial.inputs)
    generator = torch.Generator().manual_seed(0)
    atoms, rows = 6, torch.tensor([0, 1, 0, 1, 0, -1], dtype=torch.int32)
    x = torch.randn((atoms, polynomial.inputs, polynomial.channels), generator=generator,
                    dtype=torch.float64, requires_grad=True)  # fmt: skip
    grad = torch.randn((atoms, polynomial.outputs, polynomial.channels), generator=generator,
                       dtype=torch.float64)  # fmt: skip
    out = contract_reference(x, rows, polynomial.monomials, polynomial.coefficients)
    assert out[-1].isnan().all() and out[:-1].isfinite().all()
    (want,) = torch.autograd.grad(out[:-1], x, grad[:-1])
    found = contract_backward_reference(grad, x.detach(), rows, polynomial.coefficients, entries,
                                        offsets)  # fmt: skip
    assert found[-1].isnan().all()
    assert torch.allclose(found[:-1], want[:-1], rtol=1e-12, atol=1e-12 * want.abs().max())


# The child reads the polynomials this process read (compare) and runs the kernels on them.
COMPARE = """
import json, torch
from fastmace.dynamics import product_codegen
from fastmace.dynamics.product_basis import contract_backward_reference, contract_reference

report = {{}}
generator = torch.Generator().manual_seed(0)
polynomials = torch.load({polynomials!r}, weights_only=True)
for name, p in polynomials.items():
    monomials, coefficients = p["monomials"].to({device!r}), p["coefficients"]
    entries, offsets = p["entries"].to({device!r}), p["offsets"].to({device!r})
    key = product_codegen.register(p["monomials"], p["basis"], p["inputs"])
    terms = product_codegen.term_coefficients(p["monomials"], p["basis"], p["inputs"])
    rows_kept, outputs, _, channels = coefficients.shape
    for dtype in (torch.float64, torch.float32):
        atoms = 5
        x = torch.randn((atoms, p["inputs"], channels), generator=generator, dtype=dtype)
        g = torch.randn((atoms, outputs, channels), generator=generator, dtype=dtype)
        rows = torch.randint(0, rows_kept, (atoms,), generator=generator, dtype=torch.int32)
        rows[-1] = -1  # an element the run does not have: NaN
        x, g, rows = x.to({device!r}), g.to({device!r}), rows.to({device!r})
        t = coefficients.to({device!r}, dtype)
        w, c = p["weights"].to({device!r}, dtype), terms.to({device!r}, dtype)
        want = [contract_reference(x, rows, monomials, t),
                contract_backward_reference(g, x, rows, t, entries, offsets)]
        got = [product_codegen.forward(key, x, rows, w, c),
               product_codegen.backward(key, g, x, rows, w, c)]
        report[f"{{name}} {{dtype}}"] = [
            [float((a[:-1] - b[:-1]).abs().max() / b[:-1].abs().max()) for a, b in zip(got, want)],
            [bool(a[-1].isnan().all()) for a in got],
        ]
print(json.dumps(report))
"""


def polynomials_for_the_kernels() -> dict[str, dict]:
    """Each block of the tiny template (correlation 2) and both of correlation 3 (1 and 4
    outputs per channel), as plain tensors a child process can load."""
    found = {}
    for name in CONTRACTIONS:
        p = polynomial_of(*contraction(name, torch.float64))
        entries, offsets = derivative_entries(p.monomials, p.inputs)
        found[name] = {
            "monomials": p.monomials, "coefficients": p.coefficients, "inputs": p.inputs,
            "entries": entries, "offsets": offsets, "basis": p.basis, "weights": p.weights,
        }  # fmt: skip
    return found


def compare(env: dict[str, str], device: str, directory: Path) -> dict:
    path = directory / "polynomials.pt"
    torch.save(polynomials_for_the_kernels(), path)
    return python_report(COMPARE.format(device=device, polynomials=str(path)), env)


def assert_kernels_agree(report: dict) -> None:
    assert len(report) == 8
    for case, (errors, nan_where_no_row) in report.items():
        rounding = 1e-5 if "float32" in case else 1e-13  # summation order
        # The generated kernels, forward and backward.
        assert len(errors) == 2 and all(error <= rounding for error in errors), (case, errors)
        assert len(nan_where_no_row) == 2 and all(nan_where_no_row), case


def test_the_kernels_match_the_torch_formulas_in_the_interpreter(clean_env, tmp_path):
    assert_kernels_agree(compare({**clean_env, "TRITON_INTERPRET": "1"}, "cpu", tmp_path))


def test_the_generated_kernels_compile_for_hopper():
    """The kernels written out for a basis of MP-0 medium's first block's size (410
    monomials of 16 components, 29 weight directions, 4 outputs, about 480 terms: 3 and 11 s
    to compile on CI's CPU), down to an sm_90 cubin."""
    from fastmace.dynamics import product_codegen

    generator = torch.Generator().manual_seed(0)
    every = all_monomials(16, 3)
    monomials = every[torch.randperm(len(every), generator=generator)[:410].sort().values]
    basis = torch.zeros((410, 29, 4), dtype=torch.float64)
    for count, value in ((410, 1.0), (70, 0.5)):  # each monomial one term, some two
        m = (
            torch.arange(410)
            if count == 410
            else torch.randint(0, 410, (count,), generator=generator)
        )
        p, i = (torch.randint(0, n, (count,), generator=generator) for n in (29, 4))
        basis[m, p, i] = value
    from fastmace.dynamics import kernel_sources

    key = product_codegen.register(monomials, basis, 16)
    module = product_codegen.kernels(key, literal=True)  # float32: coefficients in the code
    compiled: list[str] = []
    for name in ("_forward", "_backward"):
        setattr(module, name, CompileForHopper(getattr(module, name), compiled))
    try:
        x, rows = torch.zeros(5, 16, 128), torch.zeros(5, dtype=torch.int32)
        weights = torch.zeros(2, 29, 128)
        terms = product_codegen.term_coefficients(monomials, basis, 16).float()
        product_codegen.forward(key, x, rows, weights, terms)
        product_codegen.backward(key, torch.zeros(5, 4, 128), x, rows, weights, terms)
    finally:
        kernel_sources.forget(product_codegen.module_name(key, literal=True))  # not kernels now
    assert compiled == ["_forward", "_backward"]


# Correlation 2 with a vector output (tiny), and 3 (MP-0 small: 16 s to convert, MP-0 medium
# 40 s; its blocks' shapes are checked above).
@pytest.mark.parametrize("name", ["tiny", "mp0-small"])
def test_a_potential_on_the_own_product_basis_gives_mace_torchs_results(name):
    model = cueq_model(name, torch.float64)
    structures = [copper_supercell(), triclinic_mixed(), cluster()]
    state = State.from_atoms(structures)
    potential = Potential(model, SPECIES, product_basis=True)
    blocks = [block.symmetric_contractions for block in potential.model.products]
    assert all(isinstance(block, ProductBasis) for block in blocks)
    output = potential(state, ase_edges(state, potential.r_max, 1.5), compute_stress=True)
    # Against the e3nn model mace-torch builds, one structure at a time.
    assert_matches_reference(model_of(name, torch.float64), structures, output, state)


# A whole potential with the kernels run by Triton's interpreter, in a child process: the
# tiny template (correlation 2, vector output) and the shipped demo model, each converted to
# cuEquivariance in float64, against mace-torch's e3nn model one structure at a time.
POTENTIAL_IN_THE_INTERPRETER = """
import json, sys, torch
sys.path.insert(0, {tests!r})
from helpers.potential_checks import assert_matches_reference, model_of
from helpers.structures import ase_edges, cluster, copper_supercell, triclinic_mixed
from fastmace.dynamics import kernel_sources
from fastmace.dynamics.potential import Potential
from fastmace.dynamics.state import State
from fastmace.models import backends
from fastmace.models.load import load

demo = load("demo-emt-cu", dtype="float64").module
cases = [
    ("tiny", model_of("tiny", torch.float64), [29, 8, 6, 1],
     [copper_supercell(), triclinic_mixed(), cluster()]),
    ("demo", demo, [29], [copper_supercell()]),
]
for name, reference, species, structures in cases:
    model = backends.convert(reference, "cueq", "cpu")
    potential = Potential(model, species, product_basis=True)
    assert potential.product_basis_used, name
    state = State.from_atoms(structures)
    output = potential(state, ase_edges(state, potential.r_max, 1.5), compute_stress=True)
    assert_matches_reference(reference, structures, output, state)
print(json.dumps(kernel_sources.loaded()))
"""


def test_a_potential_with_the_kernels_in_the_interpreter_gives_mace_torchs_results(clean_env):
    tests = str(Path(__file__).parent)
    code = POTENTIAL_IN_THE_INTERPRETER.format(tests=tests)
    loaded = python_report(code, {**clean_env, "TRITON_INTERPRET": "1"})
    # Kernels are generated when they first run: for each block's basis (the demo model's
    # two blocks have the tiny template's bases), float64 kernels reading their coefficients.
    assert len(loaded) == 2 and all(
        name.startswith("product_") and name.endswith("_loaded") for name in loaded
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_the_gpu_the_kernels_and_the_potential_agree(clean_env, tmp_path):
    assert_kernels_agree(compare(clean_env, "cuda", tmp_path))
    model = backends.convert(model_of("mp0-medium", torch.float64), "cueq", "cuda")
    structures = [copper_supercell(), triclinic_mixed(), cluster()]
    state = State.from_atoms(structures)
    potential = Potential(model, SPECIES, product_basis=True)
    edges = edges_on(ase_edges(state, potential.r_max, 1.5), "cuda")
    output = potential(State.from_atoms(structures, device="cuda"), edges, compute_stress=True)
    reference = model_of("mp0-medium", torch.float64)
    assert_matches_reference(reference, structures, on_cpu(output), state)
