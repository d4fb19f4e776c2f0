"""The potential against mace-torch's own pipeline, padding exactness, and its conformance check.

Tolerances: results must agree with mace-torch's within 100 machine epsilons of the quantity's
scale (energy: max(|E|, number of atoms) eV; forces: max(|F|, 1 eV/Å); stress: max(|stress|,
0.01 eV/Å³)), i.e. about 1e-5 relative in float32 and 2e-14 in float64: the same arithmetic
in a different order. Padding must not change results beyond 4 epsilons of the same scales.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch
from ase.build import bulk
from ase.cluster import Icosahedron
from helpers.potential_checks import (
    assert_matches_reference,
    assert_same,
    model_of,
    on_cpu,
    run,
)
from helpers.structures import (
    STRUCTURES,
    ase_edges,
    cluster,
    copper_supercell,
    edges_on,
    small_cell,
    triclinic_mixed,
)

import fastmace as fm
from fastmace.dynamics import padding as padding_module
from fastmace.dynamics import potential as potential_module
from fastmace.dynamics.edges import Edges
from fastmace.dynamics.neighbours import NeighbourList
from fastmace.dynamics.potential import (
    Potential,
    PotentialCheckError,
    UnsupportedModelError,
    UnsupportedSpeciesError,
    check_potential,
    pad_edges,
)
from fastmace.dynamics.state import State
from fastmace.models import backends
from fastmace.models.checkpoint import contained, import_mace
from fastmace.models.templates import TEMPLATES, template

# --- Agreement with mace-torch --------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_tiny_template_matches_mace_on_every_cell_in_one_batch(dtype):
    model = model_of("tiny", dtype)
    structures = [make() for make in STRUCTURES.values()]
    potential = Potential(model, [29, 8, 6, 1])
    state, output = run(potential, structures, compute_stress=True)
    assert output.energy.dtype == output.forces.dtype == torch.float64
    assert_matches_reference(model, structures, output, state)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_mp0_small_template_matches_mace(dtype):
    model = model_of("mp0-small", dtype)
    structures = [copper_supercell((2, 1, 1)), triclinic_mixed(), small_cell(), cluster()]
    potential = Potential(model, [29, 8, 6, 1])
    state, output = run(potential, structures, compute_stress=True)
    assert_matches_reference(model, structures, output, state)


def test_multi_head_template_uses_the_chosen_head():
    model = model_of("mh-1", torch.float64)
    head = "matpes_r2scan"
    assert head != model.heads[0]
    structures = [small_cell()]
    potential = Potential(model, [29, 8], head=head)
    state, output = run(potential, structures, compute_stress=True)
    assert_matches_reference(model, structures, output, state, head=head)
    default = Potential(model, [29, 8], head=model.heads[0])
    other = default(state, ase_edges(state, default.r_max)).energy
    assert abs(float(other[0] - output.energy[0])) > 1e-3


def test_demo_model_matches_mace_and_its_calculator():
    loaded = fm.load("demo-emt-cu")
    copper = copper_supercell()
    skewed = bulk("Cu", "fcc", a=3.61).repeat((2, 2, 2))
    skewed.set_cell(skewed.cell @ [[1.0, 0.04, 0.0], [0.0, 1.0, -0.03], [0.02, 0.0, 0.98]], True)
    structures = [copper, skewed, Icosahedron("Cu", 2)]
    potential = Potential.from_loaded(loaded, [29])
    state, output = run(potential, structures, compute_stress=True)
    assert_matches_reference(loaded.module, structures, output, state)
    # The sign convention of the stress is the one MACECalculator hands to ASE.
    import_mace()
    from mace.calculators import MACECalculator

    with contained():
        atoms = copper.copy()
        atoms.calc = MACECalculator(models=copy.deepcopy(loaded.module), default_dtype="float64")
        stress = atoms.get_stress(voigt=False)
    np.testing.assert_allclose(output.stress[0].numpy(), stress, rtol=0, atol=1e-12)


def test_pair_repulsion_agnesi_transform_and_late_cutoff_match_mace(monkeypatch):
    # ZBL pair repulsion, the Agnesi distance transform and the cut-off applied after the
    # radial MLP (apply_cutoff=False) each take edge lengths their own way.
    extra = {"pair_repulsion": True, "distance_transform": "Agnesi", "apply_cutoff": False}
    monkeypatch.setitem(TEMPLATES, "tiny-zbl", dataclasses.replace(TEMPLATES["tiny"], extra=extra))
    model = template("tiny-zbl", dtype=torch.float64)
    compressed = bulk("Cu", "fcc", a=3.0, cubic=True).repeat((2, 2, 2))  # inside ZBL's range
    compressed.rattle(stdev=0.1, seed=4)
    structures = [compressed, cluster()]
    potential = Potential(model, [29, 8, 6, 1])
    state, output = run(potential, structures, compute_stress=True)
    assert_matches_reference(model, structures, output, state)
    skin = potential(state, ase_edges(state, potential.r_max + 1.0, 2.0), compute_stress=True)
    assert_same(output, skin, torch.float64)


# --- Padding --------------------------------------------------------------------------------------


def test_padding_changes_nothing_even_when_padding_slots_hold_garbage():
    model = model_of("tiny", torch.float32)
    potential = Potential(model, [29, 8, 6, 1])
    state = State.from_atoms([copper_supercell(), triclinic_mixed(), cluster()])
    exact = ase_edges(state, potential.r_max, 1.0)
    assert exact.capacity == int(exact.count)
    tripled = ase_edges(state, potential.r_max, 3.0)
    garbage = pad_edges(exact, 2 * exact.capacity)
    rng = torch.Generator().manual_seed(0)
    slots = slice(exact.capacity, None)
    garbage.edge_index[:, slots] = torch.randint(
        0, state.n_atoms, (2, 2 * exact.capacity), generator=rng
    )
    garbage.unit_shifts[slots] = float("nan")
    results = [potential(state, e, compute_stress=True) for e in (exact, tripled, garbage)]
    for result in results:
        for value in (result.energy, result.forces, result.stress):
            assert torch.isfinite(value).all()
        assert_same(results[0], result, torch.float32)
    # Not bitwise: on the development machine of 2026-12-01 (AVX-512) a padded edge array
    # changed forces by 7e-9 eV/Å (float32 rounding: the same terms summed in another order).


def test_padding_is_spread_over_padding_nodes_and_changes_nothing(monkeypatch):
    # Kernels sum into receivers with atomic adds, one at a time per address: all padding on
    # one node took minutes at a million atoms on an H200. A small atoms-per-node here gives
    # several padding nodes on a CPU-sized batch.
    monkeypatch.setattr(padding_module, "ATOMS_PER_PADDING_NODE", 8)
    model = model_of("tiny", torch.float64)
    potential = Potential(model, [29, 8, 6, 1])
    state = State.from_atoms([copper_supercell(), triclinic_mixed(), cluster()])
    exact = ase_edges(state, potential.r_max, 1.0)
    padded = pad_edges(exact, 301)
    graph = potential._graph(state, padded, compute_stress=False)
    nodes = padding_module.padding_nodes(state.n_atoms)
    assert nodes == -(-state.n_atoms // 8) > 1
    assert graph.data["node_attrs"].shape[0] == state.n_atoms + nodes
    receivers = graph.data["edge_index"][1]
    on_padding = receivers[receivers >= state.n_atoms] - state.n_atoms
    assert on_padding.numel() == 301
    assert int(torch.bincount(on_padding).max()) <= -(-301 // nodes) + 1
    assert_same(
        potential(state, exact, compute_stress=True),
        potential(state, padded, compute_stress=True),
        torch.float64,
    )


def test_a_regrown_list_changes_the_number_of_edges_only(monkeypatch):
    # A compiled model has the edge count symbolic and every other size fixed: a node count
    # that followed the list's capacity recompiled the model after a regrowth (13 s, H200).
    monkeypatch.setattr(padding_module, "ATOMS_PER_PADDING_NODE", 8)
    potential = Potential(model_of("tiny", torch.float64), [29, 8, 6, 1])
    state = State.from_atoms([copper_supercell(), triclinic_mixed()])
    exact = ase_edges(state, potential.r_max, 1.0)
    shapes = []
    for extra in (0, 64, 5000):
        data = potential._graph(state, pad_edges(exact, extra), compute_stress=True).data
        shapes.append({key: tuple(value.shape) for key, value in data.items()})
    for key in shapes[0]:
        edge_dimension = dict(potential_module.EDGE_DIMENSIONS).get(key)
        for other in shapes[1:]:
            assert [n for d, n in enumerate(other[key]) if d != edge_dimension] == [
                n for d, n in enumerate(shapes[0][key]) if d != edge_dimension
            ], key
    assert shapes[0]["batch"][0] == state.n_atoms + -(-state.n_atoms // 8)


def test_mirrored_padding_pairs_stay_pairs_on_their_padding_node(monkeypatch):
    monkeypatch.setattr(padding_module, "ATOMS_PER_PADDING_NODE", 4)
    model = model_of("tiny", torch.float64)
    potential = Potential(model, [29, 8, 6, 1])
    state = State.from_atoms([copper_supercell(), cluster()])
    neighbours = NeighbourList(state, potential.r_max, skin=0.5, cutoff_headroom=1.5)
    edges = neighbours.cutoff_edges(state, neighbours.build(state))
    assert edges.mirrored and not bool(edges.mask.all())
    index = potential._graph(state, edges, compute_stress=False).data["edge_index"]
    half = index.shape[1] // 2
    assert torch.equal(index[:, half:], index[:, :half].flip(0))
    assert int(index.max()) > state.n_atoms  # more than one padding node in use
    whole = ase_edges(state, potential.r_max, 1.0)
    assert_same(
        potential(state, whole, compute_stress=True),
        potential(state, edges, compute_stress=True),
        torch.float64,
    )


def test_skin_edges_beyond_the_cutoff_change_nothing_even_where_mace_would_count_them():
    # The mh-1 shape feeds radial features through an MLP with biases, so in mace-torch itself
    # an edge just beyond r_max is not zero: only rerouting such edges makes a skin exact.
    model = model_of("mh-1", torch.float64)
    potential = Potential(model, [29, 8], head=model.heads[0])
    state = State.from_atoms([small_cell()])
    exact_edges = ase_edges(state, potential.r_max, 1.0)
    skin_edges = ase_edges(state, potential.r_max + 1.0, 2.0)
    assert int(skin_edges.count) > int(exact_edges.count)
    exact = potential(state, exact_edges, compute_stress=True)
    skin = potential(state, skin_edges, compute_stress=True)
    assert_same(exact, skin, torch.float64)


# --- Conformance check ----------------------------------------------------------------------------


def _tiny_edges(state: State) -> Edges:
    return ase_edges(state, 4.0, 1.5)


@pytest.mark.parametrize("backend", ["e3nn", "cueq"])
def test_conformance_check_passes_on_each_cpu_backend(backend):
    found = backends.availability(backend, "cpu")
    if not found.available:
        pytest.skip(found.reason)
    model = backends.convert(model_of("tiny", torch.float64), backend, "cpu", torch.float32)
    check_potential(Potential(model, [29, 8, 1]), _tiny_edges)


class _MutatingPotential(Potential):
    def forward(self, state, edges, compute_stress=False):
        output = super().forward(state, edges, compute_stress)
        state.positions.add_(1e-3)
        return output


class _BatchBlindPotential(Potential):
    """Gives every system the energy of the whole batch: what forgetting ``system`` does."""

    def forward(self, state, edges, compute_stress=False):
        output = super().forward(state, edges, compute_stress)
        output.energy = output.energy.sum().expand(state.n_systems).clone()
        return output


@pytest.mark.parametrize(
    ("broken", "message"),
    [(_MutatingPotential, "changed its input"), (_BatchBlindPotential, "vs alone: energy")],
)
def test_conformance_check_catches_a_broken_potential(broken, message):
    potential = broken(model_of("tiny", torch.float64), [29, 8, 1])
    with pytest.raises(PotentialCheckError, match=message):
        check_potential(potential, _tiny_edges)


# --- On the GPU: every backend, no host synchronisation, capture in a CUDA graph ------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("backend", backends.BACKENDS)
def test_on_the_gpu_each_backend_conforms_and_replays_in_a_cuda_graph(backend):
    found = backends.availability(backend, "cuda")
    if not found.available:
        pytest.skip(found.reason)
    model = backends.convert(model_of("tiny", torch.float64), backend, "cuda", torch.float32)
    potential = Potential(model, [29, 8, 6, 1])
    check_potential(potential, lambda state: edges_on(_tiny_edges(state), state.device))
    structures = [copper_supercell(), triclinic_mixed(), cluster()]
    state = State.from_atoms(structures, device="cuda")
    edges = edges_on(ase_edges(state, potential.r_max + 0.5, 1.5), "cuda")
    before = on_cpu(potential(state, edges, compute_stress=True))
    assert_matches_reference(model, structures, before, state.to("cpu"))
    side = torch.cuda.Stream()  # warm up off the default stream, as capture requires
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            potential(state, edges, compute_stress=True)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.set_sync_debug_mode("error")  # any host synchronisation in the call raises
    try:
        with pytest.raises(RuntimeError):  # as this one does: the mode is on
            state.positions.sum().item()
        potential(state, edges, compute_stress=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = potential(state, edges, compute_stress=True)
    generator = torch.Generator(device="cuda").manual_seed(0)
    noise = torch.randn(state.positions.shape, generator=generator, device="cuda")
    state.positions.add_(0.03 * noise.double())  # within the skin: the edges stay valid
    graph.replay()
    replayed, eager = on_cpu(captured), on_cpu(potential(state, edges, compute_stress=True))
    assert_same(replayed, eager, torch.float32, epsilons=100)  # GPU atomics reorder sums
    assert float((replayed.forces - before.forces).abs().max()) > 1e-4  # it did recompute


# --- Construction ---------------------------------------------------------------------------------


def test_unsupported_species_are_named_with_the_models_elements():
    model = model_of("tiny", torch.float64)
    with pytest.raises(UnsupportedSpeciesError, match=r"Fe, Zn; its elements are H, C, O, Cu"):
        Potential(model, torch.tensor([29, 26, 30, 26]))


def test_a_multi_head_model_needs_a_head_and_a_known_one():
    model = model_of("mh-1", torch.float64)
    with pytest.raises(ValueError, match="6 heads"):
        Potential(model, [29])
    with pytest.raises(ValueError, match="no head 'pbe'"):
        Potential(model, [29], head="pbe")


def test_models_with_other_outputs_are_refused():
    class MACELES(torch.nn.Module):  # stands in for mace-torch's long-range model
        pass

    with pytest.raises(UnsupportedModelError, match="MACELES is not supported"):
        Potential(MACELES(), [29])


def test_stress_only_when_asked_and_no_process_wide_change():
    default = torch.get_default_dtype()
    potential = Potential(model_of("tiny", torch.float32), [29])
    with torch.no_grad():  # forces need autograd, which the call turns on for itself
        _, output = run(potential, [bulk("Cu", "fcc", a=3.61)])
    assert output.stress is None and output.virial is None
    assert output.energy.shape == (1,) and output.forces.shape == (1, 3)
    assert torch.get_default_dtype() == default


def test_tf32_precision_is_set_for_the_model_call_only():
    model = copy.deepcopy(model_of("tiny", torch.float32))  # the hook stays on this copy
    seen = []
    model.register_forward_pre_hook(
        lambda module, args: seen.append(torch.backends.cuda.matmul.fp32_precision)
    )
    before = torch.backends.cuda.matmul.fp32_precision
    _, plain = run(Potential(model, [29]), [copper_supercell()])
    _, fast = run(Potential(model, [29], matmul_precision="tf32"), [copper_supercell()])
    assert seen == [before, "tf32"]
    assert torch.backends.cuda.matmul.fp32_precision == before
    # On the CPU the switch changes no arithmetic: the same numbers, bit for bit.
    assert torch.equal(plain.forces, fast.forces)


def test_an_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="float32, tf32, bf16"):
        Potential(model_of("tiny", torch.float32), [29], matmul_precision="fp8")


@pytest.mark.parametrize("backend", ["e3nn", "cueq"])
def test_the_potential_runs_weights_that_need_no_gradient_and_leaves_the_models_alone(backend):
    """Forces need no weight gradients: a kernel library's backward would compute one for every
    input that requires it. The potential's copy shares the weights' storage (e3nn's generated
    TorchScript code is shared as it is), and the caller's model keeps its settings."""
    from fastmace.models.load import load

    model = load("demo-emt-cu", backend=backend, dtype="float64").module
    potential = Potential(model, [29])
    assert all(p.requires_grad for p in model.parameters())
    assert not any(p.requires_grad for p in potential.model.parameters())
    ours = {p.data_ptr() for p in potential.model.parameters()}
    assert ours <= {p.data_ptr() for p in model.parameters()}
    state = State.from_atoms([copper_supercell()])
    output = potential(state, ase_edges(state, potential.r_max, 1.5))
    assert torch.isfinite(output.forces).all() and output.forces.abs().max() > 0
