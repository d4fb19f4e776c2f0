"""Replicas on one GPU and spread over two: atom-steps per second.

Issue 15's multi-GPU benchmark, for the two-H200 machine: N replicas of the 216-atom NaCl cell
(MP-0-medium template, random weights, cuEq, float32, Langevin 300 K, 1 fs, no trajectory)
through ``fm.md`` with ``gpus=1`` and then ``gpus=2``, in one call. Each part's steady speed
(graph replays only) comes from its run directory's ``metadata.json``; the request's
atom-steps per second is the sum over parts. (That each system follows the same trajectory
on one GPU or two is checked by the gpu-marked tests of ``tests/test_spread.py``, over a few
steps: over a thousand the dynamics' chaos amplifies rounding differences.)

    . .gpu/setup.sh && PYTHONPATH=$PWD/packages/fastmace/src:$PYTHONPATH \\
        python benchmarks/gpus_throughput.py --replicas 64,256 --out $OUT/gpus

Results: ``gpus_throughput.json`` (a ``cases`` list like md_speed.py's) and ``.md``.
"""

from __future__ import annotations

import argparse
import io
import json
import time
from pathlib import Path

import torch
from profile_step import nacl

import fastmace as fm

MODEL = "mp0-medium"
CELL_ATOMS = 216


def part_directories(run: Path) -> list[Path]:
    """The run directories a request wrote: its own, or one per GPU."""
    parts = sorted(run.glob("gpu-*"), key=lambda path: int(path.name[4:]))
    return parts or [run]


def atom_steps_per_s(run: Path) -> float:
    """Sum over the parts of their atoms times their steady steps per second."""
    total = 0.0
    for part in part_directories(run):
        metadata = json.loads((part / "metadata.json").read_text())
        atoms = sum(entry["atoms"] for entry in metadata["structures"])
        total += atoms * metadata["timings"]["steps_per_s"]
    return total


def run_case(replicas: int, gpus: int, steps: int, out: Path) -> dict:
    run = out / f"replicas-{replicas}-gpus-{gpus}"
    tick = time.perf_counter()
    fm.md(
        nacl(CELL_ATOMS), model=f"template:{MODEL}", replicas=replicas, steps=steps,
        temperature_K=300.0, dtype="float32", backend="cueq", gpus=gpus, seed=0,
        trajectory_every=0, thermo_every=steps, restart_every=0, output=run,
        progress=io.StringIO(),
    )  # fmt: skip
    wall = time.perf_counter() - tick
    rate = atom_steps_per_s(run)
    case = {
        "model": MODEL, "atoms": replicas * CELL_ATOMS, "path": "fastmace",
        "variant": f"cueq-replicas-{replicas}-gpus-{gpus}", "status": "ok",
        "ms_per_step": 1000 * replicas * CELL_ATOMS / rate if rate else None,
        "replicas": replicas, "gpus": gpus, "atom_steps_per_s": rate, "wall_s": wall,
        "steps": steps,
    }  # fmt: skip
    return case


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replicas", default="64,256")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/gpus"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cases: list[dict] = []
    lines = [
        f"# Replicas of the {CELL_ATOMS}-atom NaCl cell on one GPU and two "
        f"({torch.cuda.get_device_name()}, {torch.cuda.device_count()} GPUs, {MODEL} template)",
        "",
        "| replicas | GPUs | atom-steps/s | vs one GPU | wall (s) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for replicas in (int(n) for n in args.replicas.split(",")):
        one = run_case(replicas, 1, args.steps, args.out)
        two = run_case(replicas, 2, args.steps, args.out)
        cases += [one, two]
        gain = two["atom_steps_per_s"] / one["atom_steps_per_s"]
        for case, ratio in ((one, 1.0), (two, gain)):
            lines.append(f"| {replicas} | {case['gpus']} | {case['atom_steps_per_s']:.3g} | "
                         f"{ratio:.2f}x | {case['wall_s']:.0f} |")  # fmt: skip
        record = {"torch": torch.__version__, "device": torch.cuda.get_device_name(),
                  "cases": cases}  # fmt: skip
        (args.out / "gpus_throughput.json").write_text(json.dumps(record, indent=1))
        (args.out / "gpus_throughput.md").write_text("\n".join(lines) + "\n")
        print(json.dumps(cases[-2:]), flush=True)


if __name__ == "__main__":
    main()
