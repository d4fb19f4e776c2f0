"""The device neighbour list against ASE's, its skin logic, its overflow flag, and its promise
of no host synchronisation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.neighborlist import neighbor_list
from helpers.host_sync import ForbidHostSync, HostSync

from fastmace.dynamics.edges import Edges
from fastmace.dynamics.neighbours import NeighbourList
from fastmace.dynamics.state import State

CUTOFF = 3.0
SKIN = 0.5
METHODS = ("dense", "binned")


def ase_edges(atoms: Atoms, radius: float, offset: int = 0) -> set[tuple[int, ...]]:
    """ASE's (sender, receiver, shift) triples; its i, j, S map to sender, receiver, shift."""
    i, j, shifts = neighbor_list("ijS", atoms, radius)
    triples = zip(i.tolist(), j.tolist(), shifts.astype(int).tolist(), strict=True)
    return {(a + offset, b + offset, *s) for a, b, s in triples}


def our_edges(edges: Edges) -> set[tuple[int, ...]]:
    """The real edges as triples; fails on duplicates or non-integer shifts."""
    mask = edges.mask
    shifts = edges.unit_shifts[mask]
    assert torch.equal(shifts, shifts.round())
    pairs = edges.edge_index[:, mask].T.tolist()
    triples = [(s, r, *shift) for (s, r), shift in zip(pairs, shifts.long().tolist(), strict=True)]
    assert len(triples) == len(set(triples)), "duplicate edges"
    return set(triples)


def check_padding(edges: Edges) -> None:
    """Mask agrees with count; padding is atom 0 to atom 0 with zero shift."""
    count = min(int(edges.count), edges.capacity)
    assert int(edges.mask.sum()) == count
    assert edges.mask[:count].all()
    assert (edges.edge_index[:, count:] == 0).all()
    assert (edges.unit_shifts[count:] == 0).all()


def random_atoms(rng: np.random.Generator, n: int, cell, pbc=True, spread=(0.0, 1.0)) -> Atoms:
    atoms = Atoms(numbers=np.ones(n, dtype=int), cell=cell, pbc=pbc)
    atoms.set_scaled_positions(rng.uniform(*spread, size=(n, 3)))
    return atoms


def structures() -> dict[str, tuple[Atoms, float]]:
    """Named test structures and the cutoff to use on each."""
    rng = np.random.default_rng(7)
    molecule = Atoms(numbers=np.ones(30, dtype=int), positions=rng.normal(0, 3, (30, 3)))
    triclinic = [[10, 0, 0], [8, 9, 0], [-5, 6, 10]]
    skewed_small = [[2.5, 0, 0], [1.8, 2.2, 0], [1, 1, 2]]
    slab = random_atoms(rng, 60, [[9, 0, 0], [3, 8, 0], [1, 1, 10]], [1, 1, 0], (-0.5, 1.5))
    wire = random_atoms(rng, 40, [[7, 1, 0], [0, 6, 0], [0, 0, 9]], [1, 0, 0])
    return {
        "orthorhombic": (random_atoms(rng, 80, [11, 12, 13]), CUTOFF),
        "triclinic": (random_atoms(rng, 70, triclinic), CUTOFF),
        "one_atom_small_cell": (random_atoms(rng, 1, [2.5, 2.5, 2.5]), 5.0),
        "two_atoms_skewed_cell": (random_atoms(rng, 2, skewed_small), 5.0),
        "molecule_zero_cell": (molecule, CUTOFF),
        "slab": (slab, CUTOFF),
        "wire": (wire, CUTOFF),
        "cell_not_periodic": (random_atoms(rng, 40, [10, 10, 10], False, (-0.2, 1.2)), CUTOFF),
    }


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", list(structures()))
def test_build_matches_ase(name: str, method: str) -> None:
    atoms, cutoff = structures()[name]
    state = State.from_atoms(atoms)
    nl = NeighbourList(state, cutoff, SKIN, method=method)
    edges = nl.build(state)
    assert not bool(edges.overflow)
    assert our_edges(edges) == ase_edges(atoms, cutoff + SKIN)
    check_padding(edges)
    assert edges.edge_index.dtype == torch.int64 and edges.unit_shifts.dtype == torch.float64


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("wrapped", [False, True])
def test_positions_outside_the_cell(method: str, wrapped: bool) -> None:
    rng = np.random.default_rng(3)
    atoms = random_atoms(rng, 50, [[9, 0, 0], [4, 9, 0], [-3, 2, 10]])
    # Move every atom by a random lattice translation, far outside the cell.
    atoms.positions += rng.integers(-3, 4, size=(50, 3)) @ atoms.cell.array
    if wrapped:
        atoms.wrap()
    state = State.from_atoms(atoms)
    edges = NeighbourList(state, CUTOFF, SKIN, method=method).build(state)
    assert our_edges(edges) == ase_edges(atoms, CUTOFF + SKIN)


@pytest.mark.parametrize("method", METHODS)
def test_batch_of_three_systems(method: str) -> None:
    table = structures()
    parts = [table[name][0] for name in ("triclinic", "molecule_zero_cell", "slab")]
    state = State.from_atoms(parts)
    edges = NeighbourList(state, CUTOFF, SKIN, method=method).build(state)
    expected, offset = set(), 0
    for atoms in parts:
        expected |= ase_edges(atoms, CUTOFF + SKIN, offset)
        offset += len(atoms)
    assert our_edges(edges) == expected
    sender, receiver = edges.edge_index[:, edges.mask]
    assert torch.equal(state.system[sender], state.system[receiver])


def test_auto_picks_dense_for_tiny_and_binned_for_large() -> None:
    rng = np.random.default_rng(0)
    tiny = State.from_atoms(random_atoms(rng, 2, [2.5, 2.5, 2.5]))
    assert NeighbourList(tiny, 5.0, SKIN).method == "dense"
    large = State.from_atoms(random_atoms(rng, 600, [20, 20, 20]))
    assert NeighbourList(large, CUTOFF, SKIN).method == "binned"


@pytest.mark.parametrize("cell", [[20, 20.5, 21], [[20, 0, 0], [5, 20, 0], [-3, 4, 21]]])
def test_a_long_radius_gets_bins_narrower_than_it_and_the_same_edges(cell) -> None:
    # D3's list in miniature: a radius about a third of the cell. Bins a half or a third of the
    # radius wide (a wider stencil) examine far fewer candidates, and must find every pair.
    from fastmace.dynamics.neighbours import (
        FINER_BINS_MIN_GAIN,
        _bin_capacity,
        _locate,
        _plan_grid,
    )

    rng = np.random.default_rng(5)
    atoms = random_atoms(rng, 1200, cell)  # two coarse bins per direction, 170 atoms each
    state = State.from_atoms(atoms)
    radius = 7.0
    nl = NeighbourList(state, radius - SKIN, SKIN, method="binned")
    assert nl.grid.stencil.shape[0] > 27  # finer than one radius per bin
    coarse = _plan_grid(state, radius, "binned", 0.05)

    def candidates(grid) -> int:
        occupancy = int(_locate(grid, state)[3].max())
        return grid.stencil.shape[0] * _bin_capacity("binned", occupancy, 1.25)

    assert candidates(coarse) >= FINER_BINS_MIN_GAIN * candidates(nl.grid)
    edges = nl.build(state)
    assert not bool(edges.overflow)
    assert our_edges(edges) == ase_edges(atoms, radius)


def test_update_before_any_build_rebuilds() -> None:
    atoms = structures()["slab"][0]
    state = State.from_atoms(atoms)
    nl = NeighbourList(state, CUTOFF, SKIN)
    empty = Edges(
        edge_index=torch.zeros(2, nl.capacity, dtype=torch.int64),
        unit_shifts=torch.zeros(nl.capacity, 3, dtype=torch.float64),
        mask=torch.zeros(nl.capacity, dtype=torch.bool),
        count=torch.zeros((), dtype=torch.int64),
        overflow=torch.zeros((), dtype=torch.bool),
    )
    assert our_edges(nl.update(state, empty)) == ase_edges(atoms, CUTOFF + SKIN)


def test_rejects_periodic_axis_without_lattice_vector() -> None:
    atoms = Atoms("H2", positions=[[0, 0, 0], [1, 0, 0]], cell=[5, 5, 0], pbc=True)
    with pytest.raises(ValueError, match="periodic along axis 2"):
        NeighbourList(State.from_atoms(atoms), CUTOFF, SKIN)


# The skin.


def skin_setup(method: str, skin: float = 1.0) -> tuple[Atoms, State, NeighbourList, Edges]:
    atoms = structures()["triclinic"][0]
    state = State.from_atoms(atoms)
    nl = NeighbourList(state, CUTOFF, skin, method=method)
    return atoms, state, nl, nl.build(state)


def moved(atoms: Atoms, displacement: np.ndarray) -> Atoms:
    atoms = atoms.copy()
    atoms.positions += displacement
    return atoms


def assert_complete(edges: Edges, atoms: Atoms, state: State) -> None:
    """Every pair within the cutoff now is stored; recomputing from the stored edges within
    the cutoff gives exactly ASE's list."""
    stored = our_edges(edges)
    within = ase_edges(atoms, CUTOFF)
    assert within <= stored
    sender, receiver = edges.edge_index[:, edges.mask]
    shifts = edges.unit_shifts[edges.mask]
    vector = state.positions[receiver] - state.positions[sender]
    vector = vector + torch.einsum("ek,kd->ed", shifts, state.cell[0])
    close = vector.norm(dim=-1) < CUTOFF
    kept = torch.cat([edges.edge_index[:, edges.mask].T, shifts.long()], dim=1)[close]
    assert {tuple(row) for row in kept.tolist()} == within


@pytest.mark.parametrize("method", METHODS)
def test_small_moves_keep_the_list(method: str) -> None:
    atoms, state, nl, edges = skin_setup(method)
    before = [t.clone() for t in (edges.edge_index, edges.unit_shifts, edges.mask, edges.count)]
    rng = np.random.default_rng(1)
    step = rng.normal(size=(len(atoms), 3))
    step *= 0.45 / np.linalg.norm(step, axis=1, keepdims=True)  # just under skin / 2
    atoms = moved(atoms, step)
    state.positions.copy_(torch.as_tensor(atoms.positions))
    assert not bool(nl.needs_rebuild(state))
    nl.update(state, edges)
    after = (edges.edge_index, edges.unit_shifts, edges.mask, edges.count)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert_complete(edges, atoms, state)


@pytest.mark.parametrize("method", METHODS)
def test_large_move_rebuilds(method: str) -> None:
    atoms, state, nl, edges = skin_setup(method)
    step = np.zeros((len(atoms), 3))
    step[5] = [0.4, 0.3, 0.2]  # one atom, |step| = 0.54 > skin / 2 = 0.5
    state.positions.copy_(torch.as_tensor(atoms.positions + step))
    assert bool(nl.needs_rebuild(state))
    step[9] = [-2.0, 1.5, 3.0]
    atoms = moved(atoms, step)
    state.positions.copy_(torch.as_tensor(atoms.positions))
    nl.update(state, edges)
    assert our_edges(edges) == ase_edges(atoms, CUTOFF + 1.0)
    check_padding(edges)
    assert not bool(nl.needs_rebuild(state)), "the rebuild must reset the reference"


@pytest.mark.parametrize("method", METHODS)
def test_check_marks_the_list_stale_only_past_half_the_skin(method: str) -> None:
    atoms, state, nl, _ = skin_setup(method)
    step = np.zeros((len(atoms), 3))
    step[5] = [0.3, 0.3, 0.2]  # |step| = 0.47 < skin / 2
    state.positions.copy_(torch.as_tensor(atoms.positions + step))
    with ForbidHostSync():
        nl.check(state)
    assert not bool(nl.stale)
    step[5] = [0.4, 0.3, 0.2]  # 0.54 > skin / 2: a pair may be missing
    state.positions.copy_(torch.as_tensor(atoms.positions + step))
    nl.check(state)
    assert bool(nl.stale)
    state.positions.copy_(torch.as_tensor(atoms.positions))
    nl.check(state)
    assert bool(nl.stale), "stale stays set until the engine redoes the block"


@pytest.mark.parametrize("method", METHODS)
def test_rebuild_searches_even_when_the_skin_holds(method: str) -> None:
    atoms, state, nl, edges = skin_setup(method)
    step = np.random.default_rng(4).normal(scale=0.05, size=(len(atoms), 3))
    atoms = moved(atoms, step)
    state.positions.copy_(torch.as_tensor(atoms.positions))
    assert not bool(nl.needs_rebuild(state))
    with ForbidHostSync():
        nl.rebuild(state, edges)
    assert our_edges(edges) == ase_edges(atoms, CUTOFF + 1.0)
    assert torch.equal(nl.reference()[0], state.positions), "the reference moves with it"


@pytest.mark.parametrize("method", METHODS)
def test_wrapping_an_atom_triggers_a_rebuild(method: str) -> None:
    atoms, state, nl, edges = skin_setup(method)
    atoms = atoms.copy()
    atoms.positions[3] += atoms.cell[1]  # same physics, but the stored shifts are now stale
    state.positions.copy_(torch.as_tensor(atoms.positions))
    nl.update(state, edges)
    assert our_edges(edges) == ase_edges(atoms, CUTOFF + 1.0)


def test_open_system_atoms_leaving_the_grid() -> None:
    atoms = structures()["molecule_zero_cell"][0]
    state = State.from_atoms(atoms)
    nl = NeighbourList(state, CUTOFF, SKIN, method="binned")
    edges = nl.build(state)
    atoms = atoms.copy()
    atoms.positions[:3] = atoms.positions[0] + [[40.0, 0, 0], [41.0, 0.5, 0], [40.5, 1.5, 0]]
    atoms.positions[3:5] = [[-30.0, -30, -30], [-31.0, -30, -30]]
    state.positions.copy_(torch.as_tensor(atoms.positions))
    nl.update(state, edges)
    assert not bool(edges.overflow)
    assert our_edges(edges) == ase_edges(atoms, CUTOFF + SKIN)


def strained(atoms: Atoms, factor: float) -> Atoms:
    atoms = atoms.copy()
    atoms.set_cell(atoms.cell.array * factor, scale_atoms=True)
    return atoms


@pytest.mark.parametrize("method", METHODS)
def test_cell_changes_count_towards_the_skin(method: str) -> None:
    atoms, state, nl, edges = skin_setup(method)
    small = strained(atoms, 0.996)
    state.positions.copy_(torch.as_tensor(small.positions))
    state.cell.copy_(torch.as_tensor(small.cell.array)[None])
    assert not bool(nl.needs_rebuild(state))
    nl.update(state, edges)
    assert_complete(edges, small, state)
    large = strained(atoms, 0.95)
    state.positions.copy_(torch.as_tensor(large.positions))
    state.cell.copy_(torch.as_tensor(large.cell.array)[None])
    assert bool(nl.needs_rebuild(state))
    nl.update(state, edges)
    assert our_edges(edges) == ase_edges(large, CUTOFF + 1.0)
    assert not bool(edges.overflow)


@pytest.mark.parametrize("method", METHODS)
def test_cell_change_alone_triggers_a_rebuild(method: str) -> None:
    atoms, state, nl, edges = skin_setup(method)
    atoms = atoms.copy()
    atoms.set_cell(atoms.cell.array * 0.96)  # atoms stay put; images move up to ~0.5 Å
    state.cell.copy_(torch.as_tensor(atoms.cell.array)[None])
    assert bool(nl.needs_rebuild(state))
    nl.update(state, edges)
    assert our_edges(edges) == ase_edges(atoms, CUTOFF + 1.0)


# Overflow.


@pytest.mark.parametrize("method", METHODS)
def test_edge_overflow_reports_true_count(method: str) -> None:
    atoms = structures()["orthorhombic"][0]
    state = State.from_atoms(atoms)
    expected = ase_edges(atoms, CUTOFF + SKIN)
    nl = NeighbourList(state, CUTOFF, SKIN, capacity=10, method=method)
    edges = nl.build(state)
    assert bool(edges.overflow)
    assert int(edges.count) == len(expected)
    assert edges.mask.all()
    assert our_edges(edges) <= expected  # what fits is genuine, nothing made up
    assert nl.required_capacity(state) == len(expected)
    bigger = nl.grown(state)
    assert bigger.capacity >= len(expected)
    edges = bigger.build(state)
    assert not bool(edges.overflow)
    assert our_edges(edges) == expected


def test_bin_overflow_sets_the_flag_and_grows() -> None:
    atoms = structures()["orthorhombic"][0]
    state = State.from_atoms(atoms)
    nl = NeighbourList(state, CUTOFF, SKIN, bin_capacity=1, method="binned")
    assert bool(nl.build(state).overflow)
    bigger = nl.grown(state)
    assert bigger.bin_capacity > 1
    edges = bigger.build(state)
    assert not bool(edges.overflow)
    assert our_edges(edges) == ase_edges(atoms, CUTOFF + SKIN)


def test_overflow_is_sticky_across_updates() -> None:
    atoms, state, nl, edges = skin_setup("binned")
    edges.overflow.fill_(True)
    far = moved(atoms, np.full((len(atoms), 3), 0.7))
    state.positions.copy_(torch.as_tensor(far.positions))
    nl.update(state, edges)  # a clean rebuild must not clear it
    assert bool(edges.overflow)


def test_cell_shrinking_past_the_grid_sets_the_flag() -> None:
    atoms = structures()["orthorhombic"][0]
    state = State.from_atoms(atoms)
    # Room enough for the denser state, so only the grid can be at fault.
    nl = NeighbourList(state, CUTOFF, SKIN, capacity=20000, bin_capacity=80, method="binned")
    edges = nl.build(state)
    assert not bool(edges.overflow)
    shrunk = strained(atoms, 0.8)  # bins of 12 / 3 Å become 3.2 Å, less than cutoff + skin
    state.positions.copy_(torch.as_tensor(shrunk.positions))
    state.cell.copy_(torch.as_tensor(shrunk.cell.array)[None])
    nl.update(state, edges)
    assert bool(edges.overflow)
    edges = nl.grown(state).build(state)
    assert not bool(edges.overflow)
    assert our_edges(edges) == ase_edges(shrunk, CUTOFF + SKIN)


# No host synchronisation: a CPU proxy for what CUDA graph capture would refuse.


def test_the_proxy_catches_host_syncs() -> None:
    values = torch.arange(5.0)
    for sync in (
        lambda: values.sum().item(),
        lambda: bool(values.sum() > 0),
        lambda: values[values > 2],
        lambda: values.nonzero(),
        lambda: torch.bincount(values.long()),
    ):
        with pytest.raises(HostSync), ForbidHostSync():
            sync()


@pytest.mark.parametrize("method", METHODS)
def test_update_and_build_do_not_synchronise(method: str) -> None:
    atoms, state, nl, edges = skin_setup(method)
    shapes = [t.shape for t in (edges.edge_index, edges.unit_shifts, edges.mask)]
    with ForbidHostSync():
        nl.update(state, edges)  # no rebuild
        state.positions[4] += 2.0
        nl.update(state, edges)  # rebuild
        fresh = nl.build(state)
    assert [t.shape for t in (edges.edge_index, edges.unit_shifts, edges.mask)] == shapes
    atoms = atoms.copy()
    atoms.positions[4] += 2.0
    assert our_edges(edges) == our_edges(fresh) == ase_edges(atoms, CUTOFF + 1.0)


# On the GPU: capture in a CUDA graph, and the size the issue asks for.

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("method", METHODS)
def test_update_captures_in_a_cuda_graph(method: str) -> None:
    atoms = structures()["triclinic"][0]
    state = State.from_atoms(atoms, device="cuda")
    nl = NeighbourList(state, CUTOFF, 1.0, method=method)
    edges = nl.build(state)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        nl.update(state, edges)  # warm-up outside the capture, as CUDA graphs require
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        nl.update(state, edges)
    rng = np.random.default_rng(5)
    for scale in (0.1, 0.3, 0.3, 1.5, 0.2):  # some steps stay in the skin, some rebuild
        atoms = moved(atoms, rng.normal(scale=scale, size=(len(atoms), 3)))
        state.positions.copy_(torch.as_tensor(atoms.positions, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        host = Edges(*(v.cpu() if torch.is_tensor(v) else v for v in vars(edges).values()))
        assert_complete(host, atoms, state.to("cpu"))
    assert not bool(edges.overflow)


@pytest.mark.gpu
@needs_cuda
def test_32768_atoms_fit_on_the_gpu() -> None:
    rng = np.random.default_rng(2)
    side = (32768 / 0.1) ** (1 / 3)  # liquid-like density, 0.1 atoms per Å^3
    atoms = random_atoms(rng, 32768, [side, side, side])
    state = State.from_atoms(atoms, device="cuda")
    torch.cuda.reset_peak_memory_stats()
    nl = NeighbourList(state, 5.0, SKIN)
    edges = nl.build(state)
    nl.update(state, edges)
    torch.cuda.synchronize()
    assert nl.method == "binned"
    assert torch.cuda.max_memory_allocated() < 8 * 2**30
    assert not bool(edges.overflow)
    assert int(edges.count) == len(neighbor_list("i", atoms, 5.0 + SKIN))


# The model's edges: the pairs within the cutoff, compacted.


def test_cutoff_edges_equal_ase_within_the_cutoff_after_moves() -> None:
    atoms, state, nl, edges = skin_setup("binned")
    rng = np.random.default_rng(5)
    atoms = moved(atoms, rng.uniform(-0.3, 0.3, size=(len(atoms), 3)))  # inside the skin
    state.positions.copy_(torch.as_tensor(atoms.positions))
    edges = nl.update(state, edges)
    model_edges = nl.cutoff_edges(state, edges)
    expected = ase_edges(atoms, CUTOFF)
    assert our_edges(model_edges) == expected
    assert int(model_edges.count) == len(expected)
    check_mirrored(model_edges)
    assert model_edges.capacity == nl.cutoff_capacity < edges.capacity
    assert not bool(edges.overflow)


def check_mirrored(edges: Edges) -> None:
    """Each half padded like a list of its own; the second half is the first reversed."""
    assert edges.mirrored and edges.capacity % 2 == 0
    half = edges.capacity // 2
    pairs = int(edges.count) // 2
    first, second = (
        Edges(
            edges.edge_index[:, part],
            edges.unit_shifts[part],
            edges.mask[part],
            torch.tensor(pairs),
            edges.overflow,
        )
        for part in (slice(0, half), slice(half, None))
    )
    check_padding(first)
    check_padding(second)
    assert torch.equal(second.edge_index, first.edge_index.flip(0))
    assert torch.equal(second.unit_shifts, -first.unit_shifts)
    assert torch.equal(second.mask, first.mask)


@pytest.mark.parametrize("name", ["triclinic", "one_atom_small_cell", "two_atoms_skewed_cell",
                                  "molecule_zero_cell", "slab", "wire"])  # fmt: skip
def test_cutoff_edges_hold_each_pair_once_per_half(name: str) -> None:
    # Small cells give an atom pairs with its own images: each must appear once per half.
    atoms, cutoff = structures()[name]
    state = State.from_atoms(atoms)
    nl = NeighbourList(state, cutoff, SKIN)
    model_edges = nl.cutoff_edges(state, nl.build(state))
    check_mirrored(model_edges)
    half = model_edges.capacity // 2
    first = {
        (s, r, *shift)
        for (s, r), shift, real in zip(
            model_edges.edge_index[:, :half].T.tolist(),
            model_edges.unit_shifts[:half].long().tolist(),
            model_edges.mask[:half].tolist(),
            strict=True,
        )
        if real
    }
    reversed_first = {(r, s, *(-x for x in shift)) for s, r, *shift in first}
    assert not first & reversed_first  # never both directions of a pair in one half
    assert first | reversed_first == ase_edges(atoms, cutoff) == our_edges(model_edges)


def test_cutoff_capacity_is_the_first_count_with_headroom() -> None:
    atoms = structures()["orthorhombic"][0]
    state = State.from_atoms(atoms)
    nl = NeighbourList(state, CUTOFF, SKIN, cutoff_headroom=1.0)
    within = len(ase_edges(atoms, CUTOFF))
    assert nl.required_cutoff_capacity(state) == within
    assert nl.cutoff_capacity == within + 8


def test_cutoff_overflow_sets_the_list_flag_and_grows() -> None:
    atoms = structures()["orthorhombic"][0]
    state = State.from_atoms(atoms)
    nl = NeighbourList(state, CUTOFF, SKIN, cutoff_capacity=5)
    edges = nl.build(state)
    assert not bool(edges.overflow)  # the list itself has room
    model_edges = nl.cutoff_edges(state, edges)
    assert bool(edges.overflow) and model_edges.overflow is edges.overflow
    expected = ase_edges(atoms, CUTOFF)
    assert int(model_edges.count) == len(expected)
    assert our_edges(model_edges) <= expected  # what fits is genuine
    bigger = nl.grown(state)
    assert bigger.cutoff_capacity >= len(expected)
    edges = bigger.build(state)
    assert our_edges(bigger.cutoff_edges(state, edges)) == expected
    assert not bool(edges.overflow)


def test_cutoff_edges_do_not_synchronise() -> None:
    _, state, nl, edges = skin_setup("dense")
    with ForbidHostSync():
        model_edges = nl.cutoff_edges(state, edges)
    assert model_edges.edge_index.shape == (2, nl.cutoff_capacity)
