"""cuEquivariance's path tables as tuples (models/cueq_constants.py), on the GPU (marked ``gpu``).

The real ``uniform_1d`` modules need cuequivariance-ops, which runs on CUDA only: the
symmetric contraction of a loaded model (tuples) and a copy of it rebuilt by pickling (lists,
as cuEquivariance makes them) must give the same values and gradients, compiled, and the
tuples must leave Dynamo a small fraction of the guards.
"""

from __future__ import annotations

import copy

import pytest
import torch

from fastmace.models.cueq_constants import MODULE_CLASS, path_tables_as_constants
from fastmace.models.load import load

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def uniform_1d_modules(module: torch.nn.Module) -> list[torch.nn.Module]:
    return [part for part in module.modules() if type(part).__name__ == MODULE_CLASS]


def compiled_values_and_guards(contraction: torch.nn.Module, x, indices):
    """The contraction compiled (values, gradient, Dynamo's guard count)."""
    from torch._dynamo.utils import get_compilation_metrics

    torch._dynamo.reset()
    before = len(get_compilation_metrics())
    compiled = torch.compile(contraction, backend="aot_eager")
    x = x.detach().requires_grad_()
    values = compiled(x, indices)
    (gradient,) = torch.autograd.grad(values.square().sum(), x)
    # The frame's entry has its guards; the backward's own entry has none (None).
    guards = [m.guard_count for m in get_compilation_metrics()[before:] if m.guard_count]
    return values.detach(), gradient, sum(guards)


def test_loaded_path_tables_are_tuples_and_compile_to_the_same_contraction():
    model = load("template:mp0-medium", backend="cueq", device="cuda", dtype="float32").module
    assert len(uniform_1d_modules(model)) >= 2  # both products' contractions at least
    contraction = model.products[0].symmetric_contractions
    (tables,) = uniform_1d_modules(contraction)
    assert isinstance(tables.path_indices, tuple) and len(tables.path_indices) > 1000
    as_built = copy.deepcopy(contraction)  # rebuilt from its polynomial: lists again
    assert isinstance(uniform_1d_modules(as_built)[0].path_indices, list)

    generator = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(300, contraction.irreps_in.dim, device="cuda", generator=generator)
    elements = as_built.weight.shape[0]
    indices = torch.randint(0, elements, (300,), device="cuda", generator=generator)
    values, gradient, guards = compiled_values_and_guards(contraction, x, indices)
    values_lists, gradient_lists, guards_lists = compiled_values_and_guards(as_built, x, indices)
    torch.testing.assert_close(values, values_lists, rtol=0, atol=0)
    torch.testing.assert_close(gradient, gradient_lists, rtol=1e-6, atol=1e-6)
    assert guards > 0 and guards * 10 < guards_lists, (guards, guards_lists)
    assert path_tables_as_constants(as_built) == 1
    assert isinstance(uniform_1d_modules(as_built)[0].path_indices, tuple)
