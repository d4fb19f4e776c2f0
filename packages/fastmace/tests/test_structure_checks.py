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
