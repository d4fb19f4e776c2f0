"""The equivariant linear layers as GEMMs (dynamics/irreps_linear.py) and the BF16 tier built on
them (dynamics/reduced_matmul.py): read off e3nn's and cuEquivariance's modules exactly, refused
where they are not linear maps of that form, and BF16 products that are what they say."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from conftest import cueq_template
from helpers.potential_checks import model_of, run
from helpers.structures import ase_edges, copper_supercell, triclinic_mixed

from fastmace.dynamics.bf16_tier import bf16_model
from fastmace.dynamics.irreps_linear import (
    IrrepsLinear,
    LinearReadError,
    is_equivariant_linear,
    read_linear,
    segments,
)
from fastmace.dynamics.potential import Potential, UnsupportedModelError
from fastmace.dynamics.reduced_matmul import bf16_mm, matmul
from fastmace.dynamics.species_linear import SpeciesLinear
from fastmace.dynamics.state import State
from fastmace.models.checkpoint import import_mace
from fastmace.models.templates import template
from fastmace.vocabulary import REDUCED_PRECISION_TOLERANCE

SPECIES = [1, 6, 8, 29]


def _linears(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    return {name: module for name, module in model.named_modules() if is_equivariant_linear(module)}


@pytest.mark.parametrize("backend", ["e3nn", "cueq"])
def test_each_linear_layer_is_read_exactly(backend):
    """Every linear layer of the tiny template (scalars only, vectors and l = 2, repeated irrep
    types in one input) gives the module's own output on random features, in float64."""
    model = model_of("tiny", torch.float64) if backend == "e3nn" else cueq_template("tiny")
    linears = _linears(model)
    assert len(linears) == 10  # embedding, 2 x (linear_up, linear), 2 products, 3 readouts
    generator = torch.Generator().manual_seed(0)
    for name, module in linears.items():
        replacement = read_linear(module)
        width = replacement.in_features
        x = torch.randn((7, width), generator=generator, dtype=torch.float64)
        with torch.no_grad():
            torch.testing.assert_close(replacement(x), module(x), rtol=1e-12, atol=1e-12,
                                       msg=name)  # fmt: skip
    # cuEquivariance's layers take components outer, e3nn's channels outer.
    wanted = "ir_mul" if backend == "cueq" else "mul_ir"
    assert read_linear(linears["interactions.0.linear"]).layout == wanted


def test_irreps_are_read_from_either_librarys_text():
    assert segments("8x0e+16x1o+2e") == segments("8x0e + 16x1o + 1x2e")
    assert [s.width for s in segments("8x0e+16x1o+2e")] == [8, 48, 5]
    with pytest.raises(LinearReadError, match="cannot read"):
        segments("8x0e+4x1y")


def test_a_layer_with_a_bias_or_of_another_form_is_refused():
    import_mace()  # e3nn's import reads its constants as mace-torch's set-up allows
    from e3nn import o3

    biased = o3.Linear("4x0e", "4x0e", biases=True)
    with torch.no_grad():
        biased.bias.fill_(0.5)  # e3nn starts biases at zero: a trained one is not
    with pytest.raises(LinearReadError, match="bias"):
        read_linear(biased)

    class NotEquivariant(torch.nn.Module):  # mixes a vector's components: no layout fits
        irreps_in, irreps_out = "2x1o", "2x1o"

        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(6, 6, dtype=torch.float64))

        def forward(self, x):
            return x @ self.weight

    with pytest.raises(LinearReadError, match="either layout"):
        read_linear(NotEquivariant())


def test_bf16_products_round_both_factors_and_sum_in_float32():
    generator = torch.Generator().manual_seed(1)
    a = torch.randn((33, 64), generator=generator)
    b = torch.randn((64, 17), generator=generator)
    got = bf16_mm(a, b)
    assert got.dtype == torch.float32
    rounded = a.bfloat16().double() @ b.bfloat16().double()  # exact products, float64 sums
    # float32 sums of 64 exact products: float32 rounding of their size, not BF16's.
    scale = float((a.abs() @ b.abs()).max())
    assert (
        float((got.double() - rounded).abs().max()) <= 64 * torch.finfo(torch.float32).eps * scale
    )
    # ... and BF16's rounding of the factors shows against the float32 product.
    assert float((got - a @ b).abs().max()) > 100 * torch.finfo(torch.float32).eps * scale


def test_the_bf16_backward_is_the_same_kind_of_product():
    generator = torch.Generator().manual_seed(2)
    x = torch.randn((5, 3, 16), generator=generator, requires_grad=True)
    weight = torch.randn((16, 8), generator=generator)
    out = matmul(x, weight, "bf16")
    assert out.shape == (5, 3, 8)
    grad = torch.randn(out.shape, generator=generator)
    (got,) = torch.autograd.grad(out, x, grad)
    want = grad.reshape(-1, 8).bfloat16().float() @ weight.t().bfloat16().float()
    torch.testing.assert_close(got.reshape(-1, 16), want, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="float32 models"):
        matmul(x.detach().double(), weight.double(), "bf16")
    with pytest.raises(ValueError, match="unknown GEMM precision"):
        matmul(x, weight, "fp8")


def test_the_bf16_model_replaces_every_linear_layer_and_skip_connection():
    """The tiny template's 10 linear layers and 2 skip connections, and nothing else (its
    radial MLPs stay float32); the original model is left as it was."""
    model = Potential(model_of("tiny", torch.float32), SPECIES).model  # skip_tp specialised
    reduced, names = bf16_model(model)
    modules = dict(reduced.named_modules())
    assert sorted(names) == sorted(
        [*_linears(model), "interactions.0.skip_tp", "interactions.1.skip_tp"]
    )
    for name in names:
        assert modules[name].precision == "bf16"
        assert isinstance(modules[name], (IrrepsLinear, SpeciesLinear))
    assert modules["interactions.0.conv_tp_weights"] is model.interactions[0].conv_tp_weights
    assert all(is_equivariant_linear(module) for module in _linears(model).values())
    assert dict(model.named_modules())["interactions.0.skip_tp"].precision == "float32"


@pytest.mark.parametrize("backend", ["e3nn", "cueq"])
def test_a_bf16_potential_is_within_its_gate_tolerance_of_float64(backend):
    """Forces, energy and stress of the tiny template in the BF16 tier against the same
    weights in float64: within the gate's BF16 tolerance, and measurably off float32's
    result (the tier did run)."""
    high = model_of("tiny", torch.float64)
    low = copy.deepcopy(high).to(torch.float32)
    if backend == "cueq":
        from fastmace.models import backends

        low = backends.convert(low, "cueq", "cpu")
    structures = [copper_supercell(), triclinic_mixed()]
    _, want = run(Potential(high, SPECIES), structures, compute_stress=True)
    _, plain = run(Potential(low, SPECIES), structures, compute_stress=True)
    reduced_potential = Potential(low, SPECIES, matmul_precision="bf16")
    assert len(reduced_potential.bf16_layers) == 12
    _, reduced = run(reduced_potential, structures, compute_stress=True)
    fraction = REDUCED_PRECISION_TOLERANCE["bf16"]
    forces_scale = max(float(want.forces.abs().max()), 1.0)
    bf16_error = float((reduced.forces.double() - want.forces).abs().max())
    float32_error = float((plain.forces.double() - want.forces).abs().max())
    assert bf16_error <= fraction * forces_scale
    assert bf16_error > 30 * float32_error
    atoms = want.forces.shape[0]
    energy_error = float((reduced.energy.double() - want.energy).abs().max())
    assert energy_error <= fraction * max(float(want.energy.abs().max()), atoms)
    stress_scale = max(float(want.stress.abs().max()), 1e-2)
    assert float((reduced.stress.double() - want.stress).abs().max()) <= fraction * stress_scale
    assert np.isfinite(reduced.forces.numpy()).all()


def test_a_bf16_potential_conforms_at_its_own_tolerance():
    """Batched against alone and with extra padding, a BF16 potential agrees with itself to the
    tier's rounding (its GEMM inputs round at other points), which precision_loosening sets."""
    from conftest import model_edges

    from fastmace.dynamics.potential import check_potential
    from fastmace.models.backends import precision_loosening

    potential = Potential(model_of("tiny", torch.float32), SPECIES, matmul_precision="bf16")
    check_potential(potential, lambda state: model_edges(state, potential.r_max))
    eps = torch.finfo(torch.float32).eps
    assert precision_loosening(torch.float32, "float32") == 1.0
    assert precision_loosening(torch.float32, "bf16") == pytest.approx(5 * 2**-7 / (1000 * eps))
    assert precision_loosening(torch.float32, "tf32") == pytest.approx(20 * 2**-10 / (1000 * eps))


def test_bf16_is_refused_for_float64_and_long_range_models():
    with pytest.raises(ValueError, match="runs float32 models"):
        Potential(model_of("tiny", torch.float64), SPECIES, matmul_precision="bf16")
    with pytest.raises(UnsupportedModelError, match="bf16"):
        Potential(template("polar-tiny", dtype=torch.float32), [1, 8], matmul_precision="bf16")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_the_gpu_bf16_runs_on_tensor_cores_compiled_too():
    """On CUDA the products are BF16 GEMMs with float32 results (torch.mm's out_dtype): the
    CPU's numbers to float32 rounding; a potential in BF16, eager and compiled, within the
    gate's BF16 tolerance of float64, as on the CPU."""
    from fastmace.dynamics.reduced_matmul import has_tensor_core_path
    from fastmace.models import backends

    assert has_tensor_core_path()
    generator = torch.Generator().manual_seed(3)
    a, b = torch.randn((300, 128), generator=generator), torch.randn((128, 64), generator=generator)
    scale = float((a.abs() @ b.abs()).max())
    on_gpu = bf16_mm(a.cuda(), b.cuda()).cpu()
    assert float((on_gpu - bf16_mm(a, b)).abs().max()) <= 128 * 1.2e-7 * scale
    high = model_of("mp0-medium", torch.float64)
    low = backends.convert(copy.deepcopy(high).to(torch.float32), "cueq", "cuda")
    structures = [copper_supercell(), triclinic_mixed()]
    _, want = run(Potential(high, SPECIES), structures, compute_stress=True)
    fraction = REDUCED_PRECISION_TOLERANCE["bf16"]
    scale = max(float(want.forces.abs().max()), 1.0)
    state = State.from_atoms(structures, device="cuda")
    for compile in (False, True):
        potential = Potential(low, SPECIES, matmul_precision="bf16", compile=compile)
        got = potential(state, ase_edges(state, potential.r_max, 1.5), compute_stress=True)
        error = float((got.forces.double().cpu() - want.forces).abs().max())
        assert error <= fraction * scale, (compile, error)
