"""Throughput of many copies of one small cell in one batch: atom-steps per second.

Issue 15's benchmark: 1, 8, 64 and 256 replicas of the 216-atom rock-salt NaCl cell with the
MP-0-medium template (random weights), Langevin NVT at 300 K, 1 fs, float32, cuEquivariance,
no output, CUDA graphs; each replica draws from its own random stream. For each batch size it
times graph replays only (after the eager warm-up block, the capture and one more block) and
reports ms per step, atom-steps per second and the gain over one replica. With
``--exchange N``, N replicas run again as a replica-exchange ladder (300 to 600 K, an
exchange at the end of every block, inside the captured graph) to show what the swaps cost.
``--radial-table`` and ``--compile`` run every case with radial tables and torch.compile, the
fastest settings for one cell and for many alike (performance.md).

    . .gpu/setup.sh && PYTHONPATH=$PWD/packages/fastmace/src:$PYTHONPATH \
        python benchmarks/replica_throughput.py --out $OUT/replicas

Results: ``replica_throughput.json`` (a ``cases`` list like md_speed.py's) and ``.md``.
"""

from __future__ import annotations

import argparse
import io
import json
import time
from pathlib import Path
from typing import Any

import torch
from profile_step import nacl

from fastmace.dynamics.ensembles import ensemble
from fastmace.dynamics.replica_exchange import geometric_ladder
from fastmace.io import OutputSchedule
from fastmace.models.load import load
from fastmace.planner import EngineSettings
from fastmace.runtime import environment
from fastmace.simulation import RunSettings, Simulation

MODEL = "mp0-medium"
CELL_ATOMS = 216


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run_case(
    loaded: Any,
    replicas: int,
    block: int,
    seconds: float,
    exchange: bool,
    device: str,
    radial_table: bool = False,
    compile_model: bool = False,
) -> dict:
    """Time graph replays of ``replicas`` copies; returns one ``cases`` entry."""
    temperatures = geometric_ladder(300.0, 600.0, replicas) if exchange else 300.0
    settings = RunSettings(
        ensemble=ensemble("nvt", temperature_K=temperatures, friction_per_ps=10.0),
        steps=block * 100_000,
        timestep_fs=1.0,
        seed=0,
        schedule=OutputSchedule(0, 0, 0),
        initial_temperature_K=300.0,
        exchange_every=block if exchange else 0,
    )
    backend = "cueq" if device == "cuda" else "e3nn"
    engine = EngineSettings(
        device=device, backend=backend, dtype="float32", block_steps=block,
        radial_table=radial_table, compile=compile_model,
    )  # fmt: skip
    simulation = Simulation(
        loaded, [nacl(CELL_ATOMS)] * replicas, settings, output=None, engine=engine,
        progress=io.StringIO(),
    )  # fmt: skip
    engine = simulation.engine
    # Only steady replays are timed: a block that captured, ran eagerly or regrew the list (the
    # random-weight model disorders the crystal, so the list may grow late) is left out.
    blocks, elapsed, started = 0, 0.0, time.perf_counter()
    while elapsed < seconds and time.perf_counter() - started < 20 * seconds + 60:
        regrowths = engine.regrowths
        synchronize(device)
        tick = time.perf_counter()
        engine.run_block()  # with an exchange at its end (inside the graph)
        synchronize(device)
        steady = engine.regrowths == regrowths and (
            engine.last_launch == "replay" or (device != "cuda" and engine.last_launch == "eager")
        )
        if steady:
            blocks, elapsed = blocks + 1, elapsed + time.perf_counter() - tick
    if not blocks:
        raise RuntimeError(f"no steady replay within {20 * seconds + 60:.0f} s")
    ms_per_step = 1000 * elapsed / (blocks * block)
    atoms = replicas * CELL_ATOMS
    case = {
        "model": MODEL, "atoms": atoms, "path": "fastmace",
        "variant": f"{backend}-replicas-{replicas}" + ("-exchange" if exchange else "")
        + ("-table" if radial_table else "") + ("-compile" if compile_model else ""),
        "status": "ok", "ms_per_step": ms_per_step, "replicas": replicas,
        "atom_steps_per_s": atoms / (ms_per_step / 1000), "steps_timed": blocks * block,
        "last_launch": engine.last_launch, "regrowths": engine.regrowths,
        "capture_failure": engine.capture_failure,
        "peak_memory_GiB": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else 0,
    }  # fmt: skip
    if exchange:
        tried = simulation.exchange.attempts.tolist()
        made = simulation.exchange.accepted.tolist()
        case["acceptance"] = [m / t if t else None for m, t in zip(made, tried, strict=True)]
    return case


def device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"


def markdown(cases: list[dict], settings: str) -> str:
    one = next((c["atom_steps_per_s"] for c in cases if c["replicas"] == 1), None)
    lines = [
        f"# Replicas of the {CELL_ATOMS}-atom NaCl cell ({device_name()}, "
        f"torch {torch.__version__}, {MODEL} template, {settings})",
        "",
        "| replicas | atoms | ms/step | atom-steps/s | vs one replica | peak GiB |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for case in cases:
        gain = f"{case['atom_steps_per_s'] / one:.1f}x" if one else "-"
        name = f"{case['replicas']}" + (" (exchange)" if "exchange" in case["variant"] else "")
        lines.append(
            f"| {name} | {case['atoms']:,} | {case['ms_per_step']:.2f} | "
            f"{case['atom_steps_per_s']:.3g} | {gain} | {case['peak_memory_GiB']:.1f} |"
        )
    for case in cases:
        if "acceptance" in case:
            rates = ", ".join(f"{rate:.2f}" for rate in case["acceptance"] if rate is not None)
            lines += ["", f"Exchange acceptance per pair ({case['replicas']} rungs): {rates}"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replicas", default="1,8,64,256")
    parser.add_argument("--block-steps", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=4.0, help="replays timed per case")
    parser.add_argument(
        "--exchange", type=int, default=0, metavar="N", help="also N replicas as a ladder"
    )
    parser.add_argument("--device", default="cuda", help="cpu: a smoke test (e3nn backend)")
    parser.add_argument(
        "--radial-table", action="store_true", help="radial weights from tables (docs/md.md)"
    )
    parser.add_argument(
        "--compile", action="store_true", help="the model through torch.compile (docs/md.md)"
    )
    parser.add_argument("--out", default="benchmarks/results/replicas")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    backend = "cueq" if args.device == "cuda" else "e3nn"
    kernel_choice = None
    if args.device == "cuda":
        # The planner fixes cuEquivariance's kernel choice for every fm.md run; this script
        # bypasses it. Unfixed, cuEquivariance-ops times its candidate kernels at each new
        # size on the first call: 46 s at 13,824 atoms, more than a call's limit at 55,296
        # (256 replicas timed out three times; docs/validation/many-systems.md).
        kernel_choice = environment.configure_cueq_kernel_choice(
            environment.CUEQ_KERNEL_CHOICE_VALUE
        )
    loaded = load(f"template:{MODEL}", backend=backend, device=args.device, dtype="float32", seed=0)
    counts = [int(count) for count in args.replicas.split(",")]
    plan = [(count, False) for count in counts] + ([(args.exchange, True)] if args.exchange else [])
    plan.sort()  # smallest first; the ladder right after the plain batch of its size
    settings = ", ".join(
        [backend, "float32"] + ["radial tables"] * args.radial_table + ["compiled"] * args.compile
    )
    cases: list[dict] = []
    for replicas, exchange in plan:
        if args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        try:
            case = run_case(
                loaded, replicas, args.block_steps, args.seconds, exchange, args.device,
                args.radial_table, args.compile,
            )  # fmt: skip
        except Exception as error:  # a failed case is recorded and the rest still run
            case = {
                "model": MODEL, "atoms": replicas * CELL_ATOMS, "path": "fastmace",
                "variant": f"cueq-replicas-{replicas}", "status": f"failed: {error}"[:300],
                "ms_per_step": None, "replicas": replicas,
            }  # fmt: skip
        print(json.dumps(case), flush=True)
        cases.append(case)
        ok = [c for c in cases if c["status"] == "ok"]
        record = {
            "torch": torch.__version__, "device": device_name(),
            "cueq_kernel_choice": kernel_choice, "cases": cases,
        }  # fmt: skip
        (out / "replica_throughput.json").write_text(json.dumps(record, indent=1))
        (out / "replica_throughput.md").write_text(markdown(ok, settings))
        if args.device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
