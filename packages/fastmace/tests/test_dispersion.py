"""D3(BJ) dispersion against torch-dftd (what mace-torch's mace_mp(dispersion=True) runs) and
tad-dftd3, on a molecule, a slab and a bulk cell; batching, padding and no host sync.

Tolerance: 1e-6 relative to the quantity's largest entry (the issue's bound) against
torch-dftd, in float64; the measured agreement is ~1e-13 (docs/validation/dispersion.md).
tad-dftd3 keeps its own copy of the reference data and constants, so it agrees to ~1e-6 only
and is checked at 1e-5.
"""

from __future__ import annotations

import ase
import ase.units
import numpy as np
import pytest
import torch
from ase.build import bulk
from d3_structures import structures
from helpers.comparison import relative_error
from helpers.host_sync import ForbidHostSync

from fastmace.dynamics.dispersion import (
    BOHR_A,
    D3BJ,
    DEFAULT_CUTOFF_A,
    HARTREE_EV,
    D3BJParameters,
    DispersionError,
)
from fastmace.dynamics.edges import Edges
from fastmace.dynamics.neighbours import NeighbourList
from fastmace.dynamics.potential import pad_edges
from fastmace.dynamics.state import PotentialOutput, State

torch_dftd = pytest.importorskip("torch_dftd.torch_dftd3_calculator")

RELATIVE = 1e-6
# torch-dftd's calculator builds its cell tensor from a list of arrays; harmless here.
pytestmark = pytest.mark.filterwarnings("ignore:Creating a tensor from a list of numpy")


def reference(atoms: ase.Atoms) -> tuple[float, np.ndarray, np.ndarray | None]:
    """torch-dftd's energy, forces and (for a cell) stress with mace-torch's settings."""
    calculator = torch_dftd.TorchDFTD3Calculator(
        damping="bj", xc="pbe", cutoff=40.0 * ase.units.Bohr, dtype=torch.float64
    )
    atoms = atoms.copy()
    atoms.calc = calculator
    stress = atoms.get_stress(voigt=False) if atoms.pbc.any() else None
    return atoms.get_potential_energy(), atoms.get_forces(), stress


def ours(structures: list[ase.Atoms], skin: float = 0.0, padding: int = 0) -> PotentialOutput:
    state = State.from_atoms(structures)
    edges = NeighbourList(state, DEFAULT_CUTOFF_A, skin=skin).build(state)
    d3 = D3BJ(D3BJParameters.for_functional("pbe"), state.atomic_numbers.tolist())
    return d3(state, pad_edges(edges, padding), compute_stress=True)


@pytest.fixture(scope="module")
def cases() -> dict[str, tuple[ase.Atoms, tuple[float, np.ndarray, np.ndarray | None]]]:
    return {name: (atoms, reference(atoms)) for name, atoms in structures().items()}


@pytest.mark.parametrize("name", ["molecule", "slab", "bulk"])
def test_matches_torch_dftd(cases, name: str) -> None:
    atoms, (energy, forces, stress) = cases[name]
    out = ours([atoms])
    assert relative_error(out.energy, np.array([energy])) < RELATIVE
    assert relative_error(out.forces, forces) < RELATIVE
    if stress is None:
        assert torch.all(out.stress == 0)  # no cell, no volume: zero, as for the model
    else:
        assert relative_error(out.stress[0], stress) < RELATIVE


def test_batch_gives_each_system_its_own_result(cases) -> None:
    names = ["molecule", "slab", "bulk"]
    batch = ours([cases[name][0] for name in names])
    state = State.from_atoms([cases[name][0] for name in names])
    for index, name in enumerate(names):
        alone = ours([cases[name][0]])
        rows = state.system == index
        torch.testing.assert_close(
            batch.energy[index : index + 1], alone.energy, rtol=1e-12, atol=0
        )
        torch.testing.assert_close(batch.forces[rows], alone.forces, rtol=1e-10, atol=1e-15)
        torch.testing.assert_close(batch.stress[index], alone.stress[0], rtol=1e-10, atol=1e-15)


def test_padding_and_pairs_beyond_the_cutoff_contribute_nothing(cases) -> None:
    atoms = cases["bulk"][0]
    plain = ours([atoms])
    # A skin adds real pairs beyond the cutoff; padding adds masked slots (atom 0 to itself).
    padded = ours([atoms], skin=1.0, padding=100)
    for name in ("energy", "forces", "stress"):
        torch.testing.assert_close(getattr(padded, name), getattr(plain, name), rtol=1e-12,
                                   atol=1e-16)  # fmt: skip


def test_a_larger_cell_matches_torch_dftd() -> None:
    # 64 atoms and about 10^5 pairs: the per-atom sums are differences of a running sum over
    # the whole list, so their rounding grows with it; still far inside the bound.
    atoms = bulk("NaCl", "rocksalt", a=5.64, cubic=True).repeat((2, 2, 2))
    atoms.rattle(0.05, seed=7)
    energy, forces, stress = reference(atoms)
    out = ours([atoms])
    assert relative_error(out.energy, np.array([energy])) < RELATIVE
    assert relative_error(out.forces, forces) < RELATIVE
    assert relative_error(out.stress[0], stress) < RELATIVE


def test_edges_out_of_sender_order_give_nan_not_wrong_numbers(cases) -> None:
    # The per-atom sums read each sender's edges as one run, as NeighbourList orders them.
    state = State.from_atoms([cases["slab"][0]])
    edges = NeighbourList(state, DEFAULT_CUTOFF_A, skin=0.0).build(state)
    d3 = D3BJ(D3BJParameters.for_functional("pbe"), state.atomic_numbers.tolist())
    assert torch.isfinite(d3(state, edges).energy).all()
    order = torch.randperm(edges.capacity, generator=torch.Generator().manual_seed(0))
    shuffled = Edges(edges.edge_index[:, order], edges.unit_shifts[order], edges.mask[order],
                     edges.count, edges.overflow)  # fmt: skip
    out = d3(state, shuffled, compute_stress=True)
    for value in (out.energy, out.forces, out.stress):
        assert torch.isnan(value).all()


def test_matches_tad_dftd3_on_a_molecule(cases) -> None:
    """A second, independent implementation with its own copy of the data (no cutoffs matter
    in a molecule this small)."""
    tad = pytest.importorskip("tad_dftd3")
    atoms = cases["molecule"][0]
    positions = torch.tensor(atoms.positions / BOHR_A, requires_grad=True)
    parameters = D3BJParameters.for_functional("pbe")
    param = {name: torch.tensor(getattr(parameters, name), dtype=torch.float64)
             for name in ("s6", "a1", "s8", "a2")}  # fmt: skip
    energy = tad.dftd3(torch.tensor(atoms.numbers), positions, param).sum() * HARTREE_EV
    (gradient,) = torch.autograd.grad(energy, positions)
    out = ours([atoms])
    assert relative_error(out.energy, np.array([energy.item()])) < 1e-5
    assert relative_error(out.forces, -gradient.numpy() / BOHR_A) < 1e-5


def test_no_host_synchronisation(cases) -> None:
    state = State.from_atoms([cases["slab"][0]])
    edges = NeighbourList(state, DEFAULT_CUTOFF_A, skin=0.5).build(state)
    d3 = D3BJ(D3BJParameters.for_functional("pbe"), state.atomic_numbers.tolist())
    with ForbidHostSync():
        d3(state, edges, compute_stress=True)


def test_parameters_come_from_the_reference_tables() -> None:
    pbe = D3BJParameters.for_functional("PBE")
    assert (pbe.s6, pbe.a1, pbe.s8, pbe.a2) == (1.0, 0.4289, 0.7875, 4.4407)  # Grimme 2011
    assert D3BJParameters.for_functional("r2scan").a2 != pbe.a2


def test_refusals() -> None:
    parameters = D3BJParameters.for_functional("pbe")
    with pytest.raises(DispersionError, match="no D3\\(BJ\\) parameters"):
        D3BJParameters.for_functional("emt")
    with pytest.raises(DispersionError, match="95"):
        D3BJ(parameters, [1, 95])
    with pytest.raises(DispersionError, match="cn_cutoff"):
        D3BJ(parameters, [1], cutoff=10.0, cn_cutoff=12.0)


# --- In the engine: fm.md(..., dispersion="d3bj") -----------------------------------------------


def copper() -> ase.Atoms:
    """One atom in a primitive fcc cell: its 21 Å dispersion list stays small (~4,000 pairs)."""
    return bulk("Cu", "fcc", a=3.58)


def test_md_adds_d3_energy_and_stress_to_the_model(tmp_path) -> None:
    """The demo model (trained on EMT, no functional) with PBE's D3(BJ) forced: the run's
    potential energy and pressure are the model's plus D3's, and it is recorded."""
    import json

    import fastmace as fm
    from fastmace.vocabulary import EV_PER_A3_IN_GPA

    atoms = copper()
    plain = fm.md(atoms, ensemble="nve", steps=0)
    output = tmp_path / "run"
    with_d3 = fm.md(atoms, ensemble="nve", steps=0, dispersion="d3bj",
                    dispersion_functional="PBE", output=output)  # fmt: skip
    d3 = ours([atoms])
    before, after = plain.thermo[0], with_d3.thermo[0]
    added = after["potential_energy_eV"] - before["potential_energy_eV"]
    assert added == pytest.approx(float(d3.energy[0]), rel=1e-10)
    pressure = -float(d3.stress[0].trace()) / 3 * EV_PER_A3_IN_GPA
    assert after["pressure_GPa"] - before["pressure_GPa"] == pytest.approx(pressure, rel=1e-8)
    metadata = json.loads((output / "metadata.json").read_text())
    assert metadata["settings"]["dispersion"] == "d3bj"
    assert metadata["engine"]["dispersion"]["functional"] == "pbe"
    assert metadata["engine"]["dispersion"]["parameters"]["a2"] == 4.4407
    assert "D3(BJ), pbe parameters" in (output / "report.txt").read_text()


def test_md_with_dispersion_conserves_energy() -> None:
    """NVE blocks through the engine, the dispersion's list kept valid: a Cu13 cluster."""
    from ase.cluster import Icosahedron

    import fastmace as fm

    cluster = Icosahedron("Cu", 2)
    settings = {"ensemble": "nve", "initial_temperature_K": 300, "dispersion": "d3bj",
                "dispersion_functional": "pbe"}  # fmt: skip
    start = fm.md(cluster, steps=0, **settings).thermo[0]
    end = fm.md(cluster, steps=10, timestep_fs=2.0, thermo_every=5, **settings).thermo[0]
    assert end["step"] == 10
    assert end["potential_energy_eV"] != start["potential_energy_eV"]  # it moved
    assert abs(end["total_energy_eV"] - start["total_energy_eV"]) < 1e-3


@pytest.mark.parametrize("block_steps", [64, 8])
def test_the_dispersion_list_is_searched_less_often_with_a_wider_skin(
    monkeypatch, block_steps: int
) -> None:
    """D3's long list is searched once in DISPERSION_SEARCH_FACTOR model searches with a skin
    of DISPERSION_SKIN_A, also when that period is longer than a block (8 steps here: at the
    start of every fourth block), and the dynamics are those of a list searched as often as
    the model's."""
    from ase.cluster import Icosahedron

    import fastmace as fm
    from fastmace.dynamics import dispersion, engine

    searched: list[float] = []
    rebuild = NeighbourList.rebuild

    def counted(self, state, edges):
        searched.append(self.cutoff)
        return rebuild(self, state, edges)

    monkeypatch.setattr(NeighbourList, "rebuild", counted)
    settings = {"ensemble": "nvt", "temperature_K": 300, "dispersion": "d3bj", "steps": 64,
                "dispersion_functional": "pbe", "block_steps": block_steps, "thermo_every": 64,
                "trajectory_every": 64, "restart_every": 64,
                "graphs": False}  # fmt: skip
    rare = fm.md(Icosahedron("Cu", 2), output=None, **settings)
    model = [c for c in searched if c < 10.0]
    d3 = [c for c in searched if c > 10.0]
    every = engine.DEFAULT_SEARCH_EVERY
    # The first forces (before the blocks) search both lists once; then 64 steps.
    assert len(model) == 1 + 64 // every
    assert len(d3) == 1 + 64 // (every * dispersion.DISPERSION_SEARCH_FACTOR)
    monkeypatch.setattr(dispersion, "DISPERSION_SEARCH_FACTOR", 1)
    monkeypatch.setattr(engine, "DISPERSION_SEARCH_FACTOR", 1)
    often = fm.md(Icosahedron("Cu", 2), output=None, **settings)
    np.testing.assert_allclose(
        rare.structures[0].positions, often.structures[0].positions, rtol=0, atol=1e-9
    )
    assert rare.thermo[0]["potential_energy_eV"] == pytest.approx(
        often.thermo[0]["potential_energy_eV"], abs=1e-9
    )


def test_md_refuses_dispersion_without_a_known_functional(tmp_path) -> None:
    import fastmace as fm

    output = tmp_path / "run"
    with pytest.raises(DispersionError, match="no known D3\\(BJ\\) functional"):
        fm.md(copper(), ensemble="nve", steps=0, dispersion="d3bj", output=output)
    assert not output.exists()
    with pytest.raises(DispersionError, match="unknown dispersion"):
        fm.md(copper(), ensemble="nve", steps=0, dispersion="d4", dispersion_functional="pbe")


@pytest.mark.parametrize("kind", ["bulk", "slab", "cluster"])
def test_the_calculator_with_d3_is_the_model_plus_torch_dftd(kind):
    """fm.calculator(dispersion="d3bj") gives the demo model's energy, forces and stress plus
    torch-dftd's D3(BJ) (mace-torch's settings), for a cell, a slab and a cluster; a second
    call on moved atoms reuses both kept lists."""
    import fastmace as fm

    atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 2, 2))
    if kind == "slab":
        atoms.pbc = [True, True, False]
        atoms.center(vacuum=6.0, axis=2)
    elif kind == "cluster":
        atoms = atoms[:13]
        atoms.pbc = False
        atoms.set_cell(np.zeros((3, 3)))
    atoms.rattle(0.05, seed=4)
    ours_calc = fm.calculator("demo-emt-cu", dispersion="d3bj", dispersion_functional="pbe")
    plain = fm.calculator("demo-emt-cu")
    kept = []
    for move in (0.0, 0.02):
        atoms.positions[0] += move
        with_d3 = atoms.copy()
        with_d3.calc = ours_calc
        model_only = atoms.copy()
        model_only.calc = plain
        d3_energy, d3_forces, d3_stress = reference(atoms)
        energy = model_only.get_potential_energy() + d3_energy
        assert with_d3.get_potential_energy() == pytest.approx(energy, rel=1e-12, abs=1e-10)
        np.testing.assert_allclose(
            with_d3.get_forces(), model_only.get_forces() + d3_forces, rtol=0, atol=1e-10
        )
        kept.append(ours_calc._lists["d3"].neighbours)
        if kind == "bulk":
            np.testing.assert_allclose(
                with_d3.get_stress(voigt=False),
                model_only.get_stress(voigt=False) + d3_stress,
                rtol=0, atol=1e-10,
            )  # fmt: skip
    assert kept[0] is kept[1]  # the D3 list was planned once


def test_a_run_with_d3_resumes_bit_for_bit_and_refuses_a_changed_term(tmp_path):
    from conftest import EXAMPLE

    import fastmace as fm
    from fastmace.io import load_restart
    from fastmace.resuming import ResumeError

    common = dict(
        temperature_K=300.0, dispersion="d3bj", dispersion_functional="pbe", seed=3,
        restart_every=10, thermo_every=5, trajectory_every=0,
    )  # fmt: skip
    fm.md(EXAMPLE, steps=20, output=tmp_path / "straight", **common)
    fm.md(EXAMPLE, steps=10, output=tmp_path / "resumed", **common)
    with pytest.raises(ResumeError, match=r"dispersion: saved d3bj \(pbe\), requested None"):
        fm.md(EXAMPLE, steps=20, output=tmp_path / "resumed", resume=True,
              **{**common, "dispersion": None, "dispersion_functional": None})  # fmt: skip
    fm.md(EXAMPLE, steps=20, output=tmp_path / "resumed", resume=True, **common)
    ends = [load_restart(tmp_path / name / "restart.npz").payload["tensors"]
            for name in ("straight", "resumed")]  # fmt: skip
    for name in ("state.positions", "state.velocities"):
        assert np.array_equal(ends[0][name], ends[1][name])
