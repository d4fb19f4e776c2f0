"""Extended XYZ trajectories, as ASE writes and reads them: one text frame per system and step.

Frames are ordered step by step and, within a step, system by system. Each frame's comment line
carries ``step``, ``time_fs`` and ``system``, plus ``energy`` when it was given; forces, masses
and momenta are columns. ``ase.io.read(path, f"{i}::{n_systems}")`` reads system ``i``.
ASE writes 8 decimals, so positions are kept to 1e-8 Å; H5MD keeps full double precision.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import ase
import ase.io

from fastmace.io.frames import Frame

_STEP = re.compile(rb"(?:^|\s)step=(\d+)(?:\s|$)")


class ExtxyzWriter:
    """Appends frames to an extxyz file; each :meth:`write` is flushed to the OS."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._stream = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (held open)

    def write(self, frame: Frame) -> None:
        for system, atoms in enumerate(frame.atoms):
            record = atoms.copy()  # never change the caller's structure
            record.calc = None
            # Ours first, so truncation finds this step= before any text the caller's info holds.
            ours = {"step": frame.step, "time_fs": frame.time_fs, "system": system}
            record.info = {**ours, **{k: v for k, v in record.info.items() if k not in ours}}
            if frame.energies is not None:
                record.info["energy"] = frame.energies[system]
            if frame.forces is not None:
                record.arrays["forces"] = frame.forces[system]
            ase.io.write(self._stream, record, format="extxyz")
        self._stream.flush()

    def sync(self) -> None:
        """Make every frame written so far durable (before a restart refers to them)."""
        self._stream.flush()
        os.fsync(self._stream.fileno())

    def close(self) -> None:
        self._stream.close()


def truncate_extxyz(path: Path, last_step: int) -> int:
    """Drop frames after ``last_step`` and a half-written last frame; returns frames kept."""
    path = Path(path)
    kept = 0
    cut = None
    with open(path, "rb") as stream:
        while True:
            start = stream.tell()
            count_line = stream.readline()
            if not count_line:
                break
            comment = stream.readline()
            if not count_line.endswith(b"\n") or not comment.endswith(b"\n"):
                cut = start  # a frame cut short by a crash
                break
            try:
                n_atoms = int(count_line)
            except ValueError:
                raise ValueError(
                    f"{path} is damaged at byte {start}: expected an atom count, "
                    f"found {count_line[:40]!r}"
                ) from None
            match = _STEP.search(comment)
            if match is None:
                raise ValueError(f"{path}: the frame at byte {start} has no step= in its comment")
            complete = all(stream.readline().endswith(b"\n") for _ in range(n_atoms))
            if not complete or int(match.group(1)) > last_step:
                cut = start
                break
            kept += 1
    if cut is not None:
        os.truncate(path, cut)
    return kept


def read_extxyz(path: Path) -> list[ase.Atoms]:
    """All frames of an extxyz trajectory, with ``step``, ``time_fs`` and ``system`` in info."""
    path = Path(path)
    if path.stat().st_size == 0:
        return []
    frames = ase.io.read(path, ":", format="extxyz")
    for atoms in frames:
        # ASE parses the comment's numbers as NumPy scalars; give plain Python ones back.
        for key, kind in (("step", int), ("system", int), ("time_fs", float)):
            if key in atoms.info:
                atoms.info[key] = kind(atoms.info[key])
    return frames
