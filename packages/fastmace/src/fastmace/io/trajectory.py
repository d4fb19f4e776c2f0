"""Trajectory formats: which one a run writes, opening its writer, and reading either back.

``"auto"`` writes extxyz (text, read by every tool) while atoms x frames stays below
:data:`EXTXYZ_LIMIT`, and H5MD (compressed binary, full precision) above it, where text would
be slow and large. ASE reads the extxyz files itself; :func:`read_trajectory` reads both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import ase

from fastmace.io.frames import Frame

FORMATS = ("auto", "extxyz", "h5md", "none")
EXTXYZ_LIMIT = 1_000_000  # atom-frames; about 80 MB of extxyz text
UNKNOWN_FRAMES = 1_000  # what "auto" assumes when the run's length is not known
FILE_NAMES = {"extxyz": "trajectory.extxyz", "h5md": "trajectory.h5md"}
# What one output step adds to a format's count of kept entries (truncate_trajectory's
# return): extxyz writes a frame per system, H5MD one frame holding every system.
FRAMES_PER_STEP_PER_SYSTEM = {"extxyz": True, "h5md": False}
# A replica-exchange run's frames again, demultiplexed: system r is the walker at rung r.
BY_TEMPERATURE_FILE_NAMES = {
    "extxyz": "trajectory-by-temperature.extxyz", "h5md": "trajectory-by-temperature.h5md",
}  # fmt: skip


class TrajectoryWriter(Protocol):
    """What a run needs from a trajectory writer."""

    def write(self, frame: Frame) -> None: ...

    def sync(self) -> None: ...

    def close(self) -> None: ...


def choose_format(requested: str, n_atoms: int, expected_frames: int | None = None) -> str:
    """The concrete format (``extxyz``, ``h5md`` or ``none``) for ``requested``."""
    if requested not in FORMATS:
        raise ValueError(
            f"unknown trajectory format {requested!r}; choose one of {', '.join(FORMATS)}"
        )
    if requested != "auto":
        return requested
    if n_atoms < 1:
        raise ValueError(f"n_atoms must be positive, got {n_atoms}")
    if expected_frames is not None and expected_frames < 0:
        raise ValueError(f"expected_frames must not be negative, got {expected_frames}")
    frames = UNKNOWN_FRAMES if expected_frames is None else max(expected_frames, 1)
    return "extxyz" if n_atoms * frames < EXTXYZ_LIMIT else "h5md"


def open_writer(trajectory_format: str, path: Path, n_systems: int) -> TrajectoryWriter:
    """A writer appending to ``path`` (created when absent) in a concrete format."""
    if trajectory_format == "extxyz":
        from fastmace.io.extxyz import ExtxyzWriter

        return ExtxyzWriter(path)
    if trajectory_format == "h5md":
        from fastmace.io.h5md import H5MDWriter

        return H5MDWriter(path, n_systems)
    raise ValueError(f"no trajectory writer for format {trajectory_format!r}")


def truncate_trajectory(trajectory_format: str, path: Path, last_step: int) -> int:
    """Drop frames after ``last_step`` (and a half-written last one); returns frames kept."""
    if trajectory_format == "extxyz":
        from fastmace.io.extxyz import truncate_extxyz

        return truncate_extxyz(path, last_step)
    if trajectory_format == "h5md":
        from fastmace.io.h5md import truncate_h5md

        return truncate_h5md(path, last_step)
    raise ValueError(f"cannot truncate a trajectory of format {trajectory_format!r}")


def read_trajectory(path: str | Path, system: int | None = None) -> list[ase.Atoms]:
    """Every frame of a FastMACE trajectory (extxyz or H5MD) as ``ase.Atoms``.

    Frames come step by step, and within a step system by system; ``system`` keeps one system
    of a batch. Each frame's ``info`` has ``step``, ``time_fs`` and ``system``; energies and
    forces, where written, are on ``atoms.calc`` (``get_potential_energy()``, ``get_forces()``).
    The format is told by the file's first bytes (or an .h5/.h5md/.hdf5 name).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no trajectory file at {path}")
    with open(path, "rb") as stream:
        is_hdf5 = stream.read(8) == b"\x89HDF\r\n\x1a\n"
    if is_hdf5 or path.suffix in (".h5", ".h5md", ".hdf5"):
        from fastmace.io.h5md import read_h5md

        return read_h5md(path, system=system)
    from fastmace.io.extxyz import read_extxyz

    frames = read_extxyz(path)
    if system is not None:
        frames = [atoms for atoms in frames if atoms.info.get("system") == system]
    return frames
