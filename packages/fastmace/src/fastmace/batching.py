"""Batches that fit: a request too large for one batch runs as several, one after another.

The systems of a request (structures and their replicas, in order) are cut into consecutive
groups of whole systems with at most ``max_atoms`` atoms each. Each group is an ordinary run
of its own (``batch-001/``, ``batch-002/``, ... inside the run directory), with its systems'
own settings and random streams (system ``s`` of the request draws from ``seed + s`` whatever
batch it lands in, so a system follows the trajectory it would follow in one batch), and the
results are put back together in the request's order.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastmace.runs import MDResult, RunSettings
from fastmace.runtime.atomic import atomic_write_text

BATCH_DIRECTORY = "batch-{index:03d}"


class BatchError(ValueError):
    """A request that cannot be cut into batches that fit."""


def split_into_batches(atom_counts: Sequence[int], max_atoms: int) -> list[range]:
    """Consecutive ranges of systems, each with at most ``max_atoms`` atoms (greedy, in
    order). Raises BatchError for a system that alone has more."""
    if max_atoms < 1:
        raise BatchError(f"max_atoms must be at least 1, got {max_atoms}")
    batches: list[range] = []
    start, atoms = 0, 0
    for index, count in enumerate(atom_counts):
        if count > max_atoms:
            raise BatchError(
                f"system {index} has {count} atoms, more than one batch holds ({max_atoms}): "
                "it cannot run in pieces; use a device with more memory or a smaller structure"
            )
        if atoms + count > max_atoms:
            batches.append(range(start, index))
            start, atoms = index, 0
        atoms += count
    batches.append(range(start, len(atom_counts)))
    return batches


# Why a long-range model's open molecules run apart from the request's other systems.
OPEN_APART = (
    "A long-range model (MACE-POLAR-1) runs open molecules in batches of their own: "
    "graph-longrange sums a batch with any periodic system in k-space, which gives a molecule "
    "another energy than mace-torch's calculator gives it alone (measured: 2 to 26 meV, "
    "docs/validation/polar.md)."
)


def open_systems(pbc: Sequence[Sequence[bool]]) -> list[bool]:
    """Which systems have no periodic direction at all (graph-longrange sums a batch of
    only such systems in real space, and any other batch in k-space)."""
    return [not any(bool(flag) for flag in flags) for flags in pbc]


def check_open_apart(pbc: Sequence[Sequence[bool]]) -> None:
    """Refuse a long-range model's batch that mixes open molecules with periodic systems."""
    if len(set(open_systems(pbc))) > 1:
        raise BatchError(
            f"this batch mixes open molecules with periodic systems. {OPEN_APART} Run them as "
            "separate batches (fm.md does so by itself)"
        )


def split_open_from_periodic(parts: Sequence[range], is_open: Sequence[bool]) -> list[range]:
    """``parts`` cut further wherever the systems change between open and (partly)
    periodic, so that no batch mixes the two (a long-range model's rule: ``OPEN_APART``)."""
    split: list[range] = []
    for part in parts:
        start = part.start
        for index in range(part.start + 1, part.stop):
            if is_open[index] != is_open[index - 1]:
                split.append(range(start, index))
                start = index
        split.append(range(start, part.stop))
    return split


def batch_settings(settings: RunSettings, part: range, n_systems: int) -> RunSettings:
    """``settings`` for the systems in ``part``: per-system values sliced, and the seed moved
    so that each system keeps its stream (system s of the request draws from seed + s)."""
    chosen = settings.ensemble
    sliced = {
        name: (list(value)[part.start : part.stop] if is_per_system(value, n_systems) else value)
        for name, value in chosen.settings.items()
    }
    ensemble = dataclasses.replace(chosen, settings=sliced)
    return dataclasses.replace(
        settings, ensemble=ensemble, seed=settings.seed + part.start,
        charge=settings.charge[part.start : part.stop], spin=settings.spin[part.start : part.stop],
    )  # fmt: skip


def batch_output(output: str | Path | None, index: int) -> Path | None:
    """The run directory of batch ``index`` (from 1) inside the request's, or None."""
    if output is None:
        return None
    return Path(output) / BATCH_DIRECTORY.format(index=index)


def batch_directories(output: str | Path | None) -> list[Path]:
    """The run directories of a request that ran in parts, batches (``batch-NNN/``) or devices
    (``gpu-N/``, each perhaps in batches itself); none for a run directory of its own (with
    its run.json)."""
    if output is None or (Path(output) / "run.json").exists():
        return []
    found: list[Path] = []
    batches = sorted(Path(output).glob("batch-[0-9][0-9][0-9]"))
    devices = [path for path in Path(output).glob("gpu-*") if path.name[4:].isdigit()]
    devices.sort(key=lambda path: int(path.name[4:]))
    for path in batches + devices:
        found += batch_directories(path) or [path]
    return found


def merged_result(
    results: Sequence[MDResult],
    parts: Sequence[range],
    output: Any,
    heading: str,
    label: str = "batch",
) -> MDResult:
    """One result for the request: structures and thermo rows in the request's order (each
    row's ``system`` counted over the request), ``heading`` (how the request was cut) and
    then the report of every part under a ``label`` heading of its own."""
    structures, thermo, reports, means = [], [], [], []
    for number, (result, part) in enumerate(zip(results, parts, strict=True), start=1):
        structures += result.structures
        means += result.mean_temperature_K
        for row in result.thermo:
            thermo.append({**row, "system": part.start + int(row.get("system", 0))})
        reports.append(
            f"== {label} {number} of {len(parts)}: systems {part.start} to {part.stop - 1}\n"
            f"{result.report}"
        )
    first = results[0]
    return MDResult(
        structures=structures, steps=first.steps, thermo=thermo,
        output=None if output is None else Path(output), timings=dict(first.timings),
        model=first.model, ensemble=first.ensemble, report=heading + "\n".join(reports),
        mean_temperature_K=means if len(means) == len(structures) else [],
        mean_from_step=first.mean_from_step,
    )  # fmt: skip


def batches_heading(parts: Sequence[range], sizing: str) -> str:
    """The first lines of a batched request's report: how many batches, and why that size."""
    return (
        f"The request ran as {len(parts)} batches, one after another (at most "
        f"{max(len(p) for p in parts)} systems each).\n" + (f"{sizing}\n" if sizing else "")
    )


def is_per_system(value: Any, n_systems: int) -> bool:
    """A setting given as one value per system of the request (to be sliced with them)."""
    return isinstance(value, list | tuple) and len(value) == n_systems and n_systems > 1


# Of the device memory free before a run, the share its batches may plan on: the rest covers
# the allocator's fragmentation and what the probe cannot see.
MEMORY_SHARE = 0.7
# A run holds a force evaluation's memory about twice: the eager warm-up's blocks stay cached
# by the allocator while the captured graph keeps a private pool of its own.
ENGINE_COPIES = 2
# Copies of the largest structure the probe evaluates against one: the difference is the
# memory each further atom takes (one structure alone carries fixed costs too).
PROBE_COPIES = 4
PARTS_FILE = "batches.json"


@dataclasses.dataclass(frozen=True)
class MemoryBudget:
    """What the batch size on a CUDA device came from: one force evaluation's memory per
    further atom and its fixed part (measured), and the memory free before the run."""

    per_atom_bytes: float
    fixed_bytes: float
    free_bytes: int

    def max_atoms(self, largest: int) -> int:
        """Atoms one batch may hold: ENGINE_COPIES evaluations within MEMORY_SHARE of the free
        memory, never fewer than the largest structure (which must run whole anyway)."""
        usable = MEMORY_SHARE * self.free_bytes - ENGINE_COPIES * self.fixed_bytes
        return max(largest, int(usable / (ENGINE_COPIES * self.per_atom_bytes)))

    def describe(self, largest: int) -> str:
        return (
            f"Batch size from memory measured before the run: "
            f"{self.per_atom_bytes / 2**20:.3f} MiB per atom for one force evaluation, "
            f"{self.free_bytes / 2**30:.1f} GiB free, {MEMORY_SHARE:.0%} of it for "
            f"{ENGINE_COPIES} evaluations: at most {self.max_atoms(largest)} atoms per batch."
        )


def measured_peak_bytes(loaded: Any, structures: Sequence[Any], skin_A: float) -> int:
    """Peak device memory of one force evaluation (neighbour list built, model forward and
    forces) of ``structures`` as one batch, measured on the model's CUDA device."""
    import torch

    from fastmace.dynamics.neighbours import NeighbourList
    from fastmace.dynamics.potential import Potential
    from fastmace.dynamics.state import State

    device = torch.device(loaded.device)
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    state = State.from_atoms(list(structures), device=device)
    potential = Potential.from_loaded(loaded, state.atomic_numbers)
    neighbours = NeighbourList(state, potential.r_max, skin_A)
    edges = neighbours.cutoff_edges(state, neighbours.build(state))
    potential(state, edges, compute_stress=False)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del state, potential, neighbours, edges
    torch.cuda.empty_cache()
    return int(peak)


def measured_budget(loaded: Any, structures: Sequence[Any], skin_A: float) -> MemoryBudget | None:
    """On CUDA, the memory each further atom takes, measured on one and on a few copies of the
    request's largest structure, and the memory free now. None off CUDA (one batch)."""
    import torch

    if torch.device(loaded.device).type != "cuda":
        return None
    largest = max(structures, key=len)
    one = measured_peak_bytes(loaded, [largest], skin_A)
    try:
        several = measured_peak_bytes(loaded, [largest] * PROBE_COPIES, skin_A)
        per_atom = max((several - one) / ((PROBE_COPIES - 1) * len(largest)), 1.0)
        fixed = max(one - per_atom * len(largest), 0.0)
    except torch.cuda.OutOfMemoryError:  # copies of a large structure: count it all per atom
        torch.cuda.empty_cache()
        per_atom, fixed = one / len(largest), 0.0
    free, _total = torch.cuda.mem_get_info(torch.device(loaded.device))
    return MemoryBudget(per_atom_bytes=per_atom, fixed_bytes=fixed, free_bytes=int(free))


def release_device_memory() -> None:
    """Hand a finished batch's device memory back (its CUDA graphs hold private pools that
    the next batch's allocations cannot use); nothing to do off CUDA."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def write_parts(output: str | Path | None, parts: Sequence[range], sizing: str) -> None:
    """Record how the request was cut, so that a resumed request keeps the same batches
    whatever the memory free then."""
    if output is None:
        return
    Path(output).mkdir(parents=True, exist_ok=True)
    record = {"parts": [[part.start, part.stop] for part in parts], "sizing": sizing}
    atomic_write_text(Path(output) / PARTS_FILE, json.dumps(record, indent=1) + "\n")


def saved_parts(output: str | Path | None, n_systems: int) -> list[range] | None:
    """How a request being resumed was cut: its recorded batches, one batch for a run
    directory of its own, None when nothing ran there yet."""
    if output is None:
        return None
    if (Path(output) / "run.json").exists():
        return [range(n_systems)]
    recorded = Path(output) / PARTS_FILE
    if not recorded.exists():
        return None
    parts = [range(start, stop) for start, stop in json.loads(recorded.read_text())["parts"]]
    if not parts or parts[-1].stop != n_systems:
        raise BatchError(
            f"{recorded} cuts {parts[-1].stop if parts else 0} systems into batches, but this "
            f"request has {n_systems}: resume with the structures and replicas of the run"
        )
    return parts
