"""The checks every structure passes before a run: close atoms found in memory that grows with
the atoms, whatever the size of the cell (dynamics/checks.py)."""

from __future__ import annotations

import ase
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


def test_the_pairwise_search_finds_what_ase_finds(monkeypatch):
    """The same pairs and distances as ASE's list, in a skewed periodic cell."""
    rng = np.random.default_rng(3)
    cell = np.array([[9.0, 0.0, 0.0], [3.0, 8.0, 0.0], [1.0, 2.0, 10.0]])
    atoms = ase.Atoms("Cu40", cell=cell, pbc=True, scaled_positions=rng.random((40, 3)))
    expected = _sorted_pairs(*neighbor_list("ijd", atoms, 2.5))
    monkeypatch.setattr(checks, "MOST_ASE_BINS_PER_ATOM", -100)  # every cell counts as sparse
    monkeypatch.setattr(checks, "PAIRS_PER_PIECE", 100)  # several pieces

    def refused(*arguments):
        raise AssertionError("ASE's list was used")

    monkeypatch.setattr(checks, "neighbor_list", refused)
    found = _sorted_pairs(*checks._close_pairs(atoms, 2.5))
    assert len(expected[0]) > 0
    for ours, theirs in zip(found, expected, strict=True):
        np.testing.assert_allclose(ours, theirs, atol=1e-12)


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
