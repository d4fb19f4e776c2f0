"""FastMACE's stand-in for e3nn's Activation in the copy torch.compile traces: the same numbers,
the caller's model and mace-torch's simplify registry left as they were."""

from __future__ import annotations

import pytest
import torch

from fastmace.dynamics.potential import _traceable
from fastmace.dynamics.scalar_activation import ScalarActivation, replace_activations
from fastmace.models.checkpoint import import_mace


@pytest.fixture(scope="module")
def e3nn_nn():
    import_mace()  # e3nn's import reads its constants as mace-torch's set-up allows
    from e3nn import nn

    return nn


def test_it_gives_e3nn_activations_numbers_bit_for_bit(e3nn_nn):
    # Even and odd scalars with activations of their parity, then vectors left alone.
    activation = e3nn_nn.Activation("8x0e+4x0o+2x1o", [torch.nn.functional.silu, torch.tanh, None])
    features = torch.randn(5, 8 + 4 + 6, dtype=torch.float64)
    assert torch.equal(ScalarActivation(activation)(features), activation(features))


def test_it_gives_a_single_blocks_numbers_as_e3nn_does(e3nn_nn):
    activation = e3nn_nn.Activation("16x0e", [torch.nn.functional.silu])
    features = torch.randn(3, 16)
    assert torch.equal(ScalarActivation(activation)(features), activation(features))


def test_the_traced_copy_holds_none_and_the_model_keeps_its_own(e3nn_nn):
    # A converted model: its copy shares its modules' weights and is not rebuilt (an e3nn
    # model is, and building its readout registers the Activation, as mace-torch does).
    from mace.tools import compile as mace_compile

    from fastmace.models.load import load

    model = load("demo-emt-cu", backend="cueq", device="cpu").module
    registered = set(mace_compile._SIMPLIFY_REGISTRY)
    before = [type(m) for m in model.modules() if type(m) is e3nn_nn.Activation]
    traceable = _traceable(model, share_pair_radials=False)
    assert before, "the demo's non-linear readout holds an e3nn Activation"
    assert not any(type(m) is e3nn_nn.Activation for m in traceable.modules())
    held = [m for m in traceable.modules() if type(m) is ScalarActivation]
    assert len(held) == len(before)  # not simplify's fx graphs, whose classes are per instance
    assert [type(m) for m in model.modules() if type(m) is e3nn_nn.Activation] == before
    assert set(mace_compile._SIMPLIFY_REGISTRY) == registered


def test_replace_activations_counts_what_it_replaced(e3nn_nn):
    block = torch.nn.Sequential(
        torch.nn.Linear(4, 4),
        e3nn_nn.Activation("4x0e", [torch.tanh]),
        torch.nn.Sequential(e3nn_nn.Activation("4x0e", [torch.tanh])),
    )
    assert replace_activations(block) == 2
    assert [type(m).__name__ for m in block.modules()].count("ScalarActivation") == 2
