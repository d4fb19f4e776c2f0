"""FIRE relaxation: the same path as ASE's FIRE (and FrechetCellFilter) on the demo model, each
system of a batch to its own convergence; the capture-safe matrix exponential; fm.relax's
output directory and the command line."""

from __future__ import annotations

import csv
import io
import json

import ase
import ase.build
import ase.io
import numpy as np
import pytest
import scipy.linalg
import torch
from ase.filters import FrechetCellFilter
from ase.optimize import FIRE
from conftest import run_fastmace

import fastmace as fm
from fastmace.dynamics.matrix_exp import matrix_exp, matrix_exp_frechet
from fastmace.dynamics.relax import FireSettings, inverse_3x3
from fastmace.models.load import load
from fastmace.planner import EngineSettings
from fastmace.relaxation import Relaxation
from fastmace.vocabulary import EV_PER_A3_PER_GPA


@pytest.fixture(scope="module")
def demo():
    return load("demo-emt-cu")


# Short blocks: the engine stops at a block's end, so a test wastes fewer iterations after
# convergence (each costs a model evaluation on the CPU).
SHORT_BLOCKS = EngineSettings(block_steps=10)


def copper(seed: int, a: float = 3.61, repeat=(2, 1, 1)) -> ase.Atoms:
    atoms = ase.build.bulk("Cu", "fcc", a=a, cubic=True).repeat(repeat)
    atoms.rattle(0.1, seed=seed)
    return atoms


def ase_fire(atoms: ase.Atoms, fmax: float, cell: bool = False, pressure_GPa: float = 0.0):
    """ASE's own FIRE on the same model (its ASE calculator), as a reference."""
    atoms = atoms.copy()
    atoms.calc = fm.calculator("demo-emt-cu")
    target = (
        FrechetCellFilter(atoms, scalar_pressure=pressure_GPa * EV_PER_A3_PER_GPA)
        if cell
        else atoms
    )
    optimizer = FIRE(target, logfile=None)
    optimizer.run(fmax=fmax, steps=500)
    return atoms, optimizer.nsteps


def test_matrix_exp_and_its_frechet_derivative_match_scipy():
    generator = torch.Generator().manual_seed(0)
    scales = torch.tensor([1e-9, 0.1, 1.0, 5.0, 30.0], dtype=torch.float64)[:, None, None]
    matrices = torch.randn(5, 3, 3, generator=generator, dtype=torch.float64) * scales
    directions = 100 * torch.randn(5, 3, 3, generator=generator, dtype=torch.float64)
    exps, derivatives = matrix_exp(matrices), matrix_exp_frechet(matrices, directions)
    for a, e, got, got_derivative in zip(matrices, directions, exps, derivatives, strict=True):
        expected, expected_derivative = scipy.linalg.expm_frechet(a.numpy(), e.numpy())
        np.testing.assert_allclose(
            got.numpy(), expected, rtol=1e-12, atol=1e-12 * abs(expected).max()
        )
        scale = abs(expected_derivative).max()
        np.testing.assert_allclose(got_derivative.numpy(), expected_derivative, atol=1e-12 * scale)
    inverse = inverse_3x3(matrices[1:])
    identity = torch.eye(3, dtype=torch.float64).expand_as(inverse)
    torch.testing.assert_close(inverse @ matrices[1:], identity, atol=1e-10, rtol=0)


def test_a_batch_relaxes_each_system_as_ase_fire_does_alone(demo):
    """Two systems of different sizes in one batch: each takes ASE's FIRE path (same number of
    iterations, same positions) and stops at its own convergence while the other goes on."""
    structures = [copper(1), copper(2, repeat=(1, 1, 1))]
    result = Relaxation(
        demo, structures, FireSettings(fmax=0.05), max_steps=300, engine=SHORT_BLOCKS
    ).run()
    assert result.converged == [True, True]
    for index, atoms in enumerate(structures):
        reference, iterations = ase_fire(atoms, fmax=0.05)
        assert result.iterations[index] == iterations
        np.testing.assert_allclose(
            result.structures[index].positions, reference.positions, atol=1e-8
        )
        assert result.energies_eV[index] == pytest.approx(
            reference.get_potential_energy(), abs=1e-9
        )
        assert result.fmax_eV_per_A[index] < 0.05
    assert result.iterations[0] != result.iterations[1]  # each stopped on its own


def test_a_relaxation_with_d3_follows_ase_fire_on_the_model_plus_torch_dftd(tmp_path):
    """With dispersion="d3bj" the structure relaxes on the model plus D3(BJ): ASE's FIRE on
    the demo model summed with torch-dftd's D3 (mace-torch's settings) takes the same path."""
    torch_dftd = pytest.importorskip("torch_dftd.torch_dftd3_calculator")
    from ase.calculators.mixing import SumCalculator

    atoms = copper(5, repeat=(1, 1, 1))
    result = fm.relax(
        atoms, fmax=0.05, steps=300, dispersion="d3bj", dispersion_functional="pbe",
        output=tmp_path / "relaxed", config=fm.EngineConfig(block_steps=10),
    )  # fmt: skip
    reference = atoms.copy()
    dispersion = torch_dftd.TorchDFTD3Calculator(
        damping="bj", xc="pbe", cutoff=40.0 * ase.units.Bohr, dtype=torch.float64
    )
    reference.calc = SumCalculator([fm.calculator("demo-emt-cu"), dispersion])
    optimizer = FIRE(reference, logfile=None)
    optimizer.run(fmax=0.05, steps=300)
    assert result.converged == [True]
    assert result.iterations[0] == optimizer.nsteps
    np.testing.assert_allclose(result.structures[0].positions, reference.positions, atol=1e-7)
    assert result.energies_eV[0] == pytest.approx(reference.get_potential_energy(), abs=1e-7)
    record = json.loads((tmp_path / "relaxed" / "metadata.json").read_text())["dispersion"]
    assert record["method"] == "d3bj" and record["functional"] == "pbe"
    assert "dispersion: D3(BJ), pbe parameters" in result.report


def test_cell_relaxation_under_pressure_follows_ase_frechet_cell_filter(demo):
    strained = copper(3, a=3.70, repeat=(1, 1, 1))
    strained.set_cell(strained.cell[:] @ np.array([[1.0, 0.03, 0], [0, 0.98, 0], [0, 0, 1.02]]),
                      scale_atoms=True)  # fmt: skip
    result = Relaxation(
        demo,
        [strained],
        FireSettings(fmax=0.03, cell=True, pressure_GPa=2.0),
        max_steps=400,
        engine=SHORT_BLOCKS,
    ).run()
    reference, iterations = ase_fire(strained, fmax=0.03, cell=True, pressure_GPa=2.0)
    assert result.converged == [True] and result.iterations == [iterations]
    relaxed = result.structures[0]
    np.testing.assert_allclose(relaxed.cell[:], reference.cell[:], atol=1e-7)
    np.testing.assert_allclose(relaxed.positions, reference.positions, atol=1e-7)
    # At 2 GPa the stress is -2 GPa on the diagonal (ASE's sign), to the force tolerance.
    stress_GPa = relaxed.get_stress(voigt=False) / EV_PER_A3_PER_GPA
    np.testing.assert_allclose(stress_GPa, -2.0 * np.eye(3), atol=0.5)


def test_fm_relax_writes_its_directory_and_refuses_a_used_one(tmp_path):
    output = tmp_path / "relaxed"
    result = fm.relax(copper(4), fmax=0.05, output=output)
    assert result.converged == [True] and result.output == output
    frames = ase.io.read(output / "relaxed.extxyz", ":")
    np.testing.assert_allclose(frames[0].positions, result.structures[0].positions, atol=1e-6)
    assert frames[0].get_potential_energy() == pytest.approx(result.energies_eV[0])
    log = (output / "relax.csv").read_text().splitlines()
    assert log[0].startswith("iteration,system,energy_eV") and len(log) >= 3
    # One row per iteration (issue 33: it was one per block, 2 rows for 46 iterations), from
    # the start to the converged last one, whose fmax is the result's.
    rows = list(csv.DictReader(io.StringIO("\n".join(log))))
    assert [int(row["iteration"]) for row in rows] == list(range(result.iterations[0] + 1))
    assert float(rows[-1]["fmax_eV_per_A"]) == pytest.approx(result.fmax_eV_per_A[0])
    assert rows[-1]["converged"] == "1" and all(row["converged"] == "0" for row in rows[:-1])
    metadata = json.loads((output / "metadata.json").read_text())
    assert metadata["kind"] == "relaxation" and metadata["results"]["converged"] == [True]
    assert metadata["model"]["label"] == "demo-emt-cu"
    assert metadata["engine"]["compile_workers"] is None  # the plan's: nothing compiled
    report = (output / "report.txt").read_text()
    assert "converged after" in report
    # The backend's reason is the plan's (nothing was asked for), in the report and metadata.
    assert "backend:   e3nn: measured: on the CPU e3nn beats" in report
    assert "asked for" not in report
    assert metadata["model"]["backend_reason"].startswith("measured: on the CPU e3nn beats")
    with pytest.raises(FileExistsError, match="never written over"):
        fm.relax(copper(4), output=output)


def test_bad_requests_are_refused_before_anything_runs(tmp_path):
    molecule = ase.Atoms("Cu2", positions=[[0, 0, 0], [2.3, 0, 0]])
    with pytest.raises(ValueError, match="needs every structure periodic"):
        fm.relax(molecule, cell=True)
    with pytest.raises(ValueError, match="a pressure needs cell=True"):
        FireSettings(pressure_GPa=1.0)
    with pytest.raises(ValueError, match="fmax must be a positive number"):
        fm.relax(molecule, fmax=-1.0, output=tmp_path / "never")
    with pytest.raises(ValueError, match="steps must be a whole number"):
        fm.relax(molecule, steps=2.5)
    assert not (tmp_path / "never").exists()


def test_fastmace_relax_on_the_command_line(clean_env, tmp_path):
    structure = tmp_path / "cu.extxyz"
    ase.io.write(structure, copper(5))
    output = tmp_path / "out"
    done = run_fastmace(["relax", str(structure), "--fmax", "0.05", "-o", str(output)], clean_env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "FastMACE relaxation report" in done.stdout and "converged after" in done.stdout
    assert (output / "relaxed.extxyz").exists()
    # Not converged within the iterations allowed: exit code 2, and the report says so.
    output = tmp_path / "short"
    done = run_fastmace(["relax", str(structure), "--steps", "2", "-o", str(output)], clean_env)
    assert done.returncode == 2 and "NOT converged after 2 iterations" in done.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("cell", [False, True])
def test_captured_relaxation_on_the_gpu_matches_the_eager_one(cell):
    """On CUDA the FIRE blocks are captured as graphs; they end where eager blocks end."""
    model = load("demo-emt-cu", device="cuda")
    structures = [copper(6, a=3.66), copper(7, a=3.58, repeat=(1, 1, 1))]
    settings = FireSettings(fmax=0.02, cell=cell)
    runs = {
        graphs: Relaxation(
            model,
            structures,
            settings,
            max_steps=300,
            engine=EngineSettings(device="cuda", block_steps=10, graphs=graphs),
        )
        for graphs in (False, True)
    }
    results = {graphs: relaxation.run() for graphs, relaxation in runs.items()}
    assert runs[True].engine.capture and runs[True].engine.capture_failure is None
    assert results[True].iterations == results[False].iterations
    assert all(results[True].converged)
    for captured, eager in zip(results[True].structures, results[False].structures, strict=True):
        np.testing.assert_allclose(captured.positions, eager.positions, atol=1e-9)
        np.testing.assert_allclose(captured.cell[:], eager.cell[:], atol=1e-9)


def test_a_relaxation_compiles_when_its_plan_says_so(tmp_path, monkeypatch, one_interaction_copper):
    """fm.relax's plan carries compile to the potential, as Simulation's does: here a compute
    node without a C++ compiler, so the attempt fails for real and the chosen compilation
    falls back, which shows that it was tried (before, relax dropped the setting)."""
    import torch._dynamo
    import torch._inductor.config

    from fastmace.runtime import environment

    monkeypatch.setenv("FASTMACE_CACHE", str(tmp_path / "cache"))
    for name in (environment.TORCHINDUCTOR_CACHE_DIR.name, environment.TRITON_CACHE_DIR.name,
                 *environment.COMPILE_CACHE_FLAGS):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    torch._dynamo.reset()
    engine = EngineSettings(compile=True, compile_fallback=True)
    missing_compiler = {"cpp.cxx": (str(tmp_path / "no-such-c++"),)}
    with (
        torch._inductor.config.patch(missing_compiler),
        pytest.warns(RuntimeWarning, match="could not compile this model.*runs uncompiled"),
    ):
        # conftest's one-interaction copper model: Dynamo traces all of a model before Inductor
        # fails, and this one has a third of the demo's operators (34 s with the demo).
        relaxation = Relaxation(
            load(one_interaction_copper), [copper(1)], FireSettings(fmax=0.05), max_steps=5,
            engine=engine,
        )  # fmt: skip
    assert "no-such-c++" in (relaxation.potential.compile_failure or "")
    assert not relaxation.potential.compiled


def test_each_progress_line_is_shown_once(demo, monkeypatch):
    """A line after every block (the interval set to zero), and the last one not again."""
    import io

    from fastmace import relaxation

    monkeypatch.setattr(relaxation, "_PROGRESS_EVERY_S", 0.0)
    atoms = copper(1)
    atoms.rattle(0.1, seed=2)
    shown = io.StringIO()
    Relaxation(
        demo, [atoms], FireSettings(fmax=0.05), max_steps=300, engine=SHORT_BLOCKS, progress=shown
    ).run()
    lines = shown.getvalue().splitlines()
    assert len(lines) >= 2 and all(line.startswith("relax: iteration ") for line in lines)
    assert len(set(lines)) == len(lines), lines
