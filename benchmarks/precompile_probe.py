"""A probe, not FastMACE's path: Dynamo's own cache on ``fastmace md``'s compiled potential.

torch.compile traces the model again in every process (9-10 s of a warm start at 13,824 atoms,
docs/validation/performance.md) even when Inductor's caches hold every kernel. torch's
``caching_precompile`` keeps what Dynamo made (its bytecode, guards and the compiled graphs) so
that a later process loads it instead. On the CPU (torch 2.14, 2026-12-08) four things stopped
it from saving, each an object a saved guard cannot name: e3nn's spherical harmonics (a
TorchScript function), the fx graphs of mace-torch's ``simplify`` (e3nn's ``Activation``) and
of cuEquivariance's "naive" method (its linear layers use it on CUDA too), whose classes are
made per instance and whose code runs in scopes named after object ids, and the ``__new__`` of
mace-torch's named tuples (compiled from a string by ``collections.namedtuple``). A fifth
stopped the load: a loaded entry's guards are rebuilt from tensors saved without their
dynamic-size marks, so they refused the marked edges of every call. FastMACE's traced copy
now holds its own ``ScalarActivation`` (dynamics/scalar_activation.py); :func:`install` works
around the other four in its process: the harmonics' Python function, every linear layer as
FastMACE's stacked GEMMs (the planner's own convolution and product basis replace the other
naive graphs), named tuples built by a module function, every size symbolic in place of the
marks. Then a second process ran its compiled first call in 1.1 s with the cache, against
7.1 s without it (tiny template, 108 atoms, warm Inductor caches both).
``benchmarks/startup_time.py --precompile-warm`` runs ``fastmace md`` with it on the GPU
(stage 125 of tools/validation/startup_gpu.sh).
"""

from __future__ import annotations

import atexit

import torch

import fastmace.dynamics.potential as potential
from fastmace.dynamics.irreps_linear import (
    CUEQ_LINEAR,
    LinearReadError,
    class_name,
    is_equivariant_linear,
    read_linear,
)
from fastmace.dynamics.scalar_activation import replace_activations
from fastmace.dynamics.stacked_linear import StackedLinear


def _stack_every_linear(model: torch.nn.Module) -> None:
    """cuEquivariance's linear layers (its "naive" method, fx graphs, on CUDA too) as FastMACE's
    stacked GEMMs, also where stacking saves no launch (the planner keeps those as they are)."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if class_name(child) != CUEQ_LINEAR or not is_equivariant_linear(child):
                continue
            try:
                setattr(module, name, StackedLinear(read_linear(child)))
            except LinearReadError:
                continue


def _tuple_new(cls: type, *args: object, **kwargs: object) -> tuple:
    """A named tuple's ``__new__`` written as a function of this module: the one
    ``collections.namedtuple`` makes is compiled from a string, in a namespace of its own that a
    saved guard names after its id (so a later process's guards fail)."""
    values = list(args) + [
        kwargs.pop(field) for field in cls._fields[len(args) :] if field in kwargs
    ]
    if kwargs or len(values) < len(cls._fields):
        missing = cls._fields[len(values) :]
        defaults = cls._field_defaults
        values += [defaults[field] for field in missing]  # a KeyError names a missing field
    return tuple.__new__(cls, values)


def _named_tuples_built_by_a_module_function() -> None:
    from mace.modules import utils

    for named in (utils.GraphContext, utils.InteractionKwargs):
        named.__new__ = _tuple_new


def _prepared_for_the_cache(model: torch.nn.Module) -> int:
    """In place of potential.replace_activations, on the copy torch.compile traces."""
    import e3nn.o3._spherical_harmonics as harmonics

    scripted = harmonics._spherical_harmonics
    if isinstance(scripted, torch.jit.ScriptFunction):
        # The Python function TorchScript compiled, which Dynamo traces anyway.
        harmonics._spherical_harmonics = scripted._torchdynamo_inline
    _named_tuples_built_by_a_module_function()
    replaced = replace_activations(model)
    _stack_every_linear(model)
    # An fx graph left (cuEquivariance's "naive" method) stops the save: its class is made per
    # instance, and its code runs in a scope named after an object's id.
    graphs = [
        name for name, module in model.named_modules() if isinstance(module, torch.fx.GraphModule)
    ]
    print(f"precompile: {len(graphs)} fx graphs in the traced copy: {graphs[:8]}", flush=True)
    return replaced


def _save_at_exit() -> None:
    """Write what Dynamo made in this process to its cache (torch writes it only when asked)."""
    from torch._dynamo.precompile_context import PrecompileContext

    info = PrecompileContext.save_to_dynamo_cache()
    counts = {kind: len(entries) for kind, entries in info.items()}
    print(f"precompile: saved to Dynamo's cache: {counts}", flush=True)


def _compiled_with_every_size_symbolic(
    model: torch.nn.Module, *, share_pair_radials: bool = False, backend: str = "inductor"
):
    """potential._compiled with ``dynamic=True`` in place of marking the edges' sizes: a
    loaded entry's guards are rebuilt from tensors saved without their marks, and so refused
    every marked tensor ("_has_dynamo_dim_marking is present on runtime tensor but was absent
    at compile time")."""
    from fastmace.runtime import cache, environment

    traceable = potential._traceable(model, share_pair_radials)
    environment.configure_compile_caches(cache.cache_root().path)
    return torch.compile(traceable, backend=backend, dynamic=True)


def install(cache: bool = True) -> None:
    """The work-arounds above for this process and, with ``cache``, Dynamo's cache on and
    written at exit (without: the same compiled path traced as usual, for comparison)."""
    potential.replace_activations = _prepared_for_the_cache
    potential._compiled = _compiled_with_every_size_symbolic
    if cache:
        torch._dynamo.config.caching_precompile = True
        atexit.register(_save_at_exit)
