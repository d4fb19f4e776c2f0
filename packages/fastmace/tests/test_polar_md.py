"""MACE-POLAR-1's PolarMACE in the MD engine (fm.md, fastmace md), against mace-torch.

The model is the ``polar-tiny`` template (random weights, every part of the long-range model
on; test_polar.py). The reference is mace-torch's own MACECalculator on the same model and
structure, in float64; tolerances as test_polar.py's: 1000 machine epsilons of the quantity's
scale (energy: max(|E|, atoms) eV; forces: max(|F|, 1) eV/Å).
"""

from __future__ import annotations

import copy
import csv
import json

import ase
import numpy as np
import pytest
import torch
from ase.build import bulk
from ase.neighborlist import neighbor_list

pytest.importorskip(
    "graph_longrange",
    reason="MACE-POLAR-1 needs graph-longrange: pip install 'fastmace[polar]'",
)

from conftest import run_fastmace
from helpers.polar import copper_oxide, mace_torch_results, methanol

import fastmace as fm
from fastmace.batching import BatchError
from fastmace.dynamics.ensembles import ensemble
from fastmace.io import OutputSchedule
from fastmace.io.restart import load_restart
from fastmace.io.trajectory import read_trajectory
from fastmace.models.load import LoadedModel
from fastmace.preflight import RequestError
from fastmace.simulation import RunSettings, Simulation

EPSILONS = 1000 * torch.finfo(torch.float64).eps
# The NVE run's bounds (docs/validation/polar.md): 8 Cu atoms of a charged cell (+1 e, a
# doublet) from 300 K, 400 steps of 1 fs, float64 model. Velocity Verlet's total energy
# fluctuates by O(dt²) without drifting; measured: fluctuation 2.4e-8 eV/atom, drift 1.8e-8
# eV/atom/ps. The bounds are about a hundred times those and over a thousand times below the
# kinetic energy per atom (0.015 eV on average), so a force that is not the energy's
# gradient (a charge missing from one call, a stale or wrong neighbour list, a jump where a
# pair crosses the cutoff) fails them.
MAX_FLUCTUATION_EV_PER_ATOM = 2.5e-6
MAX_DRIFT_EV_PER_ATOM_PER_PS = 5e-6


@pytest.fixture(scope="module")
def polar64() -> LoadedModel:
    return fm.load("template:polar-tiny", dtype="float64")


def nve(steps: int = 0, **changes: object) -> RunSettings:
    schedule = OutputSchedule(trajectory_every=0, thermo_every=0, restart_every=0)
    return RunSettings(ensemble=ensemble("nve"), steps=steps, schedule=schedule, **changes)


def first_forces(
    loaded: LoadedModel, structures: list[ase.Atoms], **changes: object
) -> tuple[np.ndarray, np.ndarray]:
    """Energies (per system) and forces of the engine's first force call, in set-up."""
    md = Simulation(loaded, structures, nve(**changes)).engine.md
    return md.energy.cpu().numpy(), md.forces.cpu().numpy()


def assert_matches_mace_torch(atoms: ase.Atoms, energy: float, forces: np.ndarray, loaded) -> None:
    reference_energy, reference_forces, _ = mace_torch_results(
        copy.deepcopy(loaded.module), atoms, "float64"
    )
    assert abs(energy - reference_energy) <= EPSILONS * max(abs(reference_energy), len(atoms))
    scale = max(float(np.abs(reference_forces).max()), 1.0)
    np.testing.assert_allclose(forces, reference_forces, rtol=0, atol=EPSILONS * scale)


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(copper_oxide, id="periodic-cell"),
        pytest.param(methanol, id="open-molecule"),
        pytest.param(lambda: copper_oxide(charge=1), id="charged-periodic-cell"),
        pytest.param(lambda: methanol(charge=1, spin=2), id="cation-doublet"),
    ],
)
def test_engine_first_forces_match_mace_torch(polar64: LoadedModel, make) -> None:
    atoms = make()
    energies, forces = first_forces(polar64, [atoms])
    assert_matches_mace_torch(atoms, float(energies[0]), forces, polar64)


def test_engine_first_forces_match_mace_torch_in_float32() -> None:
    loaded = fm.load("template:polar-tiny", dtype="float32")
    atoms = copper_oxide(charge=1)
    energies, forces = first_forces(loaded, [atoms])
    energy, reference_forces, _ = mace_torch_results(copy.deepcopy(loaded.module), atoms, "float32")
    epsilons = 1000 * torch.finfo(torch.float32).eps
    assert abs(energies[0] - energy) <= epsilons * max(abs(energy), len(atoms))
    scale = max(float(np.abs(reference_forces).max()), 1.0)
    np.testing.assert_allclose(forces, reference_forces, rtol=0, atol=epsilons * scale)


def test_fm_md_first_step_matches_mace_torch(tmp_path) -> None:
    atoms = methanol(charge=1, spin=2)
    result = fm.md(
        atoms, model="template:polar-tiny", dtype="float64", ensemble="nve", steps=0,
        output=tmp_path / "run", trajectory_format="h5md", trajectory_every=1,
    )  # fmt: skip
    # H5MD keeps float64 forces (extxyz writes eight decimals).
    (frame,) = read_trajectory(next((tmp_path / "run").glob("trajectory.h5*")))
    loaded = fm.load("template:polar-tiny", dtype="float64")
    energy = result.thermo[0]["potential_energy_eV"]
    assert_matches_mace_torch(atoms, energy, frame.get_forces(), loaded)  # thermo's energy
    assert_matches_mace_torch(atoms, frame.get_potential_energy(), frame.get_forces(), loaded)


def test_charge_and_spin_from_info_or_arguments_change_the_energy_as_mace_torch(
    polar64: LoadedModel,
) -> None:
    neutral = methanol()
    (neutral_energy,), _ = first_forces(polar64, [neutral])
    (from_info,), _ = first_forces(polar64, [methanol(charge=1, spin=2)])
    (from_arguments,), forces = first_forces(polar64, [neutral], charge=(1.0,), spin=(2.0,))
    assert from_info == from_arguments
    assert abs(from_info - neutral_energy) > 1e-3  # a cation doublet is another system
    assert_matches_mace_torch(methanol(charge=1, spin=2), float(from_arguments), forces, polar64)
    # The arguments win over atoms.info, as fm.calculator's defaults do not.
    (overridden,), _ = first_forces(polar64, [methanol(charge=1, spin=2)], charge=(0.0,))
    cation_singlet = methanol(charge=0, spin=2)
    (expected,), _ = first_forces(polar64, [cation_singlet])
    assert overridden == expected


def test_two_systems_with_different_charges_give_each_its_result_alone(
    polar64: LoadedModel,
) -> None:
    for systems in (
        [copper_oxide(charge=1), copper_oxide(charge=-1)],
        [methanol(charge=1, spin=2), methanol(charge=-1, spin=2)],
    ):
        energies, forces = first_forces(polar64, systems)
        start = 0
        for index, atoms in enumerate(systems):
            (alone,), alone_forces = first_forces(polar64, [atoms])
            assert abs(energies[index] - alone) <= EPSILONS * max(abs(alone), len(atoms))
            rows = slice(start, start + len(atoms))
            np.testing.assert_allclose(forces[rows], alone_forces, rtol=0, atol=EPSILONS * 10)
            start += len(atoms)
    # One charge per system, given as arguments, does the same.
    given, _ = first_forces(polar64, [methanol(), methanol()], charge=(1.0, -1.0), spin=(2.0, 2.0))
    np.testing.assert_array_equal(given, energies)


def test_a_batch_never_mixes_open_molecules_with_periodic_systems(
    polar64: LoadedModel, tmp_path
) -> None:
    # graph-longrange sums a batch with any periodic system in k-space: a molecule in it
    # would not get the energy mace-torch's calculator gives it alone.
    systems = [copper_oxide(charge=1), methanol(charge=-1, spin=2)]
    with pytest.raises(BatchError, match="mixes open molecules with periodic systems"):
        Simulation(polar64, systems, nve())
    # fm.md runs them as two batches, each system as mace-torch's calculator has it alone.
    result = fm.md(
        systems, model="template:polar-tiny", dtype="float64", ensemble="nve", steps=0,
        output=tmp_path / "run", trajectory_every=0,
    )  # fmt: skip
    assert "open molecules in batches of their own" in result.report
    assert sorted(path.name for path in (tmp_path / "run").glob("batch-*")) == [
        "batch-001", "batch-002",
    ]  # fmt: skip
    for row, atoms in zip(result.thermo, systems, strict=True):
        reference, _, _ = mace_torch_results(copy.deepcopy(polar64.module), atoms, "float64")
        error = abs(row["potential_energy_eV"] - reference)
        assert error <= EPSILONS * max(abs(reference), len(atoms))


def test_nve_conserves_energy_across_neighbour_list_rebuilds(tmp_path) -> None:
    # Seed 2's template holds this charged fcc cell together (seed 0's lets it collapse); at
    # a = 3.95 Å the second neighbours vibrate across the cutoff (4 Å), so pairs enter and
    # leave the model's graph during the run.
    atoms = bulk("Cu", "fcc", a=3.95, cubic=True).repeat((2, 1, 1))
    atoms.rattle(stdev=0.02, seed=1)
    atoms.info.update(charge=1, spin=2)
    run = tmp_path / "run"
    fm.md(
        atoms, model="template:polar-tiny", dtype="float64", ensemble="nve", steps=400,
        timestep_fs=1.0, seed=2, initial_temperature_K=300, thermo_every=10,
        trajectory_every=10, output=run, skin_A=0.01,
    )  # fmt: skip
    rows = list(csv.DictReader((run / "thermo.csv").open()))
    time_ps = np.array([float(row["time_fs"]) for row in rows]) / 1000.0
    total = np.array([float(row["total_energy_eV"]) for row in rows]) / len(atoms)
    fluctuation = float(np.abs(total - total[0]).max())
    drift = abs(float(np.polyfit(time_ps, total, 1)[0]))
    assert fluctuation < MAX_FLUCTUATION_EV_PER_ATOM, fluctuation
    assert drift < MAX_DRIFT_EV_PER_ATOM_PER_PS, drift
    # The list was rebuilt during the run: the skin was crossed between searches (the engine
    # searched more often), and the list's reference positions are no longer the start's.
    metadata = json.loads((run / "metadata.json").read_text())
    assert metadata["engine"]["search_halvings"] >= 1
    assert metadata["engine"]["capture"] is False and metadata["engine"]["compile"] is False
    reference = load_restart(run / "restart.npz").payload["neighbours"]["positions"]
    assert not np.array_equal(reference, atoms.positions)
    frames = read_trajectory(next(run.glob("trajectory.*")))
    pairs = {len(neighbor_list("i", frame, 4.0)) for frame in frames}
    assert len(pairs) > 1, pairs  # the model's graph changed: pairs crossed the cutoff
    assert [s["charge"] for s in metadata["structures"]] == [1.0]
    assert [s["spin"] for s in metadata["structures"]] == [2.0]


def test_metadata_and_report_record_charge_and_spin(tmp_path) -> None:
    run = tmp_path / "run"
    result = fm.md(
        [copper_oxide(), copper_oxide()], model="template:polar-tiny", ensemble="nve",
        steps=1, output=run, charge=[1, 0], spin=[2, 1], trajectory_every=0,
    )  # fmt: skip
    metadata = json.loads((run / "metadata.json").read_text())
    assert [(s["charge"], s["spin"]) for s in metadata["structures"]] == [(1.0, 2.0), (0.0, 1.0)]
    assert metadata["settings"]["charge"] == [1.0, 0.0]
    assert metadata["settings"]["spin"] == [2.0, 1.0]
    decisions = metadata["plan"]["decisions"]
    assert (
        decisions["graphs"]["value"] is False
        and "host synchronisation" in (decisions["graphs"]["reason"])
    )
    assert decisions["compile"]["value"] is False
    assert "system 0: charge +1 e, spin multiplicity 2" in result.report


def test_a_local_model_has_no_charges_recorded(tmp_path) -> None:
    run = tmp_path / "run"
    fm.md(bulk("Cu", "fcc", a=3.6, cubic=True), ensemble="nve", steps=1, output=run)
    metadata = json.loads((run / "metadata.json").read_text())
    assert metadata["structures"][0]["charge"] is None
    assert metadata["settings"]["charge"] is None


@pytest.mark.parametrize(
    ("arguments", "match"),
    [
        ({"spin": 0}, r"spin=0 is not a spin multiplicity.*2S \+ 1"),
        ({"spin": 1.5}, r"whole number of 1 or more"),
        ({"charge": "plus one"}, r"not a total charge in e"),
        ({"charge": float("nan")}, r"finite number"),
        ({"charge": [1, 0, 0]}, r"charge has 3 values for 1 systems"),
    ],
)
def test_bad_charges_and_spins_are_refused_before_anything_runs(tmp_path, arguments, match):
    with pytest.raises(RequestError, match=match):
        fm.md(copper_oxide(), model="template:polar-tiny", ensemble="nve", steps=1,
              output=tmp_path / "run", **arguments)  # fmt: skip
    assert not (tmp_path / "run").exists()


def test_a_bad_spin_in_atoms_info_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match=r'system 0\'s atoms.info\["spin"\] is not a spin'):
        fm.md(methanol(spin=0), model="template:polar-tiny", ensemble="nve", steps=1)


def test_charge_for_a_local_model_is_refused(tmp_path) -> None:
    for model in ("demo-emt-cu", "template:tiny"):
        with pytest.raises(ValueError, match=r"no long-range part.*Leave charge and spin out"):
            fm.md(bulk("Cu", "fcc", a=3.6, cubic=True), model=model, steps=1, charge=1)


def test_npt_and_cell_relaxation_are_refused_for_a_polar_model(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"npt ensemble moves the cell.*leaves out its long"):
        fm.md(copper_oxide(), model="template:polar-tiny", ensemble="npt", temperature_K=300,
              pressure_GPa=0.0, steps=1, output=tmp_path / "run")  # fmt: skip
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match=r"cell=True would relax the cell on the wrong stress"):
        fm.relax(copper_oxide(), model="template:polar-tiny", cell=True, steps=1)


def test_compile_forced_for_a_polar_model_is_refused() -> None:
    from fastmace.planner import PlanError

    # (graphs=True is refused on the CPU already; test_planner.py plans it for a GPU.)
    with pytest.raises(PlanError, match=r"compile=True\) cannot be honoured.*host synchron"):
        fm.md(copper_oxide(), model="template:polar-tiny", ensemble="nve", steps=1, compile=True)


def test_a_polar_checkpoint_file_runs_planned_as_long_range(tmp_path) -> None:
    path = tmp_path / "polar.model"
    torch.save(fm.load("template:polar-tiny").reference, path)
    result = fm.md(copper_oxide(charge=1), model=path, trusted=True, ensemble="nve", steps=1)
    assert "a long-range model (MACE-POLAR-1) runs eagerly" in result.report
    assert "charge +1 e" in result.report
    with pytest.raises(ValueError, match=r"npt ensemble moves the cell"):
        fm.md(copper_oxide(), model=path, trusted=True, ensemble="npt", temperature_K=300,
              pressure_GPa=0.0, steps=1)  # fmt: skip


def test_relax_positions_with_a_charge(polar64: LoadedModel) -> None:
    atoms = methanol(charge=1, spin=2)
    result = fm.relax(atoms, model="template:polar-tiny", dtype="float64", steps=0)
    reference_energy, _, _ = mace_torch_results(copy.deepcopy(polar64.module), atoms, "float64")
    assert abs(result.energies_eV[0] - reference_energy) <= EPSILONS * abs(reference_energy)


def test_the_gate_passes_on_a_charged_polar_structure() -> None:
    result = fm.md(
        methanol(charge=1, spin=2), model="template:polar-tiny", ensemble="nve", steps=1,
        check="gate",
    )  # fmt: skip
    assert "gate passed" in result.report


def test_cli_md_takes_charge_and_spin(clean_env, tmp_path) -> None:
    structure = tmp_path / "methanol.extxyz"
    methanol().write(structure)
    run = tmp_path / "run"
    args = ["md", str(structure), "--model", "template:polar-tiny", "--ensemble", "nve",
            "--steps", "2", "--charge", "1", "--spin", "2", "--output", str(run)]  # fmt: skip
    result = run_fastmace(args, clean_env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "charge +1 e, spin multiplicity 2" in result.stdout
    metadata = json.loads((run / "metadata.json").read_text())
    assert (metadata["structures"][0]["charge"], metadata["structures"][0]["spin"]) == (1.0, 2.0)
    bad = run_fastmace([*args[:-1], str(tmp_path / "other"), "--spin", "0.5"], clean_env)
    assert bad.returncode == 1
    assert "not a spin multiplicity" in bad.stderr and "--spin" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_run_config_takes_charge_and_spin_per_system(tmp_path) -> None:
    from fastmace.cli.md import read_config

    config = tmp_path / "config.toml"
    config.write_text(
        'model = "template:polar-tiny"\nensemble = "nve"\nspin = 1\n'
        '[[systems]]\nstructure = "a.extxyz"\ncharge = 1\nspin = 2\n'
        '[[systems]]\nstructure = "b.extxyz"\ncharge = 0\n'
    )
    read = read_config(config)
    assert (read["charge"], read["spin"]) == ([1, 0], [2, 1])
    config.write_text('structure = "a.extxyz"\nspin = 0.5\n')
    with pytest.raises(RequestError, match=r"config.toml: spin=0.5 is not a spin multiplicity"):
        read_config(config)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: copper_oxide(charge=1), id="charged-periodic-cell"),
        pytest.param(lambda: methanol(charge=1, spin=2), id="cation-doublet"),
    ],
)
def test_fm_md_on_cuda_matches_mace_torch_and_runs_eagerly_on_e3nn(tmp_path, make):
    atoms = make()
    run = tmp_path / "run"
    result = fm.md(
        atoms, model="template:polar-tiny", dtype="float64", device="cuda", ensemble="nve",
        steps=10, timestep_fs=0.5, seed=2, initial_temperature_K=300, output=run,
        trajectory_format="h5md", trajectory_every=10, thermo_every=5,
    )  # fmt: skip
    frames = read_trajectory(next(run.glob("trajectory.h5*")))
    loaded = fm.load("template:polar-tiny", dtype="float64", seed=2)  # the run's weights
    start = frames[0]
    start.info.update(atoms.info)  # the run's charge and spin, for mace-torch's calculator
    assert_matches_mace_torch(start, start.get_potential_energy(), start.get_forces(), loaded)
    # The end of the run, after 10 steps on the GPU, against mace-torch on the CPU.
    end = frames[-1]
    end.info.update(atoms.info)
    assert_matches_mace_torch(end, end.get_potential_energy(), end.get_forces(), loaded)
    decisions = json.loads((run / "metadata.json").read_text())["plan"]["decisions"]
    assert decisions["device"]["value"] == "cuda" and decisions["backend"]["value"] == "e3nn"
    assert decisions["graphs"]["value"] is False and decisions["compile"]["value"] is False
    assert np.isfinite([row["total_energy_eV"] for row in result.thermo]).all()
