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
import contextlib
import dataclasses
import faulthandler
import io
import json
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from large_cells import first_plan, loaded_model
from md_speed import FRICTION_PER_PS, SEED, TEMPERATURE_K, TIMESTEP_FS, nacl

from fastmace.api import _model_facts, _planned_environment
from fastmace.dynamics.edge_chunks import ChunkedConvolution
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
    return by_owner(best_live, top)


def by_owner(live: dict[int, tuple[int, str]], top: int) -> list[dict[str, Any]]:
    """Live allocations summed by owner, largest first."""
    sizes: collections.Counter[str] = collections.Counter()
    counts: collections.Counter[str] = collections.Counter()
    for size, who in live.values():
        sizes[who] += size
        counts[who] += 1
    return [
        {"owner": who, "gib": size / GIB, "allocations": counts[who]}
        for who, size in sizes.most_common(top)
    ]


def live_at_end(snapshot: dict[str, Any], top: int = 25) -> list[dict[str, Any]]:
    """What is still allocated where the trace ends (after an out-of-memory error: what
    held the memory when it ran out)."""
    live: dict[int, tuple[int, str]] = {}
    for trace in snapshot.get("device_traces", []):
        for event in trace:
            if event["action"] == "alloc":
                live[event["addr"]] = (event["size"], owner(event.get("frames", [])))
            elif event["action"] in ("free_requested", "free"):
                live.pop(event["addr"], None)
    return by_owner(live, top)


@contextlib.contextmanager
def chunk_timings() -> Iterator[list[dict[str, Any]]]:
    """Each chunk's convolution, timed to the device's end of it (a synchronisation per chunk:
    for finding a slow chunk, not for the step's speed). Forward and backward both call
    ``messages``; a call under autograd is the backward's."""
    chunks: list[dict[str, Any]] = []
    plain = ChunkedConvolution.messages

    def timed(module: ChunkedConvolution, node_feats, edge_attrs, weights, edge_index):
        torch.cuda.synchronize()
        tick = time.perf_counter()
        out = plain(module, node_feats, edge_attrs, weights, edge_index)
        torch.cuda.synchronize()
        chunks.append({
            "rows": int(weights.shape[0]), "width": int(weights.shape[-1]),
            "pass": "backward" if torch.is_grad_enabled() else "forward",
            "s": round(time.perf_counter() - tick, 4),
        })  # fmt: skip
        print(f"[{time.perf_counter() - STARTED:7.1f} s] chunk {chunks[-1]}", flush=True)
        return out

    ChunkedConvolution.messages = timed  # type: ignore[method-assign]
    try:
        yield chunks
    finally:
        ChunkedConvolution.messages = plain  # type: ignore[method-assign]


def probe(record: dict[str, Any], atoms: int, block_steps: int, evaluations: int) -> None:
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
    for attempt in ("first", "second")[:evaluations]:
        torch.cuda.reset_peak_memory_stats()
        tick = time.perf_counter()
        with chunk_timings() as chunks:
            record[f"{attempt}_evaluation_chunks"] = chunks  # kept if the probe is stopped
            output = potential(state, edges, compute_stress=False)
            torch.cuda.synchronize()
        record[f"{attempt}_evaluation_s"] = time.perf_counter() - tick
        record[f"{attempt}_evaluation_peak_gib"] = torch.cuda.max_memory_allocated() / GIB
        phases[f"{attempt}_evaluation"] = record[f"{attempt}_evaluation_peak_gib"]
        del output
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


class Stopped(Exception):
    """The probe's time limit ran out (SIGTERM from ``timeout``): what was measured is kept."""


def stop(signum: int, frame: Any) -> None:
    raise Stopped(f"stopped by signal {signum} after {time.perf_counter() - STARTED:.0f} s")


def main() -> int:
    signal.signal(signal.SIGTERM, stop)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--atoms", type=int, default=157464)
    parser.add_argument("--block-steps", type=int, default=5)
    parser.add_argument("--evaluations", type=int, choices=(1, 2), default=2)
    parser.add_argument(
        "--history-entries", type=int, default=500_000, help="0: no allocator history"
    )
    parser.add_argument(
        "--traceback-every", type=float, default=0.0,
        help="print every thread's Python stack this often (seconds; 0: never), "
        "to see where a probe that does not answer SIGTERM is stuck",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with _planned_environment(first_plan(nacl(args.atoms))):
        record: dict[str, Any] = {"atoms": args.atoms, "phases_gib": Phases()}
        if args.history_entries:
            torch.cuda.memory._record_memory_history(max_entries=args.history_entries)
        if args.traceback_every:
            faulthandler.dump_traceback_later(args.traceback_every, repeat=True)
        try:
            probe(record, args.atoms, args.block_steps, args.evaluations)
        except torch.cuda.OutOfMemoryError as error:
            record.update(status="oom", error=str(error)[:600])
        except Stopped as error:
            record.update(status="stopped", error=str(error))
        faulthandler.cancel_dump_traceback_later()
        try:  # the analysis is a help, not the measurement
            if not args.history_entries:
                raise RuntimeError("no allocator history kept (--history-entries 0)")
            snapshot = torch.cuda.memory._snapshot()
            record["live_at_peak"] = live_at_peak(snapshot)
            record["live_at_end"] = live_at_end(snapshot)
        except Exception as error:
            record["live_at_peak"] = f"{type(error).__name__}: {error}"
        torch.cuda.memory._record_memory_history(enabled=None)
    print(json.dumps(record, indent=1), flush=True)
    (args.out / f"memory-{args.atoms}.json").write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
