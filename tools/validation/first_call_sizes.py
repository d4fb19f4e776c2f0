"""What a force evaluation at a new size costs, with cuEquivariance's kernel choice fixed.

Batches that fit (issue 15) ran 2,048 replicas as batches of 707, 707 and 634 cells: the first
forces took 54.8 s, 0.4 s and 49.1 s. This asks what makes a size "new" to cuEquivariance: the
same cell again, the same atoms with a different number of edges, a few more atoms. One
process, ``fm.calculator`` on the MP-0-medium template (cuEq, float32), rattled rock-salt NaCl;
each structure is evaluated twice and both calls are timed with the device synchronised. The
first call of one structure is profiled with cProfile (the top functions by own time).

    . .gpu/setup.sh && PYTHONPATH=$PWD/packages/fastmace/src:$PYTHONPATH \\
        python tools/validation/first_call_sizes.py --out $OUT/first-call
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time
from pathlib import Path

import ase.build
import torch

import fastmace as fm
from fastmace.runtime import environment

# (label, repeats of the 8-atom cubic cell, rattle seed)
STRUCTURES = [
    ("12x12x12", (12, 12, 12), 1),
    ("12x12x12, rattled again", (12, 12, 12), 2),
    ("12x12x13", (12, 12, 13), 1),
    ("12x12x14", (12, 12, 14), 1),
    ("12x12x12, once more", (12, 12, 12), 3),
]
PROFILED = "12x12x14"


def nacl(repeats: tuple[int, int, int], seed: int) -> ase.Atoms:
    atoms = ase.build.bulk("NaCl", "rocksalt", a=5.64, cubic=True).repeat(repeats)
    atoms.rattle(0.05, seed=seed)
    return atoms


def timed_forces(atoms: ase.Atoms) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    atoms.get_forces()
    torch.cuda.synchronize()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("first-call"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    choice = environment.configure_cueq_kernel_choice(environment.CUEQ_KERNEL_CHOICE_VALUE)
    calc = fm.calculator("template:mp0-medium", device="cuda", dtype="float32", backend="cueq")
    rows = []
    for label, repeats, seed in STRUCTURES:
        atoms = nacl(repeats, seed)
        atoms.calc = calc
        profile = cProfile.Profile() if label == PROFILED else None
        if profile:
            profile.enable()
        first = timed_forces(atoms)
        if profile:
            profile.disable()
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(25)
            (args.out / "first_call_profile.txt").write_text(text.getvalue())
        atoms.positions += 0.001
        second = timed_forces(atoms)
        rows.append({"structure": label, "atoms": len(atoms), "first_s": first, "second_s": second})
        print(json.dumps(rows[-1]), flush=True)
    record = {"torch": torch.__version__, "cueq_kernel_choice": choice, "calls": rows}
    (args.out / "first_call_sizes.json").write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
