"""What one eager force evaluation costs on the GPU, call by call, and why.

Start-up before graph replay is a few dozen eager force evaluations (checks, the first forces,
the warm-up block, the capture). This measures them one at a time: ``fm.calculator`` on the
MP-0-medium template (cuEq, float32) on rattled rock-salt NaCl, ``--evals`` calls of
``get_forces`` with the positions moved a little each time, wall time per call with the device
synchronised. Each ``--env`` variant runs in its own child process, so a variant that fills an
on-disk cache can be followed by one that reads it (``cold``/``warm`` share a directory).

    python benchmarks/eager_cost.py --atoms 216 13824 --out $OUT/eager
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# name -> environment variables for the child (``{cache}`` is a directory shared by variants)
DEVICE = os.environ.get("EAGER_COST_DEVICE", "cuda")
BACKEND = "cueq" if DEVICE == "cuda" else "e3nn"

VARIANTS = {
    "default": {},
    "nvrtc-cache-cold": {"CUEQUIVARIANCE_OPS_NVRTC_CACHE_DIR": "{cache}"},
    "nvrtc-cache-warm": {"CUEQUIVARIANCE_OPS_NVRTC_CACHE_DIR": "{cache}"},
    "show-nvrtc-time": {"show_nvrtc_time": "1", "SHOW_NVRTC_TIME": "1"},
}


def child(atoms_count: int, evals: int, limit_s: float) -> dict:
    import faulthandler

    # A child that hangs says where before it is stopped.
    faulthandler.dump_traceback_later(limit_s, exit=True)
    import ase.build
    import numpy as np
    import torch

    import fastmace as fm

    repeat = round((atoms_count / 8) ** (1 / 3))
    atoms = ase.build.bulk("NaCl", "rocksalt", a=5.64, cubic=True).repeat(repeat)
    atoms.rattle(0.05, seed=1)
    started = time.perf_counter()
    calc = fm.calculator("template:mp0-medium", device=DEVICE, dtype="float32", backend=BACKEND)
    load_s = time.perf_counter() - started
    atoms.calc = calc
    rng = np.random.default_rng(0)
    calls = []
    for _ in range(evals):
        atoms.positions += rng.normal(0.0, 0.002, atoms.positions.shape)
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        atoms.get_forces()
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        calls.append(time.perf_counter() - started)
    return {"atoms": atoms_count, "load_s": load_s, "calls_s": calls}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--atoms", type=int, nargs="+", default=[216, 13824])
    parser.add_argument("--evals", type=int, default=8)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child-limit-s", type=float, default=150.0)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.evals, args.child_limit_s)))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    cache = tempfile.mkdtemp(prefix="cueq-nvrtc-")
    results = []
    for atoms_count in args.atoms:
        for variant in args.variants:
            env = dict(os.environ)
            env.update({k: v.format(cache=cache) for k, v in VARIANTS[variant].items()})
            command = [sys.executable, __file__, "--child", str(atoms_count), "--evals",
                       str(args.evals), "--child-limit-s", str(args.child_limit_s)]  # fmt: skip
            started = time.perf_counter()
            print(f"{atoms_count} {variant}: started", flush=True)
            done = subprocess.run(command, env=env, capture_output=True, text=True)
            print("\n".join(done.stderr.splitlines()[-25:]), flush=True)
            record = {"variant": variant, "wall_s": time.perf_counter() - started,
                      "returncode": done.returncode}  # fmt: skip
            lines = done.stdout.strip().splitlines()
            if done.returncode == 0 and lines:
                record.update(json.loads(lines[-1]))
                record["child_output"] = lines[:-1][-40:]
            else:
                record["stderr"] = done.stderr[-3000:]
            record["stderr_nvrtc"] = [line for line in done.stderr.splitlines() if "NVRTC" in line][
                :60
            ]
            results.append(record)
            calls = ", ".join(f"{c:.3f}" for c in record.get("calls_s", []))
            print(f"{atoms_count} {variant}: wall {record['wall_s']:.1f} s, "
                  f"load {record.get('load_s', float('nan')):.1f} s, calls [{calls}]",
                  flush=True)  # fmt: skip
            if cache_files := sorted(Path(cache).glob("*")):
                print(f"  nvrtc cache: {len(cache_files)} files", flush=True)
    (args.out / "eager_cost.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
