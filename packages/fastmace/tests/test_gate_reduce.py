"""The structure the gate checks for large runs: the unit cell, an exact periodic sub-cell, or
a cluster; checked with ASE's EMT calculator as an independent judge of "the same environment"."""

from __future__ import annotations

import json

import ase.build
import numpy as np
from ase.calculators.emt import EMT
from ase.neighborlist import neighbor_list

import fastmace as fm
from fastmace.gate import reduce, reduced_structure


def rattled_unit(seed: int = 1) -> ase.Atoms:
    unit = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat((1, 2, 1))
    unit.rattle(0.05, seed=seed)
    return unit


def emt_forces(atoms: ase.Atoms) -> np.ndarray:
    atoms = atoms.copy()
    atoms.calc = EMT()
    return atoms.get_forces()


def test_small_structures_are_checked_whole():
    atoms = rattled_unit().repeat(2)
    checked = reduced_structure(atoms, max_atoms=len(atoms))
    assert checked.atoms is atoms and "the run's structure" in checked.description


def test_the_cell_before_repeat_is_used_when_known():
    unit = rattled_unit()
    checked = reduced_structure(unit.repeat(3), unit, max_atoms=20)
    assert checked.atoms is unit and "before repeat" in checked.description


def test_an_exact_supercell_from_a_file_is_reduced_to_a_periodic_sub_cell():
    unit = rattled_unit()  # 8 atoms, no symmetry left inside it
    atoms = unit.repeat((4, 2, 3))  # 192 atoms, as if read from a file: no unit known
    rng = np.random.default_rng(0)
    atoms = atoms[rng.permutation(len(atoms))]  # any atom order
    checked = reduced_structure(atoms, max_atoms=50)
    part = checked.atoms
    # The largest repeat within 50 atoms: 48 atoms, a sixth of the structure, still periodic.
    assert len(part) == 48 and part.pbc.all()
    assert "periodic sub-cell (48 atoms)" in checked.description
    assert np.isclose(part.get_volume() * 4, atoms.get_volume())
    # Every atom of the sub-cell feels what it feels in the whole structure (EMT, periodic).
    whole = emt_forces(atoms)
    mine = emt_forces(part)
    positions = atoms.positions
    for index, position in enumerate(part.positions):
        match = int(np.argmin(np.linalg.norm(positions - position, axis=1)))
        np.testing.assert_allclose(mine[index], whole[match], atol=1e-10)


def test_a_disordered_structure_becomes_a_cluster_of_the_nearest_atoms():
    atoms = rattled_unit().repeat((3, 3, 3))
    atoms.rattle(0.05, seed=9)  # no exact repeat any more
    checked = reduced_structure(atoms, max_atoms=60)
    cluster = checked.atoms
    assert len(cluster) == 60 and not cluster.pbc.any()
    assert "cluster of the 60 atoms" in checked.description
    assert "stress not compared" in checked.description
    # Geometry kept: the central atom's neighbours within 3 Å are those of the structure.
    centre = int(checked.description.split("nearest atom ")[1].split(" ")[0])
    i, d = neighbor_list("id", atoms, 3.0)
    j, e = neighbor_list("id", cluster, 3.0)
    first = int(np.argmin(np.linalg.norm(cluster.positions - atoms.positions[centre], axis=1)))
    np.testing.assert_allclose(np.sort(d[i == centre]), np.sort(e[j == first]), atol=1e-12)
    # No two atoms closer than in the structure (no overlapping images).
    distances = cluster.get_all_distances()
    np.fill_diagonal(distances, np.inf)
    assert distances.min() >= d.min() - 1e-9


def test_fm_md_gates_a_large_structure_on_its_sub_cell(cache, tmp_path, monkeypatch):
    monkeypatch.setattr(reduce, "MAX_GATE_ATOMS", 16)
    path = tmp_path / "big.extxyz"
    rattled_unit().repeat((2, 2, 1)).write(path)  # 32 atoms from a file: no unit known
    fm.md(
        path, model="demo-emt-cu", temperature_K=300.0, steps=5, timestep_fs=2.0,
        block_steps=5, check="gate", output=tmp_path / "run",
    )  # fmt: skip
    gate = json.loads((tmp_path / "run" / "metadata.json").read_text())["gate"]
    assert gate["passed"] and gate["atoms"] == 16
    assert gate["structure"].startswith("a periodic sub-cell (16 atoms)")
    assert gate["stress_eV_per_A3"] is not None
