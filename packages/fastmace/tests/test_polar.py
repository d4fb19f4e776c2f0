"""MACE-POLAR-1's PolarMACE through ``fm.calculator``, against mace-torch's own MACECalculator.

The model is the ``polar-tiny`` template: PolarMACE's shape with random weights, every part of
its long-range model switched on (charges and dipoles, two field widths, two field updates,
the local electron energy). mace-torch's calculator is the reference, run under a float64
default dtype for a float64 model (docs/validation/polar.md says why). Tolerances: 1000
machine epsilons of the quantity's scale (energy: max(|E|, atoms) eV; forces: max(|F|, 1)
eV/Å; stress: max(|stress|, 0.01) eV/Å³), in float64 (2.2e-13: about 1e-13 relative) and float32
alike, as ``backends.rounding_tolerances`` allows two orders of the same arithmetic: the
Ewald-like sums add terms larger than the forces they leave (measured in float64: up to
2.3e-14 eV/Å, docs/validation/polar.md).
"""

from __future__ import annotations

import copy

import ase
import numpy as np
import pytest
import torch
from ase.build import molecule

pytest.importorskip(
    "graph_longrange",
    reason="MACE-POLAR-1 needs graph-longrange: pip install 'fastmace[polar]'",
)

from helpers.polar import copper_oxide, mace_torch_results, methanol

import fastmace as fm
from fastmace.models.load import LoadedModel


@pytest.fixture(scope="module")
def polar64() -> LoadedModel:
    return fm.load("template:polar-tiny", dtype="float64")


def methyl_radical() -> ase.Atoms:
    atoms = molecule("CH3")
    atoms.info["spin"] = 2  # a doublet: spin is the multiplicity 2S + 1, as in mace-torch
    return atoms


def assert_matches(
    atoms: ase.Atoms, loaded: LoadedModel, dtype: torch.dtype, epsilons: float
) -> None:
    # The loaded e3nn module is mace-torch's own PolarMACE in this dtype; a copy, in case
    # mace-torch's calculator changes it.
    energy, forces, stress = mace_torch_results(
        copy.deepcopy(loaded.module), atoms, str(dtype).removeprefix("torch.")
    )
    ours = atoms.copy()
    ours.calc = fm.calculator(loaded)
    eps = epsilons * torch.finfo(dtype).eps
    assert abs(ours.get_potential_energy() - energy) <= eps * max(abs(energy), len(atoms))
    force_scale = max(float(np.abs(forces).max()), 1.0)
    np.testing.assert_allclose(ours.get_forces(), forces, rtol=0, atol=eps * force_scale)
    if stress is not None:
        stress_scale = max(float(np.abs(stress).max()), 0.01)
        np.testing.assert_allclose(
            ours.get_stress(voigt=False), stress, rtol=0, atol=eps * stress_scale
        )


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(methanol, id="open-molecule"),
        pytest.param(copper_oxide, id="periodic-cell"),
        pytest.param(lambda: methanol(charge=1, spin=2), id="cation-doublet"),
        pytest.param(methyl_radical, id="neutral-doublet"),
        pytest.param(lambda: copper_oxide(charge=1), id="charged-periodic-cell"),
    ],
)
def test_float64_matches_mace_torch(polar64: LoadedModel, make) -> None:
    assert_matches(make(), polar64, torch.float64, epsilons=1000)


@pytest.mark.parametrize("make", [methanol, copper_oxide], ids=["open-molecule", "periodic-cell"])
def test_float32_matches_mace_torch_to_float32_rounding(make) -> None:
    loaded = fm.load("template:polar-tiny", dtype="float32")
    assert_matches(make(), loaded, torch.float32, epsilons=1000)


def test_charge_and_spin_change_the_energy_and_are_read_from_info_or_arguments(
    polar64: LoadedModel,
) -> None:
    atoms = methanol()
    atoms.calc = fm.calculator(polar64)
    neutral = atoms.get_potential_energy()
    # ASE compares no info: the calculator must see the new charge and compute again.
    atoms.info.update(charge=1, spin=2)
    cation = atoms.get_potential_energy()
    assert abs(cation - neutral) > 1e-3
    by_arguments = methanol()
    by_arguments.calc = fm.calculator(polar64, charge=1, spin=2)
    assert by_arguments.get_potential_energy() == cation
    # atoms.info wins over the calculator's defaults, as for one structure among many.
    neutral_again = methanol(charge=0, spin=1)
    neutral_again.calc = fm.calculator(polar64, charge=1, spin=2)
    assert neutral_again.get_potential_energy() == neutral


def test_spin_below_one_is_refused(polar64: LoadedModel) -> None:
    with pytest.raises(ValueError, match="multiplicity"):
        fm.calculator(polar64, spin=0)
    atoms = methanol(spin=0)
    atoms.calc = fm.calculator(polar64)
    with pytest.raises(ValueError, match="multiplicity"):
        atoms.get_potential_energy()


def test_charge_for_a_local_model_is_refused() -> None:
    with pytest.raises(ValueError, match="long-range models"):
        fm.calculator("template:tiny", charge=1)


def test_auto_backend_is_e3nn(polar64: LoadedModel) -> None:
    assert polar64.backend == "e3nn"
    assert "PolarMACE" in polar64.backend_reason


# fm.md, fm.relax and fastmace md with a PolarMACE: test_polar_md.py.
