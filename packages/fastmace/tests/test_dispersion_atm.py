"""D3's three-body (ATM) term against torch-dftd (``abc=True``) on a molecule, a slab and a
bulk cell; batching, padding, the slots' overflow, no host sync, and in the engine.

Tolerance: 1e-6 relative to the quantity's largest entry (the issue's bound), float64.
Cutoffs: the molecule at the defaults (40 bohr, all its triples); the slab and the bulk cell at
10 Å (pair and triple cutoff alike, in both codes), because torch-dftd enumerates triples in a
Python loop (about 10^6 per atom in a solid at 40 bohr). The slab's forces and stress are
checked against central differences of torch-dftd's energy: its own forces there are not the
gradient of its energy (docs/validation/dispersion.md, "Three-body term").
"""

from __future__ import annotations

import warnings

import ase
import numpy as np
import pytest
import torch
from ase.cluster import Icosahedron
from d3_structures import structures
from helpers.comparison import relative_error
from helpers.host_sync import ForbidHostSync

from fastmace.dynamics.dispersion import D3BJ, DEFAULT_CUTOFF_A, D3BJParameters
from fastmace.dynamics.neighbours import NeighbourList
from fastmace.dynamics.potential import pad_edges
from fastmace.dynamics.state import PotentialOutput, State

torch_dftd = pytest.importorskip("torch_dftd.torch_dftd3_calculator")
pytestmark = pytest.mark.filterwarnings("ignore:Creating a tensor from a list of numpy")

RELATIVE = 1e-6
SOLID_CUTOFF_A = 10.0  # pair and triple cutoff of the slab and bulk checks (see above)
STEP_A = 1e-5  # central differences of torch-dftd's energy (float64: ~1e-9 relative)


def cutoff_of(name: str) -> float:
    return DEFAULT_CUTOFF_A if name == "molecule" else SOLID_CUTOFF_A


def reference_calculator(cutoff: float, abc: bool = True) -> torch_dftd.TorchDFTD3Calculator:
    return torch_dftd.TorchDFTD3Calculator(
        damping="bj", xc="pbe", cutoff=cutoff, cnthr=cutoff, abc=abc, dtype=torch.float64
    )


def reference(atoms: ase.Atoms, cutoff: float) -> tuple[float, np.ndarray, np.ndarray | None]:
    """torch-dftd's energy, forces and (for a cell) stress, three-body term included."""
    atoms = atoms.copy()
    atoms.calc = reference_calculator(cutoff)
    stress = atoms.get_stress(voigt=False) if atoms.pbc.any() else None
    return atoms.get_potential_energy(), atoms.get_forces(), stress


def reference_energy(atoms: ase.Atoms, cutoff: float) -> float:
    atoms = atoms.copy()
    atoms.calc = reference_calculator(cutoff)
    return atoms.get_potential_energy()


def ours(
    structures: list[ase.Atoms], cutoff: float, skin: float = 0.0, padding: int = 0
) -> PotentialOutput:
    state = State.from_atoms(structures)
    edges = pad_edges(NeighbourList(state, cutoff, skin=skin).build(state), padding)
    d3 = D3BJ(D3BJParameters.for_functional("pbe"), state.atomic_numbers.tolist(),
              cutoff=cutoff, cn_cutoff=cutoff, three_body=True)  # fmt: skip
    d3.size_triples(edges)
    return d3(state, edges, compute_stress=True)


@pytest.fixture(scope="module")
def cases() -> dict[str, ase.Atoms]:
    return structures()


@pytest.mark.parametrize("name", ["molecule", "bulk"])
def test_matches_torch_dftd(cases, name: str) -> None:
    atoms, cutoff = cases[name], cutoff_of(name)
    energy, forces, stress = reference(atoms, cutoff)
    out = ours([atoms], cutoff)
    assert relative_error(out.energy, np.array([energy])) < RELATIVE
    assert relative_error(out.forces, forces) < RELATIVE
    if stress is not None:
        assert relative_error(out.stress[0], stress) < RELATIVE


def test_the_three_body_term_is_there(cases) -> None:
    """The checks above would not see a missing term: it is 10^-4 to 10^-2 of the total."""
    atoms = cases["bulk"]
    plain = atoms.copy()
    plain.calc = reference_calculator(SOLID_CUTOFF_A, abc=False)
    three_body = float(ours([atoms], SOLID_CUTOFF_A).energy[0]) - plain.get_potential_energy()
    assert abs(three_body) > 1e-3  # eV, against ~0.37 eV of two-body energy


def test_slab_matches_torch_dftd_energy_and_its_derivatives(cases) -> None:
    atoms = cases["slab"]
    out = ours([atoms], SOLID_CUTOFF_A)
    energy = reference_energy(atoms, SOLID_CUTOFF_A)
    assert relative_error(out.energy, np.array([energy])) < RELATIVE
    # Forces on the adsorbate and the top layer (where the three-body forces are largest).
    forces = out.forces.numpy()
    for atom in (7, 10):
        for axis in range(3):
            moved = []
            for step in (STEP_A, -STEP_A):
                displaced = atoms.copy()
                displaced.positions[atom, axis] += step
                moved.append(reference_energy(displaced, SOLID_CUTOFF_A))
            want = -(moved[0] - moved[1]) / (2 * STEP_A)
            assert abs(forces[atom, axis] - want) < RELATIVE * np.abs(forces).max()
    stress = out.stress[0].numpy()
    volume = atoms.get_volume()
    for a, b in ((0, 0), (1, 1), (2, 2), (0, 1), (1, 2), (0, 2)):
        strained = []
        for step in (STEP_A, -STEP_A):
            deformation = np.eye(3)
            deformation[a, b] += step / 2
            deformation[b, a] += step / 2
            deformed = atoms.copy()
            deformed.set_cell(atoms.cell @ deformation, scale_atoms=True)
            strained.append(reference_energy(deformed, SOLID_CUTOFF_A))
        want = (strained[0] - strained[1]) / (2 * STEP_A) / volume
        assert abs(stress[a, b] - want) < RELATIVE * np.abs(stress).max()


def test_batch_gives_each_system_its_own_result(cases) -> None:
    names = ["molecule", "slab", "bulk"]
    batch = ours([cases[name] for name in names], SOLID_CUTOFF_A)
    state = State.from_atoms([cases[name] for name in names])
    for index, name in enumerate(names):
        alone = ours([cases[name]], SOLID_CUTOFF_A)
        rows = state.system == index
        torch.testing.assert_close(batch.energy[index : index + 1], alone.energy, rtol=1e-12,
                                   atol=0)  # fmt: skip
        torch.testing.assert_close(batch.forces[rows], alone.forces, rtol=1e-10, atol=1e-15)
        torch.testing.assert_close(batch.stress[index], alone.stress[0], rtol=1e-10, atol=1e-15)


def test_padding_and_pairs_beyond_the_cutoff_contribute_nothing(cases) -> None:
    atoms = cases["slab"]
    plain = ours([atoms], SOLID_CUTOFF_A)
    padded = ours([atoms], SOLID_CUTOFF_A, skin=1.0, padding=50)
    for name in ("energy", "forces", "stress"):
        torch.testing.assert_close(getattr(padded, name), getattr(plain, name), rtol=1e-12,
                                   atol=1e-16)  # fmt: skip


def test_too_few_slots_set_the_overflow_flag(cases) -> None:
    state = State.from_atoms([cases["bulk"]])
    edges = NeighbourList(state, SOLID_CUTOFF_A, skin=0.0).build(state)
    d3 = D3BJ(D3BJParameters.for_functional("pbe"), state.atomic_numbers.tolist(),
              cutoff=SOLID_CUTOFF_A, cn_cutoff=SOLID_CUTOFF_A, three_body=True)  # fmt: skip
    d3.size_triples(edges)
    d3(state, edges)
    assert not bool(edges.overflow)
    d3.slots = 16
    d3(state, edges)
    assert bool(edges.overflow)


def test_the_fused_kernels_are_refused_with_the_three_body_term() -> None:
    from fastmace.dynamics.dispersion import DispersionError

    with pytest.raises(DispersionError, match="two-body term only"):
        D3BJ(D3BJParameters.for_functional("pbe"), [29], three_body=True, kernel="triton")


def test_no_host_synchronisation(cases) -> None:
    state = State.from_atoms([cases["slab"]])
    edges = NeighbourList(state, SOLID_CUTOFF_A, skin=0.5).build(state)
    d3 = D3BJ(D3BJParameters.for_functional("pbe"), state.atomic_numbers.tolist(),
              cutoff=SOLID_CUTOFF_A, cn_cutoff=SOLID_CUTOFF_A, three_body=True)  # fmt: skip
    d3.size_triples(edges)
    with ForbidHostSync():
        d3(state, edges, compute_stress=True)


# --- Through the user-facing option: dispersion="d3bj-atm" -------------------------------------


def test_calculator_with_atm_is_the_model_plus_torch_dftd() -> None:
    """A Cu13 cluster at the default cutoffs: every triple, as torch-dftd counts them."""
    import fastmace as fm

    atoms = Icosahedron("Cu", 2)
    atoms.rattle(0.05, seed=5)
    with_d3 = atoms.copy()
    with_d3.calc = fm.calculator("demo-emt-cu", dispersion="d3bj-atm", dispersion_functional="pbe")
    model_only = atoms.copy()
    model_only.calc = fm.calculator("demo-emt-cu")
    energy, forces, _ = reference(atoms, DEFAULT_CUTOFF_A)
    want = model_only.get_potential_energy() + energy
    assert with_d3.get_potential_energy() == pytest.approx(want, rel=1e-12, abs=1e-10)
    np.testing.assert_allclose(
        with_d3.get_forces(), model_only.get_forces() + forces, rtol=0, atol=1e-10
    )


def test_md_with_atm_runs_and_records_it(tmp_path) -> None:
    """fm.md(dispersion="d3bj-atm") on the demo model, a Cu13 cluster (a solid's ~10^7
    triples per evaluation at 40 bohr take seconds on a CPU): the first potential energy is
    the two-body run's plus the three-body term, a few NVE steps keep the total energy, and
    metadata.json and the report say three-body."""
    import json

    import fastmace as fm

    atoms = Icosahedron("Cu", 2)
    common = {"ensemble": "nve", "dispersion_functional": "pbe", "initial_temperature_K": 300,
              "seed": 1, "thermo_every": 2, "trajectory_every": 0}  # fmt: skip
    two = fm.md(atoms, steps=0, dispersion="d3bj", **common).thermo[0]
    start = fm.md(atoms, steps=0, dispersion="d3bj-atm", **common).thermo[0]
    output = tmp_path / "run"
    end = fm.md(atoms, steps=4, dispersion="d3bj-atm", output=output, **common).thermo[0]
    state = State.from_atoms([atoms])
    edges = NeighbourList(state, DEFAULT_CUTOFF_A, skin=0.0).build(state)
    d3 = D3BJ(D3BJParameters.for_functional("pbe"), [29], three_body=True)
    # (the cluster's 13 atoms are all within the cutoffs of each other)
    d3.size_triples(edges)
    with_atm = float(d3(state, edges).energy[0])
    d3.three_body = False
    added = with_atm - float(d3(state, edges).energy[0])
    assert start["potential_energy_eV"] - two["potential_energy_eV"] == pytest.approx(
        added, rel=1e-8
    )
    assert end["step"] == 4
    assert abs(end["total_energy_eV"] - start["total_energy_eV"]) < 1e-3
    record = json.loads((output / "metadata.json").read_text())["engine"]["dispersion"]
    assert record["three_body"] is True and record["method"] == "d3bj-atm"
    assert record["kernel"].startswith("torch")
    assert "two- and three-body" in (output / "report.txt").read_text()


def test_a_solid_at_the_default_cutoffs_is_warned_about_once() -> None:
    """32 Cu atoms at 40 bohr: minutes per evaluation (docs/validation/dispersion.md); a
    molecule at the same cutoffs is not warned about."""
    import ase.build

    d3 = D3BJ(D3BJParameters.for_functional("pbe"), [29], three_body=True)
    solid = State.from_atoms([ase.build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat(2)])
    edges = NeighbourList(solid, d3.cutoff, skin=0.0).build(solid)
    with pytest.warns(RuntimeWarning, match="use dispersion='d3bj'"):
        d3.size_triples(edges)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        d3.size_triples(edges)  # a regrown list: said once is enough
        cluster = State.from_atoms([Icosahedron("Cu", 2)])
        D3BJ(D3BJParameters.for_functional("pbe"), [29], three_body=True).size_triples(
            NeighbourList(cluster, d3.cutoff, skin=0.0).build(cluster)
        )
