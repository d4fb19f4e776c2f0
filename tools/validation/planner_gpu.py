"""Planner, gate and runner end to end on the GPU machine (docs/validation/planner-gpu.md).

    . .gpu/setup.sh && PYTHONPATH=$PWD/packages/fastmace/src:$PYTHONPATH \\
        python3 tools/validation/planner_gpu.py $OUT

1. A 13,824-atom NaCl supercell read from a file (no ``repeat``), MP-0 medium template, NVT:
   ``fm.md(check="gate")`` plans the run, gates it on a periodic sub-cell and runs 200 steps.
2. The same model on 1,728 atoms in a child process (``RunnerConfig(subprocess=True)``) with
   an extra variable, 200 steps, no output directory: the result comes back through
   ``<cache>/handoff/``.
Each run's report and metadata.json are copied to the output directory.
"""

from __future__ import annotations

import io
import json
import shutil
import sys
import time
from pathlib import Path

import ase.build

import fastmace as fm  # before torch


def nacl(n: int) -> ase.Atoms:
    return ase.build.bulk("NaCl", "rocksalt", a=5.64, cubic=True).repeat(n)


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    structure = out / "nacl-13824.extxyz"
    nacl(12).write(structure)
    started = time.perf_counter()
    result = fm.md(
        structure, model="template:mp0-medium", temperature_K=300.0, steps=200,
        timestep_fs=1.0, check="gate", output=out / "run-gate", progress=io.StringIO(),
    )  # fmt: skip
    print(f"gated run: {time.perf_counter() - started:.1f} s")
    print(result.report)
    gate = json.loads((out / "run-gate" / "metadata.json").read_text())["gate"]
    print(json.dumps(gate, indent=1))
    for name in ("trajectory.extxyz", "trajectory.h5", "restart.npz"):
        path = out / "run-gate" / name
        if path.exists():
            path.unlink()  # large; the report and metadata are what we keep
    structure.unlink()

    from fastmace.runtime.cache import cache_root

    cache = cache_root().path
    runner = fm.RunnerConfig(subprocess=True, environment={"FASTMACE_VALIDATION": "planner-gpu"})
    started = time.perf_counter()
    child = fm.md(
        nacl(6), model="template:mp0-medium", temperature_K=300.0, steps=200, timestep_fs=1.0,
        runner=runner, progress=io.StringIO(),
    )  # fmt: skip
    print(f"subprocess run: {time.perf_counter() - started:.1f} s")
    print(child.summary())
    print(child.report)
    print("handoff left:", list((cache / "handoff").glob("*")))
    (out / "subprocess-report.txt").write_text(child.report)
    shutil.rmtree(out / "run-gate" / "frames", ignore_errors=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
