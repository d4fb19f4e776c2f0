"""The BF16 tier (``matmul_precision="bf16"``): which layers of a model take BF16 inputs.

The linear layers, as in the published mixed-precision MD of equivariant potentials (arXiv
2510.23621: observables within run-to-run noise when only the linear layers run in BF16 or
FP16): the equivariant linear layers (read off the model as one GEMM per irrep type,
dynamics/irreps_linear.py) and the specialised skip connections (dynamics/species_linear.py).
The radial MLPs stay float32: putting their dense layers in BF16 too was measured to double the
force error (docs/validation/bf16.md), and on CUDA the radial tables replace them anyway. So
do the tensor products and contractions, positions, velocities and integration. Each replaced
layer is read in float32 and checked against the layer it replaces; then its products round
their inputs to BF16 (dynamics/reduced_matmul.py).
"""

from __future__ import annotations

import torch

from fastmace.dynamics.irreps_linear import is_equivariant_linear, read_linear
from fastmace.dynamics.module_copy import shallow_copy, with_replaced
from fastmace.dynamics.species_linear import SpeciesLinear


def bf16_model(model: torch.nn.Module) -> tuple[torch.nn.Module, list[str]]:
    """A copy of ``model`` (weights shared, the model untouched) whose linear layers and skip
    connections take BF16 inputs, and the names of the layers replaced."""
    replacements: dict[str, torch.nn.Module] = {}
    for name, module in model.named_modules():
        if any(name.startswith(f"{replaced}.") for replaced in replacements):
            continue  # inside a layer already replaced
        replacement: torch.nn.Module | None = None
        if is_equivariant_linear(module):
            replacement = read_linear(module)
        elif isinstance(module, SpeciesLinear):
            replacement = shallow_copy(module)
        if replacement is not None:
            replacement.precision = "bf16"
            replacements[name] = replacement
    return with_replaced(model, replacements), list(replacements)
