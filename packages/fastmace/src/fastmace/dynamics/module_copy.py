"""Copies of module trees that share the weights: the whole tree, or one module object.

``torch.compile`` needs a model it may rewrite (mace-torch's ``simplify`` replaces blocks by
traced graphs) whose parameters do not require gradients (else AOTAutograd's backward also
computes weight gradients on every step). ``copy.deepcopy`` would give that, but on CUDA it
breaks converted models: cuEquivariance's naive modules keep a CPU constant through it and
OpenEquivariance's convolution loses its forward. :func:`weight_sharing_copy` copies only the
module objects: new tables of submodules and parameters, parameters as new ``Parameter``
objects over the same storage, buffers and every other attribute shared.
:func:`shallow_copy` copies one module object, so that a submodule of the copy can be replaced
without touching the original (FastMACE's specialised models are built from these).
"""

from __future__ import annotations

import copy
import types

import torch


def shallow_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A new module object with its own table of submodules; the submodules, parameters and
    buffers themselves are shared with ``module``."""
    twin = copy.copy(module)
    twin._modules = type(module._modules)(module._modules)
    return twin


def weight_sharing_copy(module: torch.nn.Module, *, requires_grad: bool = False) -> torch.nn.Module:
    """A new tree of module objects over ``module``'s weights; ``module`` is not changed.

    Every module of the tree is a new object of the same class with its own attribute table,
    so replacing a submodule of the copy leaves the original alone. Parameters are new
    ``Parameter`` objects viewing the same storage, with ``requires_grad`` as given; buffers
    are the same tensors. Methods bound to an original module (mace-torch and the kernel
    libraries patch ``forward`` on instances) are bound to its copy instead. TorchScript
    modules without weights of their own (e3nn's generated code) are shared, not copied.
    """
    return _copy(module, requires_grad, {})


def _copy(
    module: torch.nn.Module, requires_grad: bool, memo: dict[int, torch.nn.Module]
) -> torch.nn.Module:
    if id(module) in memo:  # a module reachable twice stays one module in the copy
        return memo[id(module)]
    if isinstance(module, torch.jit.ScriptModule):
        # Code without weights (e3nn's generated tensor-product kernels) is shared as it is.
        if next(module.parameters(), None) is None:
            return module
        raise TypeError(
            f"{type(module).__name__} is a TorchScript module with weights, which cannot be "
            "copied this way"
        )
    twin = object.__new__(type(module))
    memo[id(module)] = twin
    attributes = dict(module.__dict__)
    for name, value in attributes.items():
        if isinstance(value, types.MethodType) and value.__self__ is module:
            attributes[name] = types.MethodType(value.__func__, twin)
    attributes["_modules"] = type(module._modules)(
        (name, None if child is None else _copy(child, requires_grad, memo))
        for name, child in module._modules.items()
    )
    attributes["_parameters"] = type(module._parameters)(
        (name, None if p is None else torch.nn.Parameter(p.detach(), requires_grad=requires_grad))
        for name, p in module._parameters.items()
    )
    attributes["_buffers"] = type(module._buffers)(module._buffers)
    twin.__dict__.update(attributes)
    return twin


def copy_modules_of(
    source: torch.nn.Module, target: torch.nn.Module, kinds: tuple[type, ...]
) -> torch.nn.Module:
    """``target`` with (deep copies of) ``source``'s modules of ``kinds`` at the same places.

    For a model rebuilt from ``source``'s configuration (mace-torch's ``extract_model``), which
    has the library's modules where FastMACE replaced them, and no weights for ours.
    """
    for name, module in source.named_modules():
        if isinstance(module, kinds):
            parent, _, child = name.rpartition(".")
            setattr(target.get_submodule(parent), child, copy.deepcopy(module))
    return target


def with_replaced(
    model: torch.nn.Module, replacements: dict[str, torch.nn.Module]
) -> torch.nn.Module:
    """A copy of ``model`` with the submodules at the given dotted names replaced; new module
    objects only along the paths to them, everything else shared."""
    root = shallow_copy(model)
    for name, replacement in replacements.items():
        *path, last = name.split(".")
        parent = root
        for part in path:
            child = shallow_copy(parent._modules[part])
            parent._modules[part] = child
            parent = child
        parent._modules[last] = replacement
    return root
