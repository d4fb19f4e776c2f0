"""Where a large cell's device memory goes, and what its first evaluation costs.

For one NaCl cell (MP-0-medium template, fm.md's plan with no options, chunks chosen by the
set-up as in a run), step by step: the memory held after the model, the state, the potential
and the neighbour list; one force evaluation timed twice on the same shapes (the first pays
for kernel choices and compilation at this size) with its peak; at that peak, the largest live
allocations grouped by where they were made (torch's allocator history); then the engine's
eager block and its capture, with what stays allocated and what the graph's pool takes.

    python benchmarks/memory_probe.py --atoms 157464 --out $OUT/memory
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import io
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from large_cells import first_plan, loaded_model
from md_speed import FRICTION_PER_PS, SEED, TEMPERATURE_K, TIMESTEP_FS, nacl

from fastmace.api import _model_facts, _planned_environment
from fastmace.dynamics.ensembles import ensemble
from fastmace.dynamics.neighbours import NeighbourList
from fastmace.dynamics.potential import Potential
from fastmace.dynamics.state import State
from fastmace.io import OutputSchedule
from fastmace.planner import make_plan
from fastmace.simulation import RunSettings, Simulation

GIB = 2**30
# Frames of these files say who asked for an allocation; torch's own frames do not.
OWNERS = ("fastmace", "mace", "cuequivariance", "e3nn")


STARTED = time.perf_counter()


def allocated() -> float:
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated() / GIB


class Phases(dict):
    """Phase -> GiB allocated; each entry is printed as it is measured, with the time since the
    start, so that a probe cut short by its time limit still says how far it came."""

    def __setitem__(self, name: str, gib: float) -> None:
        super().__setitem__(name, gib)
        print(f"[{time.perf_counter() - STARTED:7.1f} s] {name}: {gib:.2f} GiB", flush=True)


def owner(frames: list[dict[str, Any]]) -> str:
    """The innermost frame in FastMACE, mace or a kernel library: file:line function."""
    for frame in frames:
        name = frame.get("filename", "")
        if any(f"/{part}/" in name for part in OWNERS):
            short = name.split("site-packages/")[-1].split("src/")[-1]
            return f"{short}:{frame.get('line')} {frame.get('name')}"
    return "elsewhere"


def live_at_peak(snapshot: dict[str, Any], top: int = 25) -> list[dict[str, Any]]:
    """Replays the allocator's trace to its highest point; the live allocations there,
    summed by owner, largest first."""
    live: dict[int, tuple[int, str]] = {}
    current = best = 0
    best_live: dict[int, tuple[int, str]] = {}
    for trace in snapshot.get("device_traces", []):
        for event in trace:
            action, address, size = event["action"], event["addr"], event["size"]
            if action == "alloc":
                live[address] = (size, owner(event.get("frames", [])))
                current += size
                if current > best:
                    best, best_live = current, dict(live)
            elif action in ("free_requested", "free") and address in live:
                current -= live.pop(address)[0]
    by_owner: collections.Counter[str] = collections.Counter()
    counts: collections.Counter[str] = collections.Counter()
    for size, who in best_live.values():
        by_owner[who] += size
        counts[who] += 1
    return [
        {"owner": who, "gib": size / GIB, "allocations": counts[who]}
        for who, size in by_owner.most_common(top)
    ]


def probe(record: dict[str, Any], atoms: int, block_steps: int) -> None:
    """Fills ``record`` phase by phase (what was measured stays if memory runs out)."""
    phases = record["phases_gib"]
    structure = nacl(atoms)
    first = first_plan(structure)
    loaded = loaded_model(first.backend)
    plan = make_plan(_model_facts(loaded, first), first.config, first.availabilities)
    engine = dataclasses.replace(plan.engine_settings(), block_steps=block_steps, compile=False)
    phases["model"] = allocated()
    state = State.from_atoms([structure], device="cuda")
    phases["state"] = allocated()
    potential = Potential.from_loaded(
        loaded, state.atomic_numbers, radial_table=engine.radial_table, edge_chunk_rows="auto"
    )
    phases["potential"] = allocated()
    chosen = potential.edge_chunking
    record["edge_chunking"] = None if chosen is None else dataclasses.asdict(chosen)
    neighbours = NeighbourList(state, potential.r_max, engine.skin_A)
    edges = neighbours.cutoff_edges(state, neighbours.build(state))
    phases["neighbour_list"] = allocated()
    record["model_edges"] = int(edges.edge_index.shape[1])
    record["list_edges"] = neighbours.capacity
    for attempt in ("first", "second"):
        torch.cuda.reset_peak_memory_stats()
        if attempt == "second":
            torch.cuda.memory._record_memory_history(max_entries=200_000)
        tick = time.perf_counter()
        output = potential(state, edges, compute_stress=False)
        torch.cuda.synchronize()
        record[f"{attempt}_evaluation_s"] = time.perf_counter() - tick
        record[f"{attempt}_evaluation_peak_gib"] = torch.cuda.max_memory_allocated() / GIB
        phases[f"{attempt}_evaluation"] = record[f"{attempt}_evaluation_peak_gib"]
        del output
    try:
        record["live_at_peak"] = live_at_peak(torch.cuda.memory._snapshot())
    except Exception as error:  # the analysis is a help, not the measurement
        record["live_at_peak"] = f"{type(error).__name__}: {error}"
    torch.cuda.memory._record_memory_history(enabled=None)
    record["chunked_calls"] = potential.chunked_calls
    del potential, neighbours, edges, state
    torch.cuda.empty_cache()
    phases["after_probe"] = allocated()
    settings = RunSettings(
        ensemble=ensemble("nvt", temperature_K=TEMPERATURE_K, friction_per_ps=FRICTION_PER_PS),
        steps=3 * block_steps, timestep_fs=TIMESTEP_FS, seed=SEED,
        schedule=OutputSchedule(0, 0, 0), initial_temperature_K=TEMPERATURE_K,
    )  # fmt: skip
    torch.cuda.reset_peak_memory_stats()
    simulation = Simulation(loaded, [structure], settings, engine=engine, progress=io.StringIO())
    phases["simulation_set_up"] = allocated()
    record["simulation_set_up_peak_gib"] = torch.cuda.max_memory_allocated() / GIB
    run_block = simulation.engine.run_block
    for name in ("eager_block", "capture_block", "replay_block"):
        tick = time.perf_counter()
        run_block()
        torch.cuda.synchronize()
        record[f"{name}_s"] = time.perf_counter() - tick
        phases[name] = allocated()
        phases[f"{name}_reserved"] = torch.cuda.memory_reserved() / GIB
    record["run_peak_gib"] = torch.cuda.max_memory_allocated() / GIB
    record["status"] = "ok"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--atoms", type=int, default=157464)
    parser.add_argument("--block-steps", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with _planned_environment(first_plan(nacl(args.atoms))):
        record: dict[str, Any] = {"atoms": args.atoms, "phases_gib": Phases()}
        try:
            probe(record, args.atoms, args.block_steps)
        except torch.cuda.OutOfMemoryError as error:
            record.update(status="oom", error=str(error)[:600])
    print(json.dumps(record, indent=1), flush=True)
    (args.out / f"memory-{args.atoms}.json").write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
