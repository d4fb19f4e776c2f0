"""The checks every structure passes before a run: close atoms found in memory that grows with
the atoms, whatever the size of the cell (dynamics/checks.py)."""

from __future__ import annotations

import ase
import ase.build
import ase.io
import numpy as np
import pytest
from ase.neighborlist import neighbor_list
from conftest import EXAMPLE

from fastmace.dynamics import checks
from fastmace.dynamics.checks import StructureError, check_structures


def _sorted_pairs(first, second, distance):
    order = np.lexsort((second, first))
    return first[order], second[order], distance[order]


def test_a_nearly_empty_cell_of_a_million_angstrom_is_checked_without_binning_it():
    """32 atoms in a cell of 1e6 Å: ASE's list would ask for 1e16 bins (tens of GB)."""
    atoms = ase.io.read(EXAMPLE)
    atoms.set_cell([1e6, 1e6, 1e6], scale_atoms=False)
    check_structures([atoms], model_species=None)  # returns: no atoms closer than 0.5 Å
    # Two atoms 0.3 Å apart across the periodic boundary are found, as the nearest image.
    atoms.positions[1] = [1e6 - 0.1, 0.0, 0.2]
    atoms.positions[0] = [0.0, 0.0, 0.0]
    with pytest.raises(StructureError, match=r"atoms 0 and 1 only 0.224 Å apart"):
        check_structures([atoms], model_species=None)


def _binned_pairs(monkeypatch, atoms: ase.Atoms, cutoff: float):
    """The cell list's pairs (sorted), with ASE's list refused so that it cannot stand in."""

    def refused(*arguments):
        raise AssertionError("ASE's list was used")

    with monkeypatch.context() as patched:
        patched.setattr(checks, "neighbor_list", refused)
        return _sorted_pairs(*checks._close_pairs(atoms, cutoff))


def _assert_same_pairs(found, expected, atol: float = 1e-9) -> None:
    assert len(found[0]) == len(expected[0])
    np.testing.assert_array_equal(found[0], expected[0])
    np.testing.assert_array_equal(found[1], expected[1])
    np.testing.assert_allclose(found[2], expected[2], rtol=0, atol=atol)


def test_the_cell_list_finds_ases_close_pairs_in_a_rattled_dense_cell(monkeypatch):
    """Copper rattled hard enough for atoms to overlap, measured in pieces of a few pairs."""
    atoms = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat(6)
    atoms.rattle(stdev=0.8, seed=0)
    expected = _sorted_pairs(*neighbor_list("ijd", atoms, 0.5))
    assert len(expected[0]) >= 10  # several close pairs, both orders
    monkeypatch.setattr(checks, "PAIRS_PER_PIECE", 3)  # several pieces for every offset
    _assert_same_pairs(_binned_pairs(monkeypatch, atoms, 0.5), expected)


def test_the_cell_list_finds_ases_close_pairs_in_a_sheared_cell(monkeypatch):
    """A triclinic cell, with atoms outside it (scaled positions from -0.5 to 1.5)."""
    rng = np.random.default_rng(3)
    cell = np.array([[12.0, 0.0, 0.0], [5.0, 11.0, 0.0], [-4.0, 3.0, 10.0]])
    scaled = rng.uniform(-0.5, 1.5, (300, 3))
    atoms = ase.Atoms("Cu300", cell=cell, pbc=True, positions=scaled @ cell)
    expected = _sorted_pairs(*neighbor_list("ijd", atoms, 1.2))
    assert len(expected[0]) >= 100
    monkeypatch.setattr(checks, "PAIRS_PER_PIECE", 100)
    _assert_same_pairs(_binned_pairs(monkeypatch, atoms, 1.2), expected)


def test_the_cell_list_counts_each_pair_once_with_two_or_three_bins_along_an_axis(monkeypatch):
    """Along an axis of two bins the bins either side are the same one; of three, each
    neighbour is another bin. Every pair is found once, across each periodic boundary."""
    rng = np.random.default_rng(5)
    cell = np.diag([2.5, 3.4, 7.5])
    atoms = ase.Atoms("H80", cell=cell, pbc=True, scaled_positions=rng.random((80, 3)))
    heights = checks._cell_heights(cell)
    np.testing.assert_array_equal(checks._bins_per_axis(heights, 1.0), [2, 3, 7])
    expected = _sorted_pairs(*neighbor_list("ijd", atoms, 1.0))
    assert len(expected[0]) >= 100
    _assert_same_pairs(_binned_pairs(monkeypatch, atoms, 1.0), expected)


def test_the_cell_list_finds_the_close_pairs_of_a_cluster_in_a_mostly_empty_cell(monkeypatch):
    """1000 atoms at a corner of a cell of 1e8 Å (across its periodic boundaries): only the
    occupied bins are kept, and the bins per axis are capped (2e8 of them would overflow the
    flat ids). ASE's list of the same cluster moved to the middle of the cell, without
    periodicity, is the reference; positions near 1e8 Å are exact to about 1e-8 Å."""
    rng = np.random.default_rng(7)
    side = 1e8
    corner = rng.uniform(-6.0, 6.0, (1000, 3)) % side
    atoms = ase.Atoms("H1000", cell=[side] * 3, pbc=True, positions=corner)
    middle = ase.Atoms("H1000", positions=(corner + side / 2) % side)
    expected = _sorted_pairs(*neighbor_list("ijd", middle, 0.5))
    assert len(expected[0]) >= 100
    _assert_same_pairs(_binned_pairs(monkeypatch, atoms, 0.5), expected, atol=1e-6)


def test_the_cell_list_finds_nothing_below_the_closest_pair_and_it_just_above(monkeypatch):
    """Rattled rock salt: no pair below its shortest distance (no atom with itself, no wrong
    image), then that pair alone (both orders) a hair above it."""
    atoms = ase.build.bulk("NaCl", "rocksalt", a=5.64, cubic=True).repeat(3)
    atoms.rattle(stdev=0.05, seed=0)
    first, second, distance = neighbor_list("ijd", atoms, 3.0)
    shortest = distance.min()
    empty = _binned_pairs(monkeypatch, atoms, shortest - 1e-6)
    assert all(len(part) == 0 for part in empty)
    found = _binned_pairs(monkeypatch, atoms, shortest + 1e-6)
    closest = distance == shortest
    _assert_same_pairs(found, _sorted_pairs(first[closest], second[closest], distance[closest]))


def test_thin_and_open_cells_keep_ases_list():
    """Below twice the cutoff's height a pair is close through several images, which the cell
    list does not look for; a direction without periodicity has no cell to bin."""
    rng = np.random.default_rng(11)
    thin = ase.Atoms("H20", cell=[6.0, 6.0, 0.8], pbc=True, scaled_positions=rng.random((20, 3)))
    found = _sorted_pairs(*checks._close_pairs(thin, 1.0))
    _assert_same_pairs(found, _sorted_pairs(*neighbor_list("ijd", thin, 1.0)))
    assert (found[0] == found[1]).any()  # an atom close to its own image: only ASE's list has it
    slab = thin.copy()
    slab.pbc = [True, True, False]
    found = _sorted_pairs(*checks._close_pairs(slab, 1.0))
    _assert_same_pairs(found, _sorted_pairs(*neighbor_list("ijd", slab, 1.0)))


def test_a_geometry_found_apart_is_not_searched_again_but_a_changed_one_is(monkeypatch):
    """fm.md's preflight and its Simulation check the same structures: the second close-pair
    search is skipped, but a moved atom, another cell or another periodicity is searched."""
    searched = []
    search = checks._close_pairs

    def counted(atoms, cutoff):
        searched.append(len(atoms))
        return search(atoms, cutoff)

    monkeypatch.setattr(checks, "_close_pairs", counted)
    atoms = ase.io.read(EXAMPLE)
    atoms.positions[0, 0] += 1e-9  # a geometry no other test has checked
    check_structures([atoms], None)
    check_structures([atoms.copy()], None)
    assert len(searched) == 1
    moved = atoms.copy()
    moved.positions[3] = moved.positions[4] + [0.1, 0.0, 0.0]  # now overlapping
    with pytest.raises(StructureError, match=r"only 0\.100 Å apart"):
        check_structures([moved], None)
    with pytest.raises(StructureError, match=r"only 0\.100 Å apart"):  # a failure is not kept
        check_structures([moved], None)
    stretched = atoms.copy()
    stretched.set_cell(atoms.cell * 1.01, scale_atoms=False)
    open_ = atoms.copy()
    open_.pbc = False
    check_structures([stretched, open_], None)
    assert len(searched) == 5
