"""The per-element skip maps (md/species_linear.py) against mace-torch's skip tensor products.

Real mace-torch models (templates with random weights) on the e3nn backend and on
cuEquivariance's CPU fallback, in float64. "Equal" means within 100 machine epsilons of the
result's scale (energy: max(|E|, number of atoms) eV; forces: max(|F|, 1 eV/Å); stress:
max(|stress|, 0.01 eV/Å³)): the same arithmetic in another order.
"""

from __future__ import annotations

import copy
import inspect
import re

import numpy as np
import pytest
import torch
from ase.build import bulk
from conftest import cueq_template

from fastmace.dynamics.module_copy import copy_modules_of
from fastmace.dynamics.potential import Potential
from fastmace.dynamics.species_linear import (
    ELEMENT_SKIP_TP_BLOCKS,
    SpecialisationError,
    SpeciesLinear,
    check_species_linear,
    specialise_for_species,
    species_linear,
)
from fastmace.models.checkpoint import default_dtype, import_mace
from fastmace.models.load import load
from fastmace.models.reference import Evaluation, check_structure, evaluate
from fastmace.models.templates import template

EPS = torch.finfo(torch.float64).eps
RUN_SPECIES = (1, 8, 29)  # H, O, Cu: in every template below

_MODELS: dict[tuple[str, str], torch.nn.Module] = {}


def model_of(name: str, backend: str = "e3nn") -> torch.nn.Module:
    """A float64 template model on ``backend``, built once per test session."""
    if (name, backend) not in _MODELS:
        if backend == "e3nn":
            _MODELS[name, backend] = template(name, seed=0, dtype=torch.float64)
        elif backend == "cueq":
            # The conversion alone (what load converts; load also keeps it in the cache root,
            # whose round trip converts again: 11 of MP-0 small's 23 s, tested elsewhere).
            _MODELS[name, backend] = cueq_template(name)
        else:
            loaded = load(f"template:{name}", backend=backend, device="cpu", dtype="float64")
            _MODELS[name, backend] = loaded.module
    return _MODELS[name, backend]


def tiny_model_with(interaction: str) -> torch.nn.Module:
    """A small float64 MACE whose interaction blocks are all mace-torch's ``interaction``."""
    modules = import_mace()
    from e3nn import o3

    with default_dtype(torch.float64), torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        model = modules.MACE(
            r_max=4.0,
            num_bessel=4,
            num_polynomial_cutoff=5,
            max_ell=2,
            interaction_cls=modules.interaction_classes[interaction],
            interaction_cls_first=modules.interaction_classes[interaction],
            num_interactions=2,
            num_elements=4,
            hidden_irreps=o3.Irreps("8x0e+8x1o"),
            MLP_irreps=o3.Irreps("4x0e"),
            atomic_energies=np.array([-1.0, -2.0, -3.0, -4.0]),
            avg_num_neighbors=8.0,
            atomic_numbers=[1, 6, 8, 29],
            correlation=2,
            gate=torch.nn.functional.silu,
            radial_MLP=[8, 8],
        )
    return model.eval()


def skip_tps(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [block.skip_tp for block in model.interactions if hasattr(block, "skip_tp")]


def assert_same_evaluation(actual: Evaluation, expected: Evaluation, num_atoms: int) -> None:
    energy_scale = max(abs(expected.energy), num_atoms)
    assert abs(actual.energy - expected.energy) <= 100 * EPS * energy_scale
    force_scale = max(float(np.abs(expected.forces).max()), 1.0)
    np.testing.assert_allclose(actual.forces, expected.forces, rtol=0, atol=100 * EPS * force_scale)
    stress_scale = max(float(np.abs(expected.stress).max()), 0.01)
    np.testing.assert_allclose(
        actual.stress, expected.stress, rtol=0, atol=100 * EPS * stress_scale
    )


def one_hot(columns: torch.Tensor, width: int) -> torch.Tensor:
    attrs = torch.zeros((len(columns), width), dtype=torch.float64)
    attrs[torch.arange(len(columns)), columns] = 1.0
    return attrs


BACKEND_MODELS = [
    ("tiny", "e3nn"), ("mp0-small", "e3nn"), ("mp0-medium", "e3nn"),
    ("tiny", "cueq"), ("mp0-small", "cueq"),
]  # fmt: skip


# --- The module -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "backend"), BACKEND_MODELS)
def test_species_linear_equals_the_skip_tensor_product(name, backend):
    model = model_of(name, backend)
    numbers = [int(z) for z in model.atomic_numbers]
    columns = [numbers.index(z) for z in RUN_SPECIES]
    generator = torch.Generator().manual_seed(5)
    for skip_tp in skip_tps(model):
        replacement = species_linear(skip_tp, columns, len(numbers))
        assert replacement.matrices.dtype == torch.float64
        assert tuple(replacement.matrices.shape) == (
            replacement.in_features, len(columns) * replacement.out_features
        )  # fmt: skip
        # Nodes of the run's elements in a mixed order, as in a real batch.
        node_columns = torch.tensor(columns).repeat(7)[torch.randperm(21, generator=generator)]
        feats = torch.randn((21, replacement.in_features), generator=generator, dtype=torch.float64)
        attrs = one_hot(node_columns, len(numbers))
        with torch.no_grad():
            expected = skip_tp(feats, attrs)
        actual = replacement(feats, attrs)
        scale = float(expected.abs().max())
        assert scale > 0.1  # a real map, not zeros on both sides
        assert float((actual - expected).abs().max()) <= 100 * EPS * scale


def test_a_node_of_an_element_outside_the_run_gets_nan():
    model = model_of("tiny")
    replacement = species_linear(skip_tps(model)[0], [0, 3], 4)  # H and Cu, not C or O
    feats = torch.randn((4, replacement.in_features), dtype=torch.float64)
    out = replacement(feats, one_hot(torch.tensor([0, 1, 2, 3]), 4))
    assert torch.isfinite(out[[0, 3]]).all()
    assert torch.isnan(out[[1, 2]]).all()


def test_the_check_refuses_maps_that_differ_from_the_tensor_product():
    skip_tp = skip_tps(model_of("tiny"))[0]
    good = species_linear(skip_tp, [0, 2, 3], 4)
    check_species_linear(skip_tp, good)
    first = good.matrix(0)
    off = SpeciesLinear(
        torch.stack([good.matrix(c) for c in (0, 2, 3)]) + 1e-9 * first.abs().max(), [0, 2, 3], 4
    )
    with pytest.raises(SpecialisationError, match="differ from the tensor product"):
        check_species_linear(skip_tp, off)


# --- The model transformation ---------------------------------------------------------------------


@pytest.mark.parametrize(("name", "backend"), BACKEND_MODELS)
def test_the_specialised_model_gives_the_same_energy_forces_and_stress(name, backend):
    model = model_of(name, backend)
    specialised = specialise_for_species(model, RUN_SPECIES)
    replaced = [m for m in specialised.modules() if isinstance(m, SpeciesLinear)]
    assert len(replaced) == len(model.interactions)
    atoms = check_structure(RUN_SPECIES, seed=2)
    assert_same_evaluation(evaluate(specialised, atoms), evaluate(model, atoms), len(atoms))


def test_the_callers_model_is_unchanged():
    model = model_of("mp0-small")
    atoms = check_structure(RUN_SPECIES, seed=3)
    before = evaluate(model, atoms)
    modules = dict(model.named_modules())
    state = {key: value.clone() for key, value in model.state_dict().items()}
    specialise_for_species(model, RUN_SPECIES)
    assert dict(model.named_modules()).keys() == modules.keys()
    assert all(module is modules[name] for name, module in model.named_modules())
    assert not any(isinstance(module, SpeciesLinear) for module in model.modules())
    after_state = model.state_dict()
    assert after_state.keys() == state.keys()
    assert all(torch.equal(after_state[key], value) for key, value in state.items())
    after = evaluate(model, atoms)
    assert after.energy == before.energy and np.array_equal(after.forces, before.forces)


def test_only_the_runs_elements_are_kept_and_the_others_are_not_needed():
    model = model_of("mp0-medium")
    copper = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 1, 1))
    copper.rattle(0.05, seed=4)
    specialised = specialise_for_species(model, [29])
    for block in specialised.interactions:
        assert block.skip_tp.columns == (28,)  # copper's column among the 89 elements
        assert block.skip_tp.matrices.shape[1] == block.skip_tp.out_features  # one map only
    assert_same_evaluation(evaluate(specialised, copper), evaluate(model, copper), len(copper))
    # An element left out is not silently dropped from the skip connection.
    oxidised = copper.copy()
    oxidised.numbers[0] = 8
    assert np.isnan(evaluate(specialised, oxidised, stress=False).energy)


@pytest.mark.parametrize(
    ("interaction", "replaced"),
    [
        ("RealAgnosticInteractionBlock", True),
        ("RealAgnosticResidualInteractionBlock", True),
        ("RealAgnosticDensityInteractionBlock", True),
        ("RealAgnosticDensityResidualInteractionBlock", True),
        # skip_tp is a Linear of the features alone / there is no skip_tp: left untouched.
        ("RealAgnosticResidualNonLinearInteractionBlock", False),
        ("RealAgnosticAttResidualInteractionBlock", False),
    ],
)
def test_each_interaction_block_kind(interaction, replaced):
    model = tiny_model_with(interaction)
    specialised = specialise_for_species(model, (1, 8))
    for original, block in zip(model.interactions, specialised.interactions, strict=True):
        skip = getattr(block, "skip_tp", None)
        if replaced:
            assert isinstance(skip, SpeciesLinear)
        else:
            assert skip is None or type(skip) is type(original.skip_tp)
    atoms = check_structure((1, 8), seed=5)
    assert_same_evaluation(evaluate(specialised, atoms), evaluate(model, atoms), len(atoms))


def test_the_block_list_is_mace_torchs_blocks_that_pass_node_attrs_to_skip_tp():
    # Fails when a mace-torch release adds, removes or changes such a block: update the list.
    modules = import_mace()
    calls = re.compile(r"self\.skip_tp\(\s*\w+\s*,\s*node_attrs\s*\)")
    found = {
        name
        for name, kind in modules.interaction_classes.items()
        if calls.search(inspect.getsource(kind.forward))
    }
    assert found == set(ELEMENT_SKIP_TP_BLOCKS)


def test_a_model_rebuilt_from_its_configuration_gets_the_replaced_modules_back():
    # What torch.compile's path does with an e3nn model (md/potential.py, _compiled).
    import_mace()
    from mace.tools.scripts_utils import extract_model

    specialised = specialise_for_species(model_of("tiny"), RUN_SPECIES)
    with default_dtype(torch.float64):
        rebuilt = extract_model(specialised)
    # mace's rebuild has its own skip_tp there, at initial weights: not the model's.
    assert not any(isinstance(module, SpeciesLinear) for module in rebuilt.modules())
    rebuilt = copy_modules_of(specialised, rebuilt, (SpeciesLinear,))
    assert rebuilt.state_dict().keys() == specialised.state_dict().keys()
    atoms = check_structure(RUN_SPECIES, seed=7)
    assert_same_evaluation(evaluate(rebuilt, atoms), evaluate(specialised, atoms), len(atoms))


def test_unknown_elements_and_a_second_specialisation_are_refused():
    model = model_of("tiny")
    with pytest.raises(SpecialisationError, match=r"\[26\] are not among the model's elements"):
        specialise_for_species(model, [29, 26])
    with pytest.raises(SpecialisationError, match="no elements given"):
        specialise_for_species(model, [])
    copper_only = specialise_for_species(model, [29])
    # Again for a subset is fine; for another element the maps are not there.
    assert skip_tps(specialise_for_species(copper_only, [29]))[0].columns == (3,)
    with pytest.raises(SpecialisationError, match="specialise the original model"):
        specialise_for_species(copper_only, [8])


# --- In the potential -----------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["e3nn", "cueq"])
def test_the_potential_runs_a_specialised_copy(backend):
    model = model_of("tiny", backend)
    before = copy.deepcopy(model.state_dict())
    potential = Potential(model, [29, 8])
    assert potential.model is not model
    for skip_tp in skip_tps(potential.model):
        # Cu and O, and H: the padding node is an atom of the model's first element.
        assert isinstance(skip_tp, SpeciesLinear) and skip_tp.columns == (0, 2, 3)
    assert not any(isinstance(module, SpeciesLinear) for module in model.modules())
    assert all(torch.equal(value, before[key]) for key, value in model.state_dict().items())


def test_the_potential_gives_mace_torchs_result_for_a_cu_o_structure():
    from fastmace.dynamics.neighbours import NeighbourList
    from fastmace.dynamics.state import State

    model = model_of("mp0-small", "cueq")
    atoms = check_structure((8, 29), seed=6)
    potential = Potential(model, [8, 29])
    state = State.from_atoms([atoms])
    output = potential(state, NeighbourList(state, potential.r_max, 0.0).build(state), True)
    expected = evaluate(model, atoms)
    actual = Evaluation(float(output.energy[0]), output.forces.numpy(), output.stress[0].numpy())
    assert_same_evaluation(actual, expected, len(atoms))
