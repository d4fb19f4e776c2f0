"""cuEquivariance's linear layers as one batched GEMM per shape (dynamics/stacked_linear.py):
the module's own map, value and gradient, in both layouts, in fewer GEMMs; and a potential
that runs them within float32 rounding of mace-torch."""

from __future__ import annotations

import collections

import pytest
import torch
from conftest import cueq_template
from helpers.potential_checks import assert_matches_reference, model_of, run
from helpers.structures import copper_supercell, triclinic_mixed
from torch.utils._python_dispatch import TorchDispatchMode

from fastmace.dynamics.irreps_linear import (
    IrrepsLinear,
    is_equivariant_linear,
    read_linear,
    segments,
)
from fastmace.dynamics.potential import Potential
from fastmace.dynamics.stacked_linear import StackedLinear, paths, stacked_model

SPECIES = [1, 6, 8, 29]
_GEMMS = {"mm", "bmm", "addmm", "baddbmm", "mv", "addmv"}


class _GemmCount(TorchDispatchMode):
    """The matrix products torch runs inside the block, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name in _GEMMS:
            self.calls[name] += 1
        return func(*args, **(kwargs or {}))


def _value_and_gradient(module: torch.nn.Module, x: torch.Tensor, seed: torch.Tensor):
    x = x.detach().requires_grad_(True)
    y = module(x)
    (gradient,) = torch.autograd.grad(y, x, seed)
    return y.detach(), gradient


@pytest.mark.parametrize("backend", ["e3nn", "cueq"])
def test_each_linear_layer_stacked_is_the_layer_itself(backend):
    """Every linear layer of the tiny template (repeated irrep types in one input, scalars to
    l = 2), stacked: the module's output and its gradient with respect to the input, in
    float64, with the layout of each library."""
    model = model_of("tiny", torch.float64) if backend == "e3nn" else cueq_template("tiny")
    generator = torch.Generator().manual_seed(1)
    checked = 0
    for name, module in model.named_modules():
        if not is_equivariant_linear(module):
            continue
        stacked = StackedLinear(read_linear(module))
        x = torch.randn((6, stacked.in_features), generator=generator, dtype=torch.float64)
        seed = torch.randn((6, stacked.out_features), generator=generator, dtype=torch.float64)
        want, want_gradient = _value_and_gradient(module, x, seed)
        got, got_gradient = _value_and_gradient(stacked, x, seed)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=name)
        torch.testing.assert_close(got_gradient, want_gradient, rtol=1e-12, atol=1e-12, msg=name)
        checked += 1
    assert checked == 10


@pytest.mark.parametrize("layout", ["ir_mul", "mul_ir"])
def test_types_without_inputs_give_zeros_and_unused_inputs_no_gradient(layout):
    """An output type no input feeds (2e) is zero; an input type no output reads (3o) gets a
    zero gradient; shapes that differ (0e: 8 channels in, 1o: 6) make two GEMMs."""
    inputs, outputs = segments("4x0e+4x0e+3x1o+3x1o+2x3o"), segments("5x0e+2x1o+1x2e")
    generator = torch.Generator().manual_seed(2)
    matrices = [
        torch.randn((8, 5), generator=generator, dtype=torch.float64),
        torch.randn((6, 2), generator=generator, dtype=torch.float64),
        torch.zeros((0, 1), dtype=torch.float64),
    ]
    linear = IrrepsLinear(inputs, outputs, layout, matrices)
    stacked = StackedLinear(linear)
    assert stacked.groups == 2 and paths(linear) == 4
    x = torch.randn((3, linear.in_features), generator=generator, dtype=torch.float64)
    seed = torch.randn((3, linear.out_features), generator=generator, dtype=torch.float64)
    want, want_gradient = _value_and_gradient(linear, x, seed)
    got, got_gradient = _value_and_gradient(stacked, x, seed)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got_gradient, want_gradient, rtol=1e-12, atol=1e-12)
    assert float(got[:, -5:].abs().max()) == 0.0  # the 2e entry
    assert float(got_gradient[:, -14:].abs().max()) == 0.0  # the 3o entries


def test_a_stacked_layer_runs_fewer_gemms_than_cuequivariances():
    """The point of stacking: forward and backward of each replaced layer of the tiny
    template in one GEMM per shape each way, where cuEquivariance's module runs one per path."""
    model = cueq_template("tiny")
    stacked, names, refused = stacked_model(model)
    assert refused == {}
    # The layers with more than one path: the blocks' linear maps after the convolution, the
    # second block's linear_up and the first product's linear (scalars and vectors).
    assert names == [
        "interactions.0.linear", "interactions.1.linear_up", "interactions.1.linear",
        "products.0.linear",
    ]  # fmt: skip
    replaced = dict(stacked.named_modules())
    originals = dict(model.named_modules())
    for name in names:
        layer = replaced[name]
        assert isinstance(layer, StackedLinear)
        counts = []
        for module in (originals[name], layer):
            x = torch.randn((5, layer.in_features), dtype=torch.float64, requires_grad=True)
            with _GemmCount() as counted:
                torch.autograd.grad(module(x).sum(), x)
            counts.append(sum(counted.calls.values()))
        assert counts[1] == 2 * layer.groups, name
        assert counts[1] < counts[0], (name, counts)
    # The model itself is untouched, and the weights are shared, not copied.
    assert all(is_equivariant_linear(originals[name]) for name in names)
    assert stacked.interactions[0].conv_tp is model.interactions[0].conv_tp


def test_a_layer_that_is_not_its_stacked_map_is_refused():
    """The check against the layer replaced: a map read wrongly is caught, not run."""
    model = cueq_template("tiny")
    module = dict(model.named_modules())["interactions.1.linear"]
    linear = read_linear(module)
    wrong = IrrepsLinear(
        linear.inputs, linear.outputs, linear.layout,
        [2.0 * linear.matrix(irrep) for irrep in linear.irreps],
    )  # fmt: skip
    from fastmace.dynamics import stacked_linear

    found = stacked_linear.disagreement(StackedLinear(wrong), module, "interactions.1.linear")
    assert found.startswith("interactions.1.linear: the stacked map differs from the layer by")
    assert stacked_linear.disagreement(StackedLinear(linear), module, "linear") is None


def test_a_layer_whose_stacked_map_fails_its_check_is_kept_and_the_reason_recorded(monkeypatch):
    """One layer read wrongly (its matrices doubled) is left as cuEquivariance's, with what
    differed, and the others are still stacked: the run keeps going on the layer's own GEMMs."""
    from fastmace.dynamics import stacked_linear

    model = cueq_template("tiny")
    read = stacked_linear.read_linear

    def misread(module: torch.nn.Module) -> IrrepsLinear:
        linear = read(module)
        if module is dict(model.named_modules())["interactions.1.linear"]:
            doubled = [2.0 * linear.matrix(irrep) for irrep in linear.irreps]
            return IrrepsLinear(linear.inputs, linear.outputs, linear.layout, doubled)
        return linear

    monkeypatch.setattr(stacked_linear, "read_linear", misread)
    stacked, names, refused = stacked_model(model)
    assert list(refused) == ["interactions.1.linear"] and len(names) == 3
    assert "the stacked map differs from the layer by" in refused["interactions.1.linear"]
    assert is_equivariant_linear(dict(stacked.named_modules())["interactions.1.linear"])


def test_a_compiled_cueq_potential_stacks_its_linear_layers_within_float32_rounding():
    """A float32 potential on cuEquivariance stacks its multi-path linear layers where it is
    compiled (the default) or asked to, and its energies, forces and stresses stay within
    float32 rounding of mace-torch's float64 model; in BF16 the layers are BF16's, and e3nn's
    layers stay e3nn's."""
    from fastmace.models import backends

    model = model_of("tiny", torch.float32)
    converted = backends.convert(model, "cueq", "cpu")
    potential = Potential(converted, SPECIES, stack_linears=True)
    assert len(potential.stacked_layers) == 4
    structures = [copper_supercell(), triclinic_mixed()]
    state, output = run(potential, structures, compute_stress=True)
    assert_matches_reference(model, structures, output, state)
    assert len(Potential(converted, SPECIES, compile=True).stacked_layers) == 4
    assert Potential(converted, SPECIES).stacked_layers == []  # uncompiled: as converted
    assert Potential(converted, SPECIES, compile=True, matmul_precision="bf16").stacked_layers == []
    assert Potential(model, SPECIES, stack_linears=True).stacked_layers == []


def test_a_stacked_layer_keeps_every_index_on_its_weights_device():
    """The column indices are made on the CPU; left there, each call on CUDA copied them from
    the host, which a CUDA graph's capture refuses: on an H100 every block of a default run
    then ran uncaptured (benchmarks/results/2026-12-07-h100/stage104-stacked-md-capture.txt).
    Matrices on the meta device stand in for CUDA's here: every buffer must follow them."""
    inputs, outputs = segments("4x0e+4x0e+3x1o+2x3o"), segments("5x0e+2x1o+1x2e")
    matrices = [torch.empty((8, 5)), torch.empty((3, 2)), torch.empty((0, 1))]
    linear = IrrepsLinear(inputs, outputs, "ir_mul", [m.to("meta") for m in matrices])
    stacked = StackedLinear(linear)
    assert stacked.zero_column and stacked.group_0_columns is not None  # indices to move
    assert {buffer.device.type for buffer in stacked.buffers()} == {"meta"}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_the_gpu_a_stacked_layer_is_captured_in_a_cuda_graph():
    """Forward and backward of a stacked layer of the tiny template inside one CUDA graph,
    replayed on new input: the layer's own result."""
    module = dict(cueq_template("tiny").named_modules())["interactions.1.linear"]
    module = module.to("cuda")
    stacked = StackedLinear(read_linear(module))
    x = torch.randn((6, stacked.in_features), dtype=torch.float64, device="cuda")
    x.requires_grad_(True)
    seed = torch.randn((6, stacked.out_features), dtype=torch.float64, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture, as torch asks
        torch.autograd.grad(stacked(x), x, seed)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = stacked(x)
        (gradient,) = torch.autograd.grad(out, x, seed)
    with torch.no_grad():
        x.copy_(torch.randn_like(x))
    graph.replay()
    want, want_gradient = _value_and_gradient(module, x, seed)
    torch.testing.assert_close(out.detach(), want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gradient, want_gradient, rtol=1e-12, atol=1e-12)
