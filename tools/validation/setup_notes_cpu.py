"""When a large request's first progress line appears (issue 33, item 4): 55,296 Cu atoms
(the 32-atom example repeated 12 x 12 x 12), demo model, on the CPU. Each set-up line is
printed with the seconds since the call; stop it once the first forces start:

    OMP_NUM_THREADS=2 timeout 60 python tools/validation/setup_notes_cpu.py
"""

from __future__ import annotations

import io
import sys
import time
from pathlib import Path

import ase.io

import fastmace as fm

EXAMPLE = Path(__file__).parents[2] / "examples" / "cu-fcc-32.extxyz"


class Stamped(io.TextIOBase):
    """Writes each line with the seconds since the call began."""

    def __init__(self, started: float) -> None:
        self.started = started

    def write(self, text: str) -> int:
        for line in text.splitlines():
            if line.strip():
                sys.stdout.write(f"[{time.perf_counter() - self.started:6.1f} s] {line}\n")
                sys.stdout.flush()
        return len(text)


def main() -> None:
    atoms = ase.io.read(EXAMPLE)
    started = time.perf_counter()
    fm.md(
        atoms, repeat=(12, 12, 12), steps=1, temperature_K=300.0, device="cpu",
        progress=Stamped(started), thermo_every=0, trajectory_every=0, restart_every=0,
    )  # fmt: skip


if __name__ == "__main__":
    main()
