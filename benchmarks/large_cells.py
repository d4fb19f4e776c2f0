"""The largest cells: memory, speed and set-up of the engine from 157,464 to 1,000,000 atoms.

Each case runs the engine as ``fm.md`` plans it with no options (MP-0-medium template, cuEq,
float32, NaCl rattled, Langevin at 300 K), with short blocks so that a million atoms fits the
device's command limit: an eager block, the captured block, then timed blocks. Compilation is
left off (a chunked evaluation runs uncompiled anyway). Variant "default" lets the set-up
choose the chunks from free memory (docs/md.md#how-big-a-run-fits); "unchunked" forces every
evaluation whole, as before; "one-padding-node" reroutes every padding edge to one node, as
before 2026-12-04 (dynamics/potential.py spreads them, for the kernels' atomic adds); "eager"
runs without CUDA graphs. Each
case records ``peak_gib`` (torch's peak allocation),
``reserved_gib`` (what the allocator held), ``setup_s`` (structure on the device to the
first forces), ``ms_per_step`` and what the chunking chose, in the ``cases`` list that
benchmarks/scale_targets.py reads.

    python benchmarks/large_cells.py --atoms 157464,1000000 --out $OUT/large
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import io
import json
import os
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import torch
from md_speed import FRICTION_PER_PS, SEED, TEMPERATURE_K, TIMESTEP_FS, nacl

from fastmace.api import _model_facts, _planned_environment
from fastmace.dynamics import padding as padding_module
from fastmace.dynamics.ensembles import ensemble
from fastmace.io import OutputSchedule
from fastmace.machine import probe_availabilities
from fastmace.models.load import load
from fastmace.planner import EngineConfig, Plan, Workload, make_plan
from fastmace.simulation import RunSettings, Simulation

MODEL = "mp0-medium"


@functools.cache
def loaded_model(backend: str):
    """The template on the plan's backend, loaded once for every case."""
    return load(f"template:{MODEL}", backend=backend, device="cuda", dtype="float32", seed=SEED)


def first_plan(structure, expandable_segments: bool | None = None) -> Plan:
    """fm.md's plan with no options for a 10,000-step Langevin run, before the model loads
    (``expandable_segments`` forced when not None)."""
    workload = Workload.from_structures(
        [structure], ensemble="nvt", temperature_K=TEMPERATURE_K, steps=10_000,
        timestep_fs=TIMESTEP_FS, device="cuda", precision="float32",
    )  # fmt: skip
    config = EngineConfig(expandable_segments=expandable_segments)
    return make_plan(workload, config, probe_availabilities())


@contextlib.contextmanager
def padding_as(variant: str) -> Iterator[None]:
    """Every padding edge on one padding node for "one-padding-node", as before it was spread."""
    spread = padding_module.ATOMS_PER_PADDING_NODE
    if variant == "one-padding-node":
        padding_module.ATOMS_PER_PADDING_NODE = 1 << 62
    try:
        yield
    finally:
        padding_module.ATOMS_PER_PADDING_NODE = spread


def run_case(
    atoms: int,
    variant: str,
    block_steps: int,
    timed_blocks: int,
    expandable: bool | None,
    made: dict,
) -> dict:
    """One case; ``made`` gets the simulation as soon as it exists (for a failure's record)."""
    structure = nacl(atoms)
    first = first_plan(structure, expandable)
    loaded = loaded_model(first.backend)
    plan = make_plan(_model_facts(loaded, first), first.config, first.availabilities)
    engine = dataclasses.replace(
        plan.engine_settings(), block_steps=block_steps, compile=False,
        edge_chunk_rows=None if variant == "unchunked" else "auto",
        graphs=False if variant == "eager" else None,
    )  # fmt: skip
    settings = RunSettings(
        ensemble=ensemble("nvt", temperature_K=TEMPERATURE_K, friction_per_ps=FRICTION_PER_PS),
        steps=block_steps * (2 + timed_blocks), timestep_fs=TIMESTEP_FS, seed=SEED,
        schedule=OutputSchedule(0, 0, 0), initial_temperature_K=TEMPERATURE_K,
    )  # fmt: skip
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    tick = time.perf_counter()
    simulation = Simulation(loaded, [structure], settings, engine=engine, progress=io.StringIO())
    made["simulation"] = simulation
    setup_s = time.perf_counter() - tick
    blocks: list[float] = []
    run_block = simulation.engine.run_block

    def timed(steps: int | None = None):
        tick = time.perf_counter()
        report = run_block(steps)
        blocks.append(time.perf_counter() - tick)
        return report

    simulation.engine.run_block = timed  # type: ignore[method-assign]
    simulation.run()
    steady = blocks[2:]
    potential = simulation.potential
    chunking = potential.edge_chunking
    return {
        "model": MODEL, "atoms": atoms, "path": "fastmace", "variant": variant, "status": "ok",
        "ms_per_step": 1000 * sum(steady) / (block_steps * len(steady)),
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
        "reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
        "setup_s": setup_s,
        "setup_parts": {k: v for k, v in simulation.timings.items() if k.startswith("setup")},
        "block_s": blocks, "block_steps": block_steps,
        "edge_chunk_rows": None if chunking is None else chunking.rows,
        "edge_chunk_reason": None if chunking is None else chunking.reason,
        "chunked_calls": potential.chunked_calls,
        "model_edge_capacity": simulation.neighbours.cutoff_capacity,
        "edge_capacity": simulation.neighbours.capacity,
        "radial_table": potential.table_report is not None,
        "captured": simulation.engine.capture,
        "capture_failure": simulation.engine.capture_failure,
        "allocator": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
    }  # fmt: skip


def failure_record(simulation: Simulation | None) -> dict:
    """Where a failed case was: the innermost frames of the error and the engine's state."""
    record: dict = {"traceback": traceback.format_exc()[-2500:]}
    if simulation is not None:
        engine = simulation.engine
        record.update(
            blocks_done=engine.steps_done // engine.block_steps,
            warmed_up=engine.warmed_up,
            last_launch=engine.last_launch,
            capture_failure=engine.capture_failure,
        )
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--atoms", default="157464,512000,1000000")
    parser.add_argument("--variants", default="default")
    parser.add_argument("--block-steps", type=int, default=5)
    parser.add_argument("--timed-blocks", type=int, default=2)
    parser.add_argument(
        "--expandable-segments", action="store_true",
        help="force the allocator's expandable segments (the plan's rule leaves them off "
        "before torch 2.14); variants are named with '-expandable'",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sizes = [int(a) for a in args.atoms.split(",")]
    # fm.md's environment (the allocator's expandable segments, cuEquivariance's kernel
    # choice), set before CUDA starts, as fm.md sets it.
    expandable = True if args.expandable_segments else None
    with _planned_environment(first_plan(nacl(sizes[0]), expandable)):
        return run_cases(args, sizes)


def run_cases(args: argparse.Namespace, sizes: list[int]) -> int:
    cases = []
    for atoms in sizes:
        for variant in args.variants.split(","):
            tick = time.perf_counter()
            name = f"{variant}-expandable" if args.expandable_segments else variant
            head = {"model": MODEL, "atoms": atoms, "path": "fastmace", "variant": name}
            expandable = True if args.expandable_segments else None
            made: dict = {}
            try:
                with padding_as(variant):
                    case = run_case(
                        atoms, variant, args.block_steps, args.timed_blocks, expandable, made
                    )
                case["variant"] = name
            except torch.cuda.OutOfMemoryError as error:
                peak = torch.cuda.max_memory_allocated() / 2**30
                case = {**head, "status": "oom", "error": str(error)[:400], "peak_gib": peak}
                case.update(failure_record(made.get("simulation")))
            except Exception as error:  # recorded, and the next case still runs
                message = f"{type(error).__name__}: {error}"[:600]
                case = {**head, "status": "failed", "error": message}
                case.update(failure_record(made.get("simulation")))
            made.clear()
            case["wall_s"] = time.perf_counter() - tick
            cases.append(case)
            gc.collect()  # the finished case's graphs and their memory pools
            shown = {k: v for k, v in case.items() if k not in ("setup_parts", "edge_chunk_reason")}
            print(json.dumps(shown), flush=True)
            (args.out / "large_cells.json").write_text(
                json.dumps({"gpu": torch.cuda.get_device_name(), "cases": cases}, indent=1)
            )
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
