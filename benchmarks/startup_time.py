"""Time from ``fastmace md`` start to the MD loop, and where it goes, on a GPU machine.

Runs the real command line twice on the same structure (rattled rock-salt NaCl, MP-0-medium
template, float32, cuEq, a few steps, no trajectory): the first run fills the cache, the
second is the warm start the performance issue targets. Each run is a child process under
``cProfile``; the report lists wall time and the cumulative time of FastMACE's start-up phases
(model load and conversion, checks, species specialisation, neighbour list, the first block,
graph capture), read from the profile by function name.

    python benchmarks/startup_time.py --atoms 13824 --out $OUT/startup
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import subprocess
import sys
import time
from pathlib import Path

import ase.build
import ase.io

# (phase, module path fragment, function name) read from the profile's cumulative times.
PHASES = (
    ("fm.md, whole call", "fastmace/api", "md"),
    ("plan (planner)", "fastmace/planner/decide", "make_plan"),
    ("model load (fm.load)", "fastmace/models/load", "load"),
    ("backend conversion and its check", "fastmace/models/backends", "convert_checked"),
    ("gate (float64 e3nn comparison)", "fastmace/gate/check", "run_gate"),
    ("species specialisation", "fastmace/dynamics/species_linear", "specialise_for_species"),
    ("potential check", "fastmace/dynamics/potential", "check_potential"),
    ("Simulation set-up", "fastmace/simulation", "__init__"),
    ("neighbour list build", "fastmace/dynamics/neighbours", "build"),
    ("Simulation.run", "fastmace/simulation", "run"),
    ("graph capture", "fastmace/dynamics/engine", "_capture"),
    ("blocks run (incl. warm-up and capture)", "fastmace/dynamics/engine", "run_block"),
)


def nacl(atoms: int) -> ase.Atoms:
    repeat = round((atoms / 8) ** (1 / 3))
    if 8 * repeat**3 != atoms:
        raise SystemExit(f"--atoms must be 8 n^3 (rock-salt cubic cells), not {atoms}")
    structure = ase.build.bulk("NaCl", "rocksalt", a=5.64, cubic=True).repeat(repeat)
    structure.rattle(0.05, seed=1)
    return structure


def phase_times(profile: Path) -> dict[str, float]:
    """Cumulative seconds per phase; a phase whose function did not run is left out."""
    stats = pstats.Stats(str(profile))
    found: dict[str, float] = {}
    for (filename, _, function), row in stats.stats.items():  # type: ignore[attr-defined]
        cumulative = row[3]
        for phase, fragment, name in PHASES:
            if function == name and fragment in filename.replace(os.sep, "/"):
                found[phase] = max(found.get(phase, 0.0), cumulative)
    return found


def top_functions(profile: Path, count: int = 40) -> list[str]:
    """The ``count`` largest cumulative times of FastMACE, mace and torch.compile functions."""
    stats = pstats.Stats(str(profile))
    rows = []
    for (filename, line, function), row in stats.stats.items():  # type: ignore[attr-defined]
        if any(key in filename for key in ("fastmace", "mace", "cuequivariance", "_inductor")):
            rows.append((row[3], f"{row[3]:8.2f} s  {function}  {filename}:{line}"))
    return [text for _, text in sorted(rows, reverse=True)[:count]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--atoms", type=int, default=13824)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--extra", nargs="*", default=[], help="more fastmace md options")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    structure = args.out / f"nacl-{args.atoms}.extxyz"
    ase.io.write(structure, nacl(args.atoms))
    runs = []
    for name in ("cold", "warm"):
        profile = args.out / f"{name}.prof"
        command = [
            sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "fastmace", "md",
            str(structure), "--model", "template:mp0-medium", "--dtype", "float32",
            "--backend", "cueq", "--steps", str(args.steps), "--traj-every", "0",
            "--temperature", "300",
            "--output", str(args.out / f"run-{name}"), *args.extra,
        ]  # fmt: skip
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        wall = time.perf_counter() - start
        (args.out / f"{name}.log").write_text(done.stdout + done.stderr)
        record = {"run": name, "exit": done.returncode, "wall_s": wall}
        if profile.exists():
            record["phases_s"] = phase_times(profile)
            (args.out / f"{name}-top.txt").write_text("\n".join(top_functions(profile)) + "\n")
        runs.append(record)
        print(json.dumps(record, indent=1), flush=True)
    summary = {"atoms": args.atoms, "steps": args.steps, "extra": args.extra, "runs": runs}
    (args.out / "startup_time.json").write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
