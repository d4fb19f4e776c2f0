"""e3nn's ``Activation`` as a module that torch.compile traces without help.

mace-torch's non-linear readouts apply an ``e3nn.nn.Activation`` to their hidden channels.
Dynamo cannot trace it as it is (a guard on e3nn's ``Irrep``, whose ``__len__`` raises), so
mace-torch registers it for ``torch.fx`` simplification when it builds such a block; a model
that was unpickled in this process (a kept conversion, a checkpoint) was never built here and
never registered it. The copy torch.compile traces (``dynamics/potential._traceable``) holds
:class:`ScalarActivation` in its place instead: the same activations on the same blocks of
channels, in a class defined once, without changing mace-torch's registry for the process
(fx's simplification also gives each traced module a class of its own, which Dynamo's saved
caches cannot name: benchmarks/precompile_probe.py).
"""

from __future__ import annotations

import torch


class ScalarActivation(torch.nn.Module):
    """An ``e3nn.nn.Activation``'s work: each block of channels through its activation (e3nn's
    normalised one, shared with the module it replaces), or unchanged where it has none."""

    def __init__(self, activation: torch.nn.Module) -> None:
        super().__init__()
        self.widths = tuple(mul * irrep.dim for mul, irrep in activation.irreps_in)
        self.acts = activation.acts  # a ModuleList, None where a block has no activation

    def forward(self, features: torch.Tensor, dim: int = -1) -> torch.Tensor:
        blocks = []
        start = 0
        for width, act in zip(self.widths, self.acts, strict=True):
            block = features.narrow(dim, start, width)
            blocks.append(block if act is None else act(block))
            start += width
        return blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=dim)


def replace_activations(model: torch.nn.Module) -> int:
    """Put a :class:`ScalarActivation` in place of each e3nn ``Activation`` in ``model`` (in
    place: for the copy that is traced); how many were replaced."""
    from e3nn import nn as e3nn_nn

    replaced = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is e3nn_nn.Activation:
                setattr(module, name, ScalarActivation(child))
                replaced += 1
    return replaced
