"""Batches that fit, on the GPU: a request that cannot run as one batch runs in several.

2,048 replicas of the 216-atom NaCl cell (442,368 atoms) with the MP-0-medium template on one
H200 would need about 0.4-0.65 MiB per atom, 170-290 GiB at once: FastMACE must size the
batches from the memory it measures and run them in turn, with no out-of-memory error. Prints
the report's batch heading, each batch's size, the time, and the peak memory.

    . .gpu/setup.sh && PYTHONPATH=$PWD/packages/fastmace/src:$PYTHONPATH \\
        python tools/validation/batches_gpu.py --out $OUT/batches
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
from profile_step import nacl

import fastmace as fm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replicas", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--out", type=Path, default=Path("batches"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tick = time.perf_counter()
    result = fm.md(
        nacl(216), model="template:mp0-medium", replicas=args.replicas, steps=args.steps,
        temperature_K=300.0, dtype="float32", backend="cueq", trajectory_every=0,
        thermo_every=args.steps, restart_every=0, output=args.out / "run",
    )  # fmt: skip
    elapsed = time.perf_counter() - tick
    batches = sorted(p.name for p in (args.out / "run").glob("batch-*"))
    record = {
        "replicas": args.replicas, "atoms": 216 * args.replicas, "steps": args.steps,
        "heading": result.report.split("\n== ")[0], "batches": batches, "elapsed_s": elapsed,
        "peak_memory_GiB": torch.cuda.max_memory_allocated() / 2**30,
        "peak_reserved_GiB": torch.cuda.max_memory_reserved() / 2**30,
        "systems_reported": len(result.structures),
    }  # fmt: skip
    (args.out / "batches.json").write_text(json.dumps(record, indent=1))
    print(json.dumps(record))


if __name__ == "__main__":
    main()
