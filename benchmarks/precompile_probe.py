"""A probe, not FastMACE's path: Dynamo's own cache on ``fastmace md``'s compiled potential.

torch.compile traces the model again in every process (9-10 s of a warm start at 13,824 atoms,
docs/validation/performance.md) even when Inductor's caches hold every kernel. torch's
``caching_precompile`` keeps what Dynamo made (its bytecode, guards and the compiled graphs) so
that a later process loads it instead. On the CPU two things stop it from saving the compiled
potential's frame: e3nn's spherical harmonics are a TorchScript function, which a saved guard
cannot name, and mace-torch's ``simplify`` turns e3nn's ``Activation`` into an fx
``GraphModule``, whose class is made per instance and cannot be named either; cuEquivariance's
"naive" method (the CPU's, and a fallback on CUDA) makes more of those. :func:`install` works
around all three in its process. On the CPU (tiny template, 2026-12-08) torch then saved the
frame, and a second process loaded it in 0.02 s instead of tracing for 19.4 s, but its guards
failed: each naive graph's code runs in a scope named after an object's id, which the saved
guards name, so Dynamo traced again and stopped on a name the loaded entry had installed
("Name '__builtins_dict___0' already exists in scope"). So on CUDA the cache can work only where
no naive graph is left; a run on the GPU shows whether any is, what else stops the cache there,
and what a warm start saves when nothing does. ``benchmarks/startup_time.py --precompile-warm``
runs ``fastmace md`` with it.
"""

from __future__ import annotations

import atexit
import types

import torch

import fastmace.dynamics.potential as potential


class ScalarActivation(torch.nn.Module):
    """e3nn's ``Activation`` on scalar channels, as a module of a class torch can name: each
    block of channels through its activation (or unchanged where it has none)."""

    def __init__(self, activation: torch.nn.Module) -> None:
        super().__init__()
        self.widths = tuple(mul * irrep.dim for mul, irrep in activation.irreps_in)
        self.acts = activation.acts

    def forward(self, features: torch.Tensor, dim: int = -1) -> torch.Tensor:
        parts = []
        start = 0
        for width, act in zip(self.widths, self.acts, strict=True):
            part = features.narrow(dim, start, width)
            parts.append(part if act is None else act(part))
            start += width
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)


def _replace_activations(model: torch.nn.Module) -> None:
    from e3nn import nn as e3nn_nn

    for name, child in model.named_children():
        if type(child) is e3nn_nn.Activation:
            setattr(model, name, ScalarActivation(child))
        else:
            _replace_activations(child)


class NamedGraphModule(torch.fx.GraphModule):
    """An fx graph under a class torch can name; its generated ``forward`` kept per instance."""


def _name_graph_modules(model: torch.nn.Module) -> None:
    """Give cuEquivariance's "naive" graphs (the CPU's method) a class torch can name."""
    for module in list(model.modules()):
        if isinstance(module, torch.fx.GraphModule) and type(module) is not NamedGraphModule:
            forward = type(module).forward
            module.__class__ = NamedGraphModule
            module.forward = types.MethodType(forward, module)


def _prepared_for_the_cache(model: torch.nn.Module) -> None:
    """In place of potential._register_as_when_built, on the copy torch.compile traces."""
    import e3nn.o3._spherical_harmonics as harmonics

    scripted = harmonics._spherical_harmonics
    if isinstance(scripted, torch.jit.ScriptFunction):
        # The Python function TorchScript compiled, which Dynamo traces anyway.
        harmonics._spherical_harmonics = scripted._torchdynamo_inline
    _replace_activations(model)
    _name_graph_modules(model)
    graphs = [name for name, module in model.named_modules() if type(module) is NamedGraphModule]
    # Each graph's code runs in a scope named after an object's id, which a saved guard names
    # (so, on the CPU, a later process's guards failed and Dynamo traced again).
    print(f"precompile: {len(graphs)} fx graphs in the traced copy: {graphs[:8]}", flush=True)


def _save_at_exit() -> None:
    """Write what Dynamo made in this process to its cache (torch writes it only when asked)."""
    from torch._dynamo.precompile_context import PrecompileContext

    info = PrecompileContext.save_to_dynamo_cache()
    counts = {kind: len(entries) for kind, entries in info.items()}
    print(f"precompile: saved to Dynamo's cache: {counts}", flush=True)


def install() -> None:
    """Dynamo's cache on, the work-arounds above, and the cache written at exit."""
    torch._dynamo.config.caching_precompile = True
    potential._register_as_when_built = _prepared_for_the_cache
    atexit.register(_save_at_exit)
