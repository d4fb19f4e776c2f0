"""The potential compiled ahead of time (dynamics/aot_potential.py): what its cache key
depends on. Building, loading and the check against the eager evaluation run in
test_compile_converted.py (cuEquivariance on the CPU compiles ahead of time)."""

from __future__ import annotations

import pytest
import torch

from fastmace.dynamics.aot_potential import artefact_identity, artefact_key
from fastmace.dynamics.potential import Potential
from fastmace.models.load import load

pytest.importorskip("cuequivariance_torch")


def _key(potential: Potential, **changes: object) -> str:
    settings = {"compute_stress": False, "mirrored": True, "n_systems": 1, **changes}
    return artefact_key(artefact_identity(potential, **settings))


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return load("demo-emt-cu", backend="cueq", dtype="float32").module


def test_the_same_potential_has_the_same_key(model):
    assert _key(Potential(model, [29])) == _key(Potential(model, [29]))


def test_the_key_changes_with_weights_tables_and_the_kind_of_evaluation(model):
    base = Potential(model, [29])
    other = load("demo-emt-cu", backend="cueq", dtype="float32").module
    with torch.no_grad():  # one weight, barely: another model (the potential shares weights)
        next(other.parameters()).add_(1e-6)
    changed = Potential(other, [29])
    keys = {
        _key(base),
        _key(changed),
        _key(Potential(model, [29], radial_table=True)),
        _key(base, compute_stress=True),
        _key(base, mirrored=False),
        _key(base, n_systems=2),
    }
    assert len(keys) == 6


def test_the_key_covers_torch_the_device_and_the_libraries(model):
    identity = artefact_identity(Potential(model, [29]), compute_stress=False, mirrored=True,
                                 n_systems=1)  # fmt: skip
    assert identity["torch"] == torch.__version__
    assert identity["device"].startswith("cpu:")
    assert "mace-torch" in identity["libraries"]
    assert len(identity["fastmace_code"]) == 64
    other_torch = {**identity, "torch": "0.0.0"}
    assert artefact_key(other_torch) != artefact_key(identity)


def test_a_package_traced_at_one_size_serves_fewer_and_more_padding_nodes(one_interaction_copper):
    """The number of padding nodes (one per 128 atoms begun) must put no condition on the
    number of atoms, which the export declares free. Counted inside the graph with
    ``max(1, ...)`` it did, and export refused the trace ("Constraints violated (atoms)") on
    the H200 at 13,824 atoms, so no package could be built there; traced as a size of one, a
    package built on a small cell would fix it at 1. Each way round here: traced at 32 atoms
    (one padding node) and called at 192 (two), and the reverse, against the eager evaluation."""
    from conftest import copper, model_edges

    from fastmace.dynamics import aot_potential
    from fastmace.dynamics.padding import padding_nodes
    from fastmace.dynamics.state import State

    potential = Potential(load(one_interaction_copper, backend="cueq").module, [29])
    small, large = State.from_atoms([copper((2, 2, 2))]), State.from_atoms([copper((4, 4, 3))])
    assert (padding_nodes(small.n_atoms), padding_nodes(large.n_atoms)) == (1, 2)
    for traced_at, called_at in ((small, large), (large, small)):
        edges = model_edges(traced_at, potential.r_max)
        graph = aot_potential.trace(potential, traced_at, edges, compute_stress=False)
        exported = torch.export.export(
            graph,
            tuple(aot_potential._inputs(traced_at, edges)),
            dynamic_shapes=aot_potential._dynamic_shapes(edges.mirrored),
            strict=False,
        )
        edges = model_edges(called_at, potential.r_max)
        energy, forces = exported.module()(*aot_potential._inputs(called_at, edges))
        expected = potential.evaluate_eagerly(called_at, edges, False)
        torch.testing.assert_close(forces, expected.forces)
        torch.testing.assert_close(energy, expected.energy)
