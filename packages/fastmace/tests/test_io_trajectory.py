"""Trajectories: extxyz and H5MD round trips, appending, truncation and the format choice."""

from __future__ import annotations

import ase
import ase.io
import h5py
import numpy as np
import pytest
from ase.build import bulk, molecule

from fastmace.io import choose_format, read_trajectory
from fastmace.io.extxyz import ExtxyzWriter, truncate_extxyz
from fastmace.io.frames import make_frame
from fastmace.io.h5md import KJ_PER_MOL, H5MDWriter, truncate_h5md
from fastmace.io.trajectory import FILE_NAMES

FORMATS = tuple(FILE_NAMES)  # every format that writes a file
# extxyz keeps 8 decimals (ASE's writer); H5MD keeps full doubles.
TOLERANCE = {"extxyz": 1e-7, "h5md": 1e-12}


def systems(n_systems: int, seed: int = 0) -> list[ase.Atoms]:
    """A periodic crystal, and (for two) a molecule in a partly periodic box."""
    rng = np.random.default_rng(seed)
    crystal = bulk("Cu", "fcc", a=3.6) * (2, 2, 1)
    crystal.cell[0, 1] = 0.3  # triclinic
    water = molecule("H2O")
    water.center(vacuum=3.0)
    water.pbc = (True, False, True)
    structures = [crystal, water][:n_systems]
    for atoms in structures:
        atoms.rattle(0.05, seed=seed)
        atoms.set_velocities(rng.normal(scale=0.01, size=(len(atoms), 3)) / ase.units.fs)
    return structures


def frames(n_systems: int, steps: range, with_forces: bool = True):
    for step in steps:
        structures = systems(n_systems, seed=step)
        energies = [-1.25 * step - system for system in range(n_systems)]
        forces = [np.full((len(a), 3), 0.5 * step + i) for i, a in enumerate(structures)]
        yield make_frame(step, 0.5 * step, structures, energies, forces if with_forces else None)


def writer(trajectory_format: str, path, n_systems: int):
    if trajectory_format == "extxyz":
        return ExtxyzWriter(path)
    return H5MDWriter(path, n_systems)


def check_same(read: ase.Atoms, atoms: ase.Atoms, tolerance: float) -> None:
    np.testing.assert_allclose(read.positions, atoms.positions, atol=tolerance)
    np.testing.assert_allclose(np.asarray(read.cell), np.asarray(atoms.cell), atol=tolerance)
    np.testing.assert_array_equal(read.pbc, atoms.pbc)
    np.testing.assert_array_equal(read.numbers, atoms.numbers)
    np.testing.assert_allclose(read.get_masses(), atoms.get_masses(), atol=tolerance)
    np.testing.assert_allclose(read.get_velocities(), atoms.get_velocities(), atol=tolerance)


@pytest.mark.parametrize("n_systems", [1, 2])
@pytest.mark.parametrize("trajectory_format", FORMATS)
def test_round_trip(tmp_path, trajectory_format, n_systems):
    path = tmp_path / f"trajectory.{trajectory_format}"
    written = list(frames(n_systems, range(0, 30, 10)))
    output = writer(trajectory_format, path, n_systems)
    for frame in written:
        output.write(frame)
    output.close()

    read = read_trajectory(path)
    assert len(read) == len(written) * n_systems
    for index, atoms in enumerate(read):
        frame, system = written[index // n_systems], index % n_systems
        assert atoms.info["step"] == frame.step
        assert atoms.info["system"] == system
        assert atoms.info["time_fs"] == pytest.approx(frame.time_fs)
        check_same(atoms, frame.atoms[system], TOLERANCE[trajectory_format])
        assert atoms.get_potential_energy() == pytest.approx(frame.energies[system], abs=1e-12)
        np.testing.assert_allclose(atoms.get_forces(), frame.forces[system], atol=1e-7)

    one = read_trajectory(path, system=n_systems - 1)
    assert [atoms.info["step"] for atoms in one] == [0, 10, 20]
    assert {atoms.info["system"] for atoms in one} == {n_systems - 1}


def test_extxyz_is_read_by_ase_itself(tmp_path):
    path = tmp_path / "trajectory.extxyz"
    output = ExtxyzWriter(path)
    written = list(frames(2, range(3)))
    for frame in written:
        output.write(frame)
    output.close()
    every = ase.io.read(path, ":")
    assert len(every) == 6
    second_system = ase.io.read(path, "1::2")  # system i of n: index f"{i}::{n}"
    assert [int(atoms.info["step"]) for atoms in second_system] == [0, 1, 2]
    assert second_system[2].get_potential_energy() == pytest.approx(written[2].energies[1])
    np.testing.assert_allclose(second_system[2].get_forces(), written[2].forces[1])


def test_writer_does_not_change_the_callers_atoms(tmp_path):
    frame = next(frames(1, range(1)))
    before = frame.atoms[0].copy()
    output = ExtxyzWriter(tmp_path / "t.extxyz")
    output.write(frame)
    output.close()
    assert frame.atoms[0].calc is None
    assert frame.atoms[0].info == before.info


@pytest.mark.parametrize("trajectory_format", FORMATS)
def test_append_across_two_writer_sessions(tmp_path, trajectory_format):
    path = tmp_path / f"trajectory.{trajectory_format}"
    for steps in (range(0, 3), range(3, 5)):
        output = writer(trajectory_format, path, 2)
        for frame in frames(2, steps):
            output.write(frame)
        output.close()
    steps = [atoms.info["step"] for atoms in read_trajectory(path)]
    assert steps == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]


def test_h5md_layout_follows_h5md_1_1(tmp_path):
    path = tmp_path / "trajectory.h5md"
    output = H5MDWriter(path, 2)
    for frame in frames(2, range(2)):
        output.write(frame)
    output.close()
    with h5py.File(path, "r") as file:
        assert list(file["h5md"].attrs["version"]) == [1, 1]
        assert file["h5md/creator"].attrs["name"] == "fastmace"
        assert "name" in file["h5md/author"].attrs
        assert sorted(file["particles"]) == ["system_0", "system_1"]
        water = file["particles/system_1"]
        assert list(water["box"].attrs["boundary"]) == ["periodic", "none", "periodic"]
        assert water["box/edges/value"].shape == (2, 3, 3)
        position = water["position/value"]
        assert position.shape == (2, 3, 3)
        assert position.maxshape == (None, 3, 3)
        assert position.compression == "gzip"
        assert position.chunks[0] == 1  # one frame per chunk: appends never rewrite old data
        # str, not bytes: MDAnalysis looks units up as str (issue 16).
        assert position.attrs["unit"] == "Angstrom"
        assert list(water["position/step"][()]) == [0, 1]
        assert water["position/time"].attrs["unit"] == "fs"
        assert water["force/value"].attrs["unit"] == "kJ mol-1 Angstrom-1"
        assert list(water["species"][()]) == [8, 1, 1]
        assert {"velocity", "force", "mass"} <= set(water)
        energy = file["observables/system_1/potential_energy"]
        assert energy["value"].attrs["unit"] == "kJ mol-1"
        np.testing.assert_allclose(energy["value"][()] * KJ_PER_MOL, [-1.0, -2.25])


def test_h5md_of_one_system_uses_the_names_mdanalysis_reads(tmp_path):
    path = tmp_path / "trajectory.h5md"
    output = H5MDWriter(path, 1)
    output.write(next(frames(1, range(1))))
    output.close()
    with h5py.File(path, "r") as file:
        assert list(file["particles"]) == ["trajectory"]
        assert list(file["observables"]) == ["potential_energy"]


def test_h5md_refuses_to_append_to_another_layout(tmp_path):
    path = tmp_path / "trajectory.h5md"
    output = H5MDWriter(path, 2)
    output.write(next(frames(2, range(1))))
    output.close()
    with pytest.raises(ValueError, match=r"particle groups \['system_0', 'system_1'\]"):
        H5MDWriter(path, 1)


def test_h5md_refuses_frames_that_change_what_is_stored(tmp_path):
    output = H5MDWriter(tmp_path / "t.h5md", 1)
    output.write(next(frames(1, range(1))))
    with pytest.raises(ValueError, match="has forces from its first frame on"):
        output.write(next(frames(1, range(1, 2), with_forces=False)))
    other = systems(2)[1]
    with pytest.raises(ValueError, match="atoms differ"):
        output.write(make_frame(2, 1.0, [other], [0.0], [np.zeros((3, 3))]))
    output.close()
    assert [atoms.info["step"] for atoms in read_trajectory(tmp_path / "t.h5md")] == [0]


@pytest.mark.parametrize("trajectory_format", FORMATS)
def test_truncate_drops_frames_after_the_step_and_a_torn_last_frame(tmp_path, trajectory_format):
    path = tmp_path / f"trajectory.{trajectory_format}"
    output = writer(trajectory_format, path, 2)
    for frame in frames(2, range(0, 50, 10)):
        output.write(frame)
    output.close()
    if trajectory_format == "extxyz":
        with open(path, "a") as stream:
            stream.write("3\nLattice=")  # a crash in the middle of a frame
        assert truncate_extxyz(path, 20) == 6  # frames, counting each system
    else:
        assert truncate_h5md(path, 20) == 3
    assert [atoms.info["step"] for atoms in read_trajectory(path)] == [0, 0, 10, 10, 20, 20]


def test_h5md_truncate_drops_an_entry_without_its_step(tmp_path):
    path = tmp_path / "trajectory.h5md"
    output = H5MDWriter(path, 1)
    for frame in frames(1, range(3)):
        output.write(frame)
    output.close()
    with h5py.File(path, "r+") as file:  # a crash after the value grew, before the step did
        value = file["particles/trajectory/position/value"]
        value.resize(4, axis=0)
    truncate_h5md(path, 100)
    with h5py.File(path, "r") as file:
        assert file["particles/trajectory/position/value"].shape[0] == 3
    assert len(read_trajectory(path)) == 3


def test_choose_format():
    assert choose_format("auto", n_atoms=100, expected_frames=1000) == "extxyz"
    assert choose_format("auto", n_atoms=10_000, expected_frames=1000) == "h5md"
    assert choose_format("auto", n_atoms=100_000) == "h5md"  # 1000 frames assumed
    assert choose_format("h5md", n_atoms=1) == "h5md"
    with pytest.raises(ValueError, match="unknown trajectory format 'xyz'"):
        choose_format("xyz", n_atoms=1)


def test_frame_input_is_checked():
    atoms = systems(2)
    with pytest.raises(ValueError, match="one energy per system"):
        make_frame(0, 0.0, atoms, energies=[1.0])
    with pytest.raises(ValueError, match="forces of all atoms must have shape"):
        make_frame(0, 0.0, atoms, forces=np.zeros((2, 3)))
    with pytest.raises(ValueError, match="non-negative integer"):
        make_frame(-1, 0.0, atoms)
    joined = make_frame(0, 0.0, atoms, forces=np.arange(3.0 * 7).reshape(7, 3))
    assert [f.shape for f in joined.forces] == [(4, 3), (3, 3)]


def test_read_trajectory_of_a_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no trajectory file"):
        read_trajectory(tmp_path / "nothing.extxyz")


def test_h5md_of_an_earlier_version_is_still_read(tmp_path):
    """Before issue 16: system_0 for one system, eV, units and boundary as fixed-length bytes."""
    path = tmp_path / "trajectory.h5md"
    written = list(frames(1, range(2)))
    output = H5MDWriter(path, 1)
    for frame in written:
        output.write(frame)
    output.close()
    with h5py.File(path, "r+") as file:
        file.move("particles/trajectory", "particles/system_0")
        file.create_group("observables/system_0")
        file.move("observables/potential_energy", "observables/system_0/potential_energy")
        for name, unit in (("particles/system_0/force/value", b"eV Angstrom-1"),
                           ("observables/system_0/potential_energy/value", b"eV")):  # fmt: skip
            file[name][...] = file[name][()] * KJ_PER_MOL
            file[name].attrs["unit"] = np.bytes_(unit)
        box = file["particles/system_0/box"]
        box.attrs["boundary"] = np.array([b"periodic"] * 3, dtype="S8")
    for atoms, frame in zip(read_trajectory(path), written, strict=True):
        check_same(atoms, frame.atoms[0], 1e-12)
        assert atoms.get_potential_energy() == pytest.approx(frame.energies[0], abs=1e-12)
        np.testing.assert_allclose(atoms.get_forces(), frame.forces[0], atol=1e-12)


def test_every_format_says_its_file_and_what_it_counts():
    from fastmace.io import trajectory

    written = set(trajectory.FORMATS) - {"auto", "none"}
    assert set(trajectory.FILE_NAMES) == written == set(trajectory.BY_TEMPERATURE_FILE_NAMES)
    assert set(trajectory.FRAMES_PER_STEP_PER_SYSTEM) == written
