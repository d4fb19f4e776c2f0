"""Radial weights once per pair (dynamics/pair_radials.py) on the mirrored edges the neighbour
list gives the model: the same energies, forces and stresses as mace-torch, with the radial
MLPs run on half the edges."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import model_edges
from helpers.potential_checks import assert_matches_reference, assert_same, model_of, on_cpu
from helpers.structures import ase_edges, cluster, copper_supercell, small_cell, triclinic_mixed

from fastmace.dynamics.pair_radials import (
    PairIndexedConvolution,
    PairSharedRadial,
    pair_shared_model,
)
from fastmace.dynamics.potential import Potential, check_potential
from fastmace.dynamics.state import State
from fastmace.models import backends
from fastmace.models.templates import TEMPLATES, template

STRUCTURES = (copper_supercell, triclinic_mixed, small_cell, cluster)


def radial_rows(potential: Potential) -> tuple[list[int], list[torch.utils.hooks.RemovableHandle]]:
    """Record the number of rows each shared radial MLP is called on."""
    rows: list[int] = []
    handles = [
        module.radial.register_forward_hook(lambda _m, args, _out: rows.append(args[0].shape[0]))
        for module in potential.pair_model.modules()
        if isinstance(module, PairSharedRadial)
    ]
    return rows, handles


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", ["tiny", "mp0-small"])
def test_mirrored_edges_run_each_radial_mlp_on_half_the_edges_and_match_mace(name, dtype):
    model = model_of(name, dtype)
    structures = [make() for make in STRUCTURES]
    potential = Potential(model, [29, 8, 6, 1])
    state = State.from_atoms(structures)
    edges = model_edges(state, potential.r_max)
    rows, handles = radial_rows(potential)
    output = potential(state, edges, compute_stress=True)
    for handle in handles:
        handle.remove()
    assert rows == [edges.capacity // 2] * len(model.interactions)
    assert_matches_reference(model, structures, output, state)
    # The same numbers as every edge through the MLP, to the rounding of the summation order.
    plain = potential(state, ase_edges(state, potential.r_max, 1.5), compute_stress=True)
    assert_same(output, plain, dtype)


def test_a_symmetric_distance_transform_and_a_late_cutoff_share_too(monkeypatch):
    # Agnesi's transform reads both elements (through their mean radius), and with
    # apply_cutoff=False the cut-off multiplies the MLP's output, after the sharing.
    extra = {"pair_repulsion": True, "distance_transform": "Agnesi", "apply_cutoff": False}
    monkeypatch.setitem(
        TEMPLATES, "tiny-agnesi", dataclasses.replace(TEMPLATES["tiny"], extra=extra)
    )
    model = template("tiny-agnesi", dtype=torch.float64)
    structures = [copper_supercell(), triclinic_mixed(), cluster()]
    potential = Potential(model, [29, 8, 6, 1])
    assert potential.pair_model is not None
    state = State.from_atoms(structures)
    output = potential(state, model_edges(state, potential.r_max), compute_stress=True)
    assert_matches_reference(model, structures, output, state)


def test_the_indexed_convolution_equals_mace_fused_call_on_repeated_weights():
    # mace fuses cuEquivariance's convolution only on CUDA (with its uniform_1d kernels); on
    # the CPU the same segmented polynomial runs cuEquivariance's reference implementation,
    # called here as mace's fused convolution calls it. The model-level check is the GPU test.
    import cuequivariance as cue
    import cuequivariance_torch as cuet

    irreps = (cue.Irreps("O3", "4x0e+4x1o"), cue.Irreps("O3", "0e+1o+2e"))
    descriptor = cue.descriptors.channelwise_tensor_product(*irreps, irreps[0])
    polynomial = descriptor.flatten_coefficient_modes().squeeze_modes().polynomial
    convolution = cuet.SegmentedPolynomial(polynomial, method="naive", math_dtype=torch.float64)
    convolution.original_forward = convolution.forward
    generator = torch.Generator().manual_seed(0)
    nodes, pairs = 5, 7
    sizes = [operand.size for operand in polynomial.inputs]
    weights = torch.randn(pairs, sizes[0], generator=generator, dtype=torch.float64)
    features = torch.randn(nodes, sizes[1], generator=generator, dtype=torch.float64)
    attrs = torch.randn(2 * pairs, sizes[2], generator=generator, dtype=torch.float64)
    first = torch.randint(0, nodes, (2, pairs), generator=generator)
    edge_index = torch.cat([first, first.flip(0)], dim=1)  # mirrored
    indexed = PairIndexedConvolution(convolution)(features, attrs, weights, edge_index)
    repeated = convolution(
        [torch.cat([weights, weights]), features, attrs],
        {1: edge_index[0]},
        {0: features},
        {0: edge_index[1]},
    )[0]
    torch.testing.assert_close(indexed, repeated, rtol=0, atol=1e-12)


def test_blocks_whose_radial_input_depends_on_the_direction_are_left_alone():
    # mh-1's non-linear blocks append the sender's and the receiver's element embeddings to the
    # radial features: i -> j and j -> i differ, so nothing may be shared.
    model = model_of("mh-1", torch.float64)
    assert pair_shared_model(model) is None
    potential = Potential(model, [29, 8], head=model.heads[0])
    assert potential.pair_model is None
    structures = [small_cell()]
    state = State.from_atoms(structures)
    output = potential(state, model_edges(state, potential.r_max), compute_stress=True)
    assert_matches_reference(model, structures, output, state, head=model.heads[0])


def test_the_conformance_check_passes_on_mirrored_edges():
    # Batches against single systems and extra padding (which ends the mirrored layout, so
    # the padded call runs every edge through the MLP: both ways must agree).
    potential = Potential(model_of("tiny", torch.float64), [29, 8, 6, 1])
    check_potential(potential, lambda state: model_edges(state, potential.r_max))


def test_the_original_model_is_not_changed():
    model = model_of("tiny", torch.float64)
    potential = Potential(model, [29, 8, 6, 1])
    assert not any(isinstance(m, PairSharedRadial) for m in model.modules())
    assert not any(isinstance(m, PairSharedRadial) for m in potential.model.modules())
    shared = dict(potential.pair_model.named_parameters())
    for name, parameter in potential.model.named_parameters():
        twin = shared[name.replace("conv_tp_weights.", "conv_tp_weights.radial.")]
        assert twin is parameter  # the same weights, not a copy


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("backend", backends.BACKENDS)
def test_on_the_gpu_each_backend_shares_radial_weights_on_mirrored_edges(backend):
    found = backends.availability(backend, "cuda")
    if not found.available:
        pytest.skip(found.reason)
    model = backends.convert(model_of("tiny", torch.float64), backend, "cuda", torch.float32)
    potential = Potential(model, [29, 8, 6, 1])
    assert potential.pair_model is not None
    # mace fuses cuEquivariance's convolution on CUDA: then it reads each pair's row by index.
    indexed = any(isinstance(m, PairIndexedConvolution) for m in potential.pair_model.modules())
    assert indexed == (backend == "cueq")
    structures = [copper_supercell(), triclinic_mixed(), cluster()]
    state = State.from_atoms(structures, device="cuda")
    output = on_cpu(potential(state, model_edges(state, potential.r_max), compute_stress=True))
    assert_matches_reference(model, structures, output, state.to("cpu"))
    check_potential(potential, lambda state: model_edges(state, potential.r_max))
