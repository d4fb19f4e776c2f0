"""H5MD 1.1 trajectories (HDF5 through h5py): compressed, chunked by frame, appendable.

Layout, one particle group per system of the batch: ``trajectory`` for a run of one system,
``system_<i>`` for system ``i`` of a batch of several::

    h5md/                      version = [1, 1]; author/, creator/ (name, version)
    particles/<group>/
        box/                   dimension = 3, boundary = ["periodic" | "none"] * 3
            edges/{value (T, 3, 3), step (T,), time (T,)}   rows are the lattice vectors
        position/{value (T, N, 3), step, time}              Angstrom
        velocity/{value, step, time}                        Angstrom fs-1 (if velocities given)
        force/{value, step, time}                           kJ mol-1 Angstrom-1 (if forces given)
        species (N,)                                        atomic numbers
        mass (N,)                                           u (amu)
    observables/potential_energy/{value (T,), step, time}            kJ mol-1, one system
    observables/system_<i>/potential_energy/{value (T,), step, time} kJ mol-1, a batch

The choices are the ones MDAnalysis's H5MD reader (2.11) understands, so that
``MDAnalysis.Universe(path)`` reads a one-system file with units converted: it reads a file
without a topology only from ``particles/trajectory``; it compares ``unit`` attributes as
``str``, so they are variable-length strings; and it knows no eV, so forces (and, to keep
the file consistent, energies) are in kJ/mol, its own unit. A batch's system is shown to
such readers by :func:`system_view`. Times are in fs and every value carries its unit.

Per-atom values are gzip-compressed with the shuffle filter, one frame per chunk, so that an
append writes new chunks and never rewrites old ones. Within one append the ``step`` entry is
written last: an entry without its step is incomplete and :func:`truncate_h5md` drops it.
ASE has no H5MD reader (3.29); :func:`read_h5md` gives ``ase.Atoms`` back (energies in eV,
forces in eV/Angstrom).
"""

from __future__ import annotations

import getpass
import os
import re
from pathlib import Path
from typing import Any

import ase
import ase.units
import numpy as np
from ase.calculators.singlepoint import SinglePointCalculator

from fastmace._version import __version__
from fastmace.io.frames import Frame

_CHUNK_BYTES = 1 << 20  # per-atom chunks of about 1 MiB: big enough to compress well
_SCALAR_CHUNK = 128  # frames per chunk of the small series: step, time, box, energy
# gzip level 1: on float64 coordinates higher levels gain almost nothing (about 13 % in all).
_COMPRESSION = {"compression": "gzip", "compression_opts": 1, "shuffle": True}
_SYSTEM_GROUP = re.compile(r"^system_(\d+)$")
# MDAnalysis reads a file without a topology only from this group (its parse_n_atoms).
SINGLE_GROUP = "trajectory"

KJ_PER_MOL = ase.units.kJ / ase.units.mol  # in eV
# Unit spellings as MDAnalysis's H5MD reader translates them (H5MD's units module).
UNITS = {
    "length": "Angstrom",
    "time": "fs",
    "velocity": "Angstrom fs-1",
    "force": "kJ mol-1 Angstrom-1",
    "energy": "kJ mol-1",
    "mass": "u",
}
# One stored energy (force) unit in eV (eV/Angstrom); the eV ones are earlier versions' files.
_IN_EV = {
    "kJ mol-1": KJ_PER_MOL,
    "kJ mol-1 Angstrom-1": KJ_PER_MOL,
    "eV": 1.0,
    "eV Angstrom-1": 1.0,
}


def system_group(system: int, n_systems: int) -> str:
    """The particle group name of system ``system`` of a batch of ``n_systems``."""
    return SINGLE_GROUP if n_systems == 1 else f"system_{system}"


def energy_path(system: int, n_systems: int) -> str:
    """Where system ``system``'s potential energy is: at the top for a lone system."""
    if n_systems == 1:
        return "observables/potential_energy"
    return f"observables/{system_group(system, n_systems)}/potential_energy"


class H5MDWriter:
    """Appends frames of a batch of ``n_systems`` systems to an H5MD file (created if absent).

    The elements a system has (velocity, force, potential energy) are fixed by its first
    frame; later frames must carry the same ones.
    """

    def __init__(self, path: Path, n_systems: int) -> None:
        import h5py  # imported here: only H5MD output needs it

        self.path = Path(path)
        self.n_systems = n_systems
        self._names = [system_group(system, n_systems) for system in range(n_systems)]
        self._file = h5py.File(self.path, "a")
        if "h5md" not in self._file:
            _write_header(self._file)
        self._particles = self._file.require_group("particles")
        stray = sorted(set(self._particles) - set(self._names))
        if stray:
            self._file.close()
            raise ValueError(
                f"{self.path} holds particle groups {stray}, not those of a run of "
                f"{n_systems} system(s) {self._names} (an earlier FastMACE's layout?): "
                f"continue it with that version, or start a new run directory"
            )

    def write(self, frame: Frame) -> None:
        if len(frame.atoms) != self.n_systems:
            raise ValueError(
                f"this H5MD trajectory holds {self.n_systems} systems, "
                f"the frame at step {frame.step} has {len(frame.atoms)}"
            )
        # Check every system before touching the file, so a bad frame leaves no partial entry.
        for system, atoms in enumerate(frame.atoms):
            if self._names[system] in self._particles:
                self._check(atoms, frame, system)
        for system, atoms in enumerate(frame.atoms):
            if self._names[system] not in self._particles:
                self._create_system(atoms, frame, system)
            self._append_system(atoms, frame, system)
        self._file.flush()

    def sync(self) -> None:
        """Flush HDF5's buffers and fsync the file (any descriptor of it will do)."""
        self._file.flush()
        descriptor = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)

    def close(self) -> None:
        if self._file.id.valid:
            self._file.close()

    def _create_system(self, atoms: ase.Atoms, frame: Frame, system: int) -> None:
        import h5py

        group = self._particles.create_group(self._names[system])
        box = group.create_group("box")
        box.attrs["dimension"] = np.int32(3)
        boundary = ["periodic" if periodic else "none" for periodic in atoms.pbc]
        box.attrs["boundary"] = np.array(boundary, dtype=h5py.string_dtype())
        _create_element(box, "edges", (3, 3), UNITS["length"], compress=False)
        n_atoms = len(atoms)
        _create_element(group, "position", (n_atoms, 3), UNITS["length"], compress=True)
        if atoms.has("momenta"):
            _create_element(group, "velocity", (n_atoms, 3), UNITS["velocity"], compress=True)
        if frame.forces is not None:
            _create_element(group, "force", (n_atoms, 3), UNITS["force"], compress=True)
        group.create_dataset("species", data=atoms.get_atomic_numbers().astype(np.int32))
        group.create_dataset("mass", data=atoms.get_masses()).attrs["unit"] = UNITS["mass"]
        if frame.energies is not None:
            path = energy_path(system, self.n_systems)
            parent, name = path.rsplit("/", 1)
            _create_element(
                self._file.require_group(parent), name, (), UNITS["energy"], compress=False
            )

    def _check(self, atoms: ase.Atoms, frame: Frame, system: int) -> None:
        group = self._particles[self._names[system]]
        where = f"system {system} at step {frame.step}"
        if not np.array_equal(group["species"][()], atoms.get_atomic_numbers()):
            raise ValueError(f"{where}: the atoms differ from those earlier in the trajectory")
        boundary = [_as_str(value) == "periodic" for value in group["box"].attrs["boundary"]]
        if boundary != [bool(value) for value in atoms.pbc]:
            raise ValueError(f"{where}: pbc {atoms.pbc} differs from the trajectory's {boundary}")
        has_energy = energy_path(system, self.n_systems) in self._file
        for label, stored, given in (
            ("velocities", "velocity" in group, atoms.has("momenta")),
            ("forces", "force" in group, frame.forces is not None),
            ("energies", has_energy, frame.energies is not None),
        ):
            if stored != given:
                state = "has" if stored else "has no"
                raise ValueError(
                    f"{where}: the trajectory {state} {label} from its first frame on, "
                    f"and every frame must match it"
                )

    def _append_system(self, atoms: ase.Atoms, frame: Frame, system: int) -> None:
        group = self._particles[self._names[system]]
        _append(group["box/edges"], frame, np.asarray(atoms.cell, dtype=np.float64))
        _append(group["position"], frame, atoms.get_positions())
        if "velocity" in group:
            _append(group["velocity"], frame, atoms.get_velocities() * ase.units.fs)
        if "force" in group:
            _append(group["force"], frame, frame.forces[system] / KJ_PER_MOL)
        if frame.energies is not None:
            element = self._file[energy_path(system, self.n_systems)]
            _append(element, frame, np.float64(frame.energies[system] / KJ_PER_MOL))


def _write_header(file: Any) -> None:
    h5md = file.create_group("h5md")
    h5md.attrs["version"] = np.array([1, 1], dtype=np.int32)
    try:
        author = getpass.getuser()
    except (KeyError, OSError):  # no user name in some containers
        author = "unknown"
    # Python str: h5py stores variable-length strings, which readers get back as str.
    h5md.create_group("author").attrs["name"] = author
    creator = h5md.create_group("creator")
    creator.attrs["name"] = "fastmace"
    creator.attrs["version"] = __version__


def _create_element(
    parent: Any, name: str, shape: tuple[int, ...], unit: str, *, compress: bool
) -> None:
    """An empty time-dependent element: ``value``, ``step`` and ``time``, growable in time."""
    element = parent.create_group(name)
    if compress:
        row_bytes = 8 * int(np.prod(shape[1:], dtype=np.int64))
        rows = max(1, min(shape[0], _CHUNK_BYTES // row_bytes))
        chunks = (1, rows, *shape[1:])
        options = _COMPRESSION
    else:
        chunks = (_SCALAR_CHUNK, *shape)
        options = {}
    value = element.create_dataset(
        "value", shape=(0, *shape), maxshape=(None, *shape), dtype="f8", chunks=chunks, **options
    )
    value.attrs["unit"] = unit
    series = {"shape": (0,), "maxshape": (None,), "chunks": (_SCALAR_CHUNK,)}
    element.create_dataset("step", dtype="i8", **series)
    element.create_dataset("time", dtype="f8", **series).attrs["unit"] = UNITS["time"]


def _append(element: Any, frame: Frame, value: np.ndarray) -> None:
    index = element["step"].shape[0]
    # The step series grows last: its length counts the entries that are complete.
    for dataset, entry in (("value", value), ("time", frame.time_fs), ("step", frame.step)):
        element[dataset].resize(index + 1, axis=0)
        element[dataset][index] = entry


def truncate_h5md(path: Path, last_step: int) -> int:
    """Drop entries after ``last_step`` and incomplete ones; returns the position frames kept."""
    import h5py

    kept_positions = 0
    with h5py.File(Path(path), "r+") as file:
        elements: list[Any] = []

        def collect(name: str, item: Any) -> None:
            if isinstance(item, h5py.Group) and {"value", "step"} <= set(item.keys()):
                elements.append(item)

        file.visititems(collect)
        for element in elements:
            keep = _complete_entries(element, last_step)
            for dataset in ("value", "step", "time"):
                if dataset in element and element[dataset].shape[0] > keep:
                    element[dataset].resize(keep, axis=0)
            if element.name.endswith("/position"):
                kept_positions = keep
    return kept_positions


def _complete_entries(element: Any, last_step: int) -> int:
    """How many leading entries are complete, in increasing step order and at most last_step."""
    steps = element["step"][()]
    lengths = [element[name].shape[0] for name in ("value", "time") if name in element]
    limit = min([len(steps), *lengths])
    keep = 0
    previous = -1
    for step in steps[:limit]:
        if step <= previous or step > last_step:
            break
        previous = step
        keep += 1
    return keep


def read_h5md(
    path: Path, system: int | None = None, frames: slice | None = None
) -> list[ase.Atoms]:
    """Frames of an H5MD trajectory as ``ase.Atoms``, step by step and system by system.

    ``system`` picks one system of the batch; ``frames`` slices each system's frames (read
    from disk, so a slice of a large file stays cheap). Velocities, forces, masses and the
    potential energy are restored where stored; ``info`` holds step, time_fs and system.
    """
    import h5py

    with h5py.File(Path(path), "r") as file:
        names = _particle_groups(file)
        if system is not None and not 0 <= system < len(names):
            raise ValueError(f"{path} holds systems 0 to {len(names) - 1}, not {system}")
        per_system = [
            _read_system(file, name, index, frames)
            for index, name in enumerate(names)
            if system is None or index == system
        ]
    longest = max((len(series) for series in per_system), default=0)
    return [series[t] for t in range(longest) for series in per_system if t < len(series)]


def system_view(path: Path, system: int, view: Path) -> Path:
    """Write ``view``: a small H5MD file that shows system ``system`` of ``path`` alone.

    Readers that take a file's first or a fixed particle group (MDAnalysis:
    ``Universe(view)``) then read that system. The view holds HDF5 external links to
    ``path``'s data, named relative to the view's folder, and copies nothing: keep the two
    files in place together. ``view`` must not exist yet.
    """
    import h5py

    path, view = Path(path), Path(view)
    with h5py.File(path, "r") as file:
        names = _particle_groups(file)
        if not 0 <= system < len(names):
            raise ValueError(f"{path} holds systems 0 to {len(names) - 1}, not {system}")
        name = names[system]
        energy = next((p for p in _energy_paths(file, name) if p in file), None)
        with h5py.File(view, "x") as out:
            file.copy(file["h5md"], out, "h5md")
            target = os.path.relpath(path.resolve(), view.resolve().parent)
            out.create_group("particles")[SINGLE_GROUP] = h5py.ExternalLink(
                target, f"/particles/{name}"
            )
            if energy is not None:
                out.create_group("observables")["potential_energy"] = h5py.ExternalLink(
                    target, f"/{energy}"
                )
    return view


def _particle_groups(file: Any) -> list[str]:
    if "particles" not in file:
        return []
    names = list(file["particles"].keys())
    numbered = [name for name in names if _SYSTEM_GROUP.match(name)]
    if len(numbered) == len(names):
        return sorted(names, key=lambda name: int(_SYSTEM_GROUP.match(name).group(1)))
    return sorted(names)


def _series(element: Any, name: str, selection: np.ndarray) -> np.ndarray:
    """Entries ``selection`` of a time-dependent element, read as one contiguous block."""
    if selection.size == 0:
        return np.empty((0, *element[name].shape[1:]), dtype=element[name].dtype)
    low, high = int(selection.min()), int(selection.max()) + 1
    return element[name][low:high][selection - low]


def _read_system(file: Any, name: str, index: int, frames: slice | None) -> list[ase.Atoms]:
    group = file["particles"][name]
    position = group["position"]
    n_frames = min(position["step"].shape[0], position["value"].shape[0])
    selection = np.arange(n_frames)[frames if frames is not None else slice(None)]
    positions = _series(position, "value", selection)
    steps = _series(position, "step", selection)
    times = _series(position, "time", selection) if "time" in position else None
    numbers = group["species"][()]
    masses = group["mass"][()] if "mass" in group else None
    cells, pbc = _box(group, selection)
    velocities = _series(group["velocity"], "value", selection) if "velocity" in group else None
    forces = None
    if "force" in group:
        forces = _series(group["force"], "value", selection) * _in_ev(group["force/value"])
    energies = _energies_by_step(file, name)

    structures = []
    for row, step in enumerate(steps):
        atoms = ase.Atoms(
            numbers=numbers, positions=positions[row], cell=cells[row], pbc=pbc, masses=masses
        )
        if velocities is not None:
            atoms.set_velocities(velocities[row] / ase.units.fs)
        energy = energies.get(int(step))
        if energy is not None or forces is not None:
            atoms.calc = SinglePointCalculator(
                atoms, energy=energy, forces=None if forces is None else forces[row]
            )
        atoms.info.update(step=int(step), system=index)
        if times is not None:
            atoms.info["time_fs"] = float(times[row])
        structures.append(atoms)
    return structures


def _box(group: Any, selection: np.ndarray) -> tuple[np.ndarray, list[bool]]:
    """Cells (one per selected frame) and pbc of a particle group; no box means no cell."""
    import h5py

    if "box" not in group:
        return np.zeros((len(selection), 3, 3)), [False] * 3
    box = group["box"]
    boundary = box.attrs.get("boundary", ["none"] * 3)
    pbc = [_as_str(value) == "periodic" for value in boundary]
    edges = box.get("edges")
    if edges is None:
        cells = np.zeros((len(selection), 3, 3))
    elif isinstance(edges, h5py.Group):  # a time-dependent element
        cells = _series(edges, "value", selection)
    else:  # a fixed box
        cells = np.broadcast_to(edges[()], (len(selection), *edges.shape))
    if cells.ndim == 2:  # H5MD's cuboid box: the edge lengths only
        cells = np.stack([np.diag(row) for row in cells])
    return cells, pbc


def _as_str(value: Any) -> str:
    """A string attribute as str: earlier versions stored fixed-length bytes."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _in_ev(dataset: Any) -> float:
    """The factor that turns ``dataset``'s energies (forces) into eV (eV/Angstrom)."""
    unit = _as_str(dataset.attrs.get("unit", "eV"))
    if unit not in _IN_EV:
        raise ValueError(f"{dataset.name}: unit {unit!r} is not one of {sorted(_IN_EV)}")
    return _IN_EV[unit]


def _energy_paths(file: Any, name: str) -> list[str]:
    """Where particle group ``name``'s potential energy may be."""
    paths = [f"observables/{name}/potential_energy"]
    if len(file["particles"]) == 1:  # a lone system's energy is at the top
        paths.append("observables/potential_energy")
    return paths


def _energies_by_step(file: Any, name: str) -> dict[int, float]:
    for path in _energy_paths(file, name):
        if path not in file:
            continue
        element = file[path]
        count = min(element["step"].shape[0], element["value"].shape[0])
        steps = element["step"][:count]
        values = element["value"][:count] * _in_ev(element["value"])
        return {int(step): float(value) for step, value in zip(steps, values, strict=True)}
    return {}
