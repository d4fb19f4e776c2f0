"""Other tools read our trajectories: MDAnalysis (units converted), ASE, h5py, as the docs show.

One real run (demo model, 32 Cu atoms, CPU) is made twice with the same seed: once to
extxyz, read here by ASE, and once to H5MD, read by MDAnalysis. The two readers share no
code with each other or with FastMACE, so agreement checks the file's values and units.
"""

from __future__ import annotations

import io
import re
import shutil
from pathlib import Path

import ase.build
import ase.io
import ase.units
import numpy as np
import pytest

import fastmace as fm
from fastmace.io import read_trajectory
from fastmace.io.extxyz import ExtxyzWriter
from fastmace.io.frames import make_frame
from fastmace.io.h5md import H5MDWriter, system_view

mda = pytest.importorskip("MDAnalysis")  # in the dev extra: CI always runs these

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs" / "output.md"
# MDAnalysis holds float32; extxyz keeps 8 decimals (of eV/Å forces: 1e-6 kJ/(mol Å)).
FLOAT32 = {"rtol": 2.0**-23, "atol": 1e-6}
KJ_PER_MOL = ase.units.kJ / ase.units.mol  # in eV, as ASE's constants


def run(output: Path, trajectory_format: str) -> fm.MDResult:
    return fm.md(
        ROOT / "examples" / "cu-fcc-32.extxyz",
        model="demo-emt-cu",
        ensemble="nvt",
        temperature_K=300.0,
        steps=10,
        timestep_fs=2.0,
        seed=11,
        trajectory_every=5,
        thermo_every=5,
        trajectory_format=trajectory_format,
        output=output,
        device="cpu",
        progress=io.StringIO(),
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same run written to extxyz and to H5MD: {format: (run directory, result)}."""
    root = tmp_path_factory.mktemp("runs")
    return {name: (root / name, run(root / name, name)) for name in ("extxyz", "h5md")}


def test_mdanalysis_reads_a_run_with_units_converted(runs):
    extxyz_dir, _ = runs["extxyz"]
    h5md_dir, result = runs["h5md"]
    expected = ase.io.read(extxyz_dir / "trajectory.extxyz", ":")
    universe = mda.Universe(str(h5md_dir / "trajectory.h5md"))  # default: convert_units=True
    assert universe.trajectory.n_frames == len(expected) == 3
    assert universe.atoms.n_atoms == 32
    for ts, atoms in zip(universe.trajectory, expected, strict=True):
        assert ts.data["step"] == atoms.info["step"]
        assert ts.time == pytest.approx(atoms.info["time_fs"] / 1000.0)  # MDAnalysis: ps
        np.testing.assert_allclose(ts.dimensions, atoms.cell.cellpar(), **FLOAT32)
        np.testing.assert_allclose(ts.positions, atoms.positions, **FLOAT32)
        velocities = atoms.get_velocities() * ase.units.fs * 1000.0  # Å/ps
        np.testing.assert_allclose(ts.velocities, velocities, **FLOAT32)
        forces = atoms.get_forces() / KJ_PER_MOL  # kJ/(mol Å)
        np.testing.assert_allclose(ts.forces, forces, **FLOAT32)
        energy = atoms.get_potential_energy() / KJ_PER_MOL
        assert ts.data["potential_energy"] == pytest.approx(energy, rel=1e-12, abs=1e-6)
    # The last frame is the run's final state.
    final, last = result.structures[0], universe.trajectory[-1]
    np.testing.assert_allclose(last.positions, final.positions, **FLOAT32)
    velocities = final.get_velocities() * ase.units.fs * 1000.0
    np.testing.assert_allclose(last.velocities, velocities, **FLOAT32)


def test_our_reader_agrees_with_ase_on_the_same_run(runs):
    from_extxyz = ase.io.read(runs["extxyz"][0] / "trajectory.extxyz", ":")
    from_h5md = read_trajectory(runs["h5md"][0] / "trajectory.h5md")
    for ours, theirs in zip(from_h5md, from_extxyz, strict=True):
        np.testing.assert_allclose(ours.positions, theirs.positions, atol=1e-7)
        np.testing.assert_allclose(ours.get_forces(), theirs.get_forces(), atol=1e-7)
        assert ours.get_potential_energy() == pytest.approx(theirs.get_potential_energy())


def batch_frames(n_steps: int = 3):
    """Frames of a batch of two different systems, with energies and forces."""
    copper = ase.build.bulk("Cu", "fcc", a=3.6, cubic=True)
    water = ase.build.molecule("H2O")
    water.center(vacuum=3.0)
    water.pbc = True
    rng = np.random.default_rng(5)
    for step in range(n_steps):
        structures = [copper.copy(), water.copy()]
        for atoms in structures:
            atoms.positions += rng.normal(scale=0.05, size=atoms.positions.shape)
            atoms.set_velocities(rng.normal(scale=0.01, size=(len(atoms), 3)) / ase.units.fs)
        forces = [rng.normal(size=(len(atoms), 3)) for atoms in structures]
        yield make_frame(10 * step, 20.0 * step, structures, [-3.5 * step, 1.5], forces)


def write_batch(folder: Path) -> list:
    """A batch of two systems in ``folder``, as trajectory.extxyz and trajectory.h5md."""
    folder.mkdir(parents=True, exist_ok=True)
    written = list(batch_frames())
    for writer in (ExtxyzWriter(folder / "trajectory.extxyz"),
                   H5MDWriter(folder / "trajectory.h5md", 2)):  # fmt: skip
        for frame in written:
            writer.write(frame)
        writer.close()
    return written


def test_mdanalysis_reads_one_system_of_a_batch_through_a_view(tmp_path, monkeypatch):
    written = write_batch(tmp_path / "batch")
    with pytest.raises(KeyError, match="trajectory"):  # MDAnalysis cannot pick a group
        mda.Universe(str(tmp_path / "batch" / "trajectory.h5md"))
    (tmp_path / "views").mkdir()
    view = system_view(tmp_path / "batch" / "trajectory.h5md", 1, tmp_path / "views" / "w.h5md")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # the link is relative to the view, not here
    universe = mda.Universe("../views/w.h5md")
    assert universe.atoms.n_atoms == 3
    for ts, frame in zip(universe.trajectory, written, strict=True):
        atoms = frame.atoms[1]
        assert ts.data["step"] == frame.step and ts.time == pytest.approx(frame.time_fs / 1000)
        np.testing.assert_allclose(ts.positions, atoms.positions, **FLOAT32)
        np.testing.assert_allclose(ts.forces, frame.forces[1] / KJ_PER_MOL, **FLOAT32)
        np.testing.assert_allclose(ts.dimensions, atoms.cell.cellpar(), **FLOAT32)
        assert ts.data["potential_energy"] == pytest.approx(frame.energies[1] / KJ_PER_MOL)
    with pytest.raises(ValueError, match="systems 0 to 1, not 2"):
        system_view(tmp_path / "batch" / "trajectory.h5md", 2, view.with_name("x.h5md"))


def test_ase_has_no_h5md_reader():
    # docs/output.md says so and shows the ways round it; if ASE gains one, say that instead.
    assert not any("h5md" in name.lower() for name in ase.io.formats.ioformats)


def doc_examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOCS.read_text(), flags=re.DOTALL)


def test_every_example_in_output_md_runs(runs, tmp_path, monkeypatch):
    """The examples of docs/output.md, in order, on a real run (run/) and a batch (batch/)."""
    shutil.copytree(runs["h5md"][0], tmp_path / "run")
    shutil.copy(runs["extxyz"][0] / "trajectory.extxyz", tmp_path / "run")
    written = write_batch(tmp_path / "batch")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")  # the thermo plot, without a display
    examples = doc_examples()
    assert len(examples) >= 8
    namespace: dict = {}
    for example in examples:
        exec(compile(example, str(DOCS), "exec"), namespace)

    # The h5py snippet builds the same ase.Atoms as FastMACE's reader.
    ours = read_trajectory("run/trajectory.h5md")
    assert len(namespace["images"]) == len(ours) == 3
    for image, atoms in zip(namespace["images"], ours, strict=True):
        np.testing.assert_allclose(image.positions, atoms.positions, atol=1e-12)
        np.testing.assert_allclose(image.get_velocities(), atoms.get_velocities(), atol=1e-12)
        np.testing.assert_allclose(image.get_forces(), atoms.get_forces(), atol=1e-12)
        assert image.get_potential_energy() == pytest.approx(atoms.get_potential_energy())
    assert len(ase.io.read("run/trajectory.traj", ":")) == 3
    # The view shows system 1 of the batch; read_trajectory picks it too.
    assert namespace["u1"].atoms.n_atoms == 3
    assert [a.info["step"] for a in namespace["system_1"]] == [f.step for f in written]
    assert list(namespace["u"].atoms.elements) == ["Cu"] * 32
