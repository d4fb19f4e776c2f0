"""``fm.calculator``: FastMACE's potential as an ASE calculator, against mace-torch's own pipeline.

Tolerances: a float64 model must agree with mace-torch (``models.reference.evaluate``) to 100
machine epsilons of the quantity's scale (energy: max(|E|, number of atoms) eV; forces:
max(|F|, 1 eV/Å); stress: max(|stress|, 0.01 eV/Å³)), as in test_potential.py: the same
arithmetic in another order. A float32 conversion is compared with its float64 checkpoint to
1000 float32 epsilons of the same scales (``backends.rounding_tolerances``). Structures are
small (13 to 32 atoms) so the file runs in well under a minute on two CPU cores.
"""

from __future__ import annotations

import ase
import numpy as np
import pytest
import torch
from ase.build import bulk
from ase.calculators.calculator import PropertyNotImplementedError
from ase.cluster import Icosahedron
from ase.md.verlet import VelocityVerlet
from ase.optimize import BFGS
from ase.stress import voigt_6_to_full_3x3_stress

import fastmace as fm
from fastmace.ase import FastMACECalculator, calculator
from fastmace.dynamics.checks import StructureError
from fastmace.models.load import LoadedModel
from fastmace.models.reference import check_structure, evaluate


@pytest.fixture(scope="module")
def demo() -> LoadedModel:
    return fm.load("demo-emt-cu")


def copper() -> ase.Atoms:
    """Rattled fcc Cu, 2x2x2 cubic cells: 32 atoms."""
    atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 2, 2))
    atoms.rattle(stdev=0.05, seed=1)
    return atoms


def copper_cluster() -> ase.Atoms:
    """A rattled 13-atom Cu icosahedron without a cell."""
    atoms = Icosahedron("Cu", 2)
    atoms.rattle(stdev=0.05, seed=2)
    return atoms


def tolerance(dtype: torch.dtype, scale: float, epsilons: float = 100) -> float:
    return epsilons * torch.finfo(dtype).eps * scale


def assert_matches_reference(
    atoms: ase.Atoms, reference: torch.nn.Module, dtype: torch.dtype, epsilons: float = 100
) -> None:
    """``atoms.calc``'s energy, forces and stress equal mace-torch's for ``reference``."""
    expected = evaluate(reference, atoms)
    energy = atoms.get_potential_energy()
    assert isinstance(energy, float)
    assert abs(energy - expected.energy) <= tolerance(
        dtype, max(abs(expected.energy), len(atoms)), epsilons
    ), (energy, expected.energy)
    assert atoms.calc.get_property("free_energy", atoms) == energy
    forces = atoms.get_forces()
    assert forces.shape == (len(atoms), 3) and forces.dtype == np.float64
    scale = max(np.abs(expected.forces).max(), 1.0)
    np.testing.assert_allclose(
        forces, expected.forces, rtol=0, atol=tolerance(dtype, scale, epsilons)
    )
    if expected.stress is None:
        with pytest.raises(PropertyNotImplementedError):
            atoms.get_stress()
        return
    stress = atoms.get_stress()
    assert stress.shape == (6,)
    scale = max(np.abs(expected.stress).max(), 0.01)
    np.testing.assert_allclose(
        voigt_6_to_full_3x3_stress(stress),
        expected.stress,
        rtol=0,
        atol=tolerance(dtype, scale, epsilons),
    )


# --- Agreement with mace-torch --------------------------------------------------------------------


@pytest.mark.parametrize("make", [copper, copper_cluster], ids=["periodic", "cluster"])
def test_demo_model_matches_mace(demo, make):
    atoms = make()
    atoms.calc = FastMACECalculator(demo)
    assert_matches_reference(atoms, demo.reference, torch.float64)


@pytest.mark.parametrize("skin", [0.0, 0.4], ids=["no-skin", "skin"])
def test_moves_small_and_large_reuse_or_regrow_the_list_and_stay_exact(demo, skin):
    atoms = copper()
    calc = FastMACECalculator(demo, skin_A=skin)
    atoms.calc = calc
    assert_matches_reference(atoms, demo.reference, torch.float64)
    planned = calc.neighbour_list
    built_at = planned.reference()[0].clone()

    # A small move keeps the plan; within half the skin it does not even search again.
    atoms.positions += np.random.default_rng(3).uniform(-0.05, 0.05, (len(atoms), 3))
    assert_matches_reference(atoms, demo.reference, torch.float64)
    assert calc.neighbour_list is planned
    searched_again = not torch.equal(planned.reference()[0], built_at)
    assert searched_again == (skin == 0.0)

    # Compressed by 10 %: more edges than the list holds and a cell smaller than it was
    # planned for, so the overflow makes a new, larger list.
    atoms.set_cell(atoms.cell * 0.9, scale_atoms=True)
    assert_matches_reference(atoms, demo.reference, torch.float64)
    assert calc.neighbour_list is not planned
    assert calc.neighbour_list.capacity > planned.capacity

    # Other atoms (one removed): a list planned for them.
    grown = calc.neighbour_list
    del atoms[5]
    assert_matches_reference(atoms, demo.reference, torch.float64)
    assert calc.neighbour_list is not grown


def test_tiny_template_in_float32_matches_its_float64_checkpoint():
    calc = calculator("template:tiny", dtype="float32")
    assert calc.loaded.dtype == "float32"
    assert next(calc.loaded.reference.parameters()).dtype == torch.float64
    atoms = check_structure((1, 6, 8, 29), seed=0)  # 12 atoms of H, C, O in a periodic cell
    atoms.calc = calc
    assert_matches_reference(atoms, calc.loaded.reference, torch.float32, epsilons=1000)


# --- ASE's dynamics -------------------------------------------------------------------------------


def test_velocity_verlet_conserves_energy(demo):
    atoms = copper()
    atoms.calc = FastMACECalculator(demo)
    # Maxwell-Boltzmann momenta at 300 K, drawn here: ASE's helper changed name across releases.
    thermal = np.sqrt(atoms.get_masses() * 300 * ase.units.kB)[:, None]
    atoms.set_momenta(np.random.default_rng(0).normal(size=(len(atoms), 3)) * thermal)
    start = atoms.get_total_energy()
    start_positions = atoms.get_positions()
    VelocityVerlet(atoms, timestep=2 * ase.units.fs).run(10)
    assert np.abs(atoms.get_positions() - start_positions).max() > 0.02
    # This 20 fs run drifts by 5e-6 eV per atom; forces 1.5 times too large give 4e-4.
    assert abs(atoms.get_total_energy() - start) < 1e-4 * len(atoms)


def test_bfgs_lowers_the_energy_of_a_cluster(demo):
    atoms = copper_cluster()
    atoms.calc = FastMACECalculator(demo)
    start = atoms.get_potential_energy()
    BFGS(atoms, logfile=None).run(fmax=0.01, steps=4)
    assert atoms.get_potential_energy() < start - 1e-3


# --- Construction and errors ----------------------------------------------------------------------


def test_calculator_loads_a_label(demo):
    calc = calculator("demo-emt-cu")
    assert isinstance(calc, FastMACECalculator)
    assert calc.loaded.name == "demo-emt-cu" and calc.loaded.device == "cpu"
    atoms = bulk("Cu", "fcc", a=3.61)
    atoms.calc = calc
    energy = atoms.get_potential_energy()
    assert abs(energy - evaluate(demo.reference, atoms).energy) <= 1e-12


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"dtype": "float32"}, "dtype='float32' cannot apply to a model that is already loaded"),
        ({"head": "other"}, "head='other'"),
        ({"trusted": True}, "trusted=True"),
    ],
)
def test_options_that_contradict_a_loaded_model_are_refused(demo, options, message):
    FastMACECalculator(demo, head=demo.head, device="cpu", dtype="float64", backend="e3nn")
    with pytest.raises(ValueError, match=message):
        FastMACECalculator(demo, **options)


@pytest.mark.parametrize(
    ("atoms", "message"),
    [
        (bulk("Fe", "bcc", a=2.87), r"contains Fe, which the model does not cover.*: Cu"),
        (ase.Atoms("Cu2", positions=[[0, 0, 0], [0.2, 0, 0]]), r"only 0.200 Å apart"),
        (ase.Atoms("Cu2", positions=[[0, 0, 0], [np.nan, 0, 0]]), r"non-finite positions"),
    ],
    ids=["unsupported-element", "overlap", "nan"],
)
def test_bad_structures_are_refused_with_a_clear_error(demo, atoms, message):
    atoms.calc = FastMACECalculator(demo)
    with pytest.raises(StructureError, match=message):
        atoms.get_potential_energy()
