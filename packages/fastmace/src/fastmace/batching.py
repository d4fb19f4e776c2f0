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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastmace.runs import MDResult, RunSettings

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


def batch_settings(settings: RunSettings, part: range, n_systems: int) -> RunSettings:
    """``settings`` for the systems in ``part``: per-system values sliced, and the seed moved
    so that each system keeps its stream (system s of the request draws from seed + s)."""
    chosen = settings.ensemble
    sliced = {
        name: (list(value)[part.start : part.stop] if _per_system(value, n_systems) else value)
        for name, value in chosen.settings.items()
    }
    ensemble = dataclasses.replace(chosen, settings=sliced)
    return dataclasses.replace(settings, ensemble=ensemble, seed=settings.seed + part.start)


def batch_output(output: str | Path | None, index: int) -> Path | None:
    """The run directory of batch ``index`` (from 1) inside the request's, or None."""
    if output is None:
        return None
    return Path(output) / BATCH_DIRECTORY.format(index=index)


def batch_directories(output: str | Path | None) -> list[Path]:
    """The batch run directories of a request that ran in batches (none for one that did not:
    a run directory of its own, with its run.json)."""
    if output is None or (Path(output) / "run.json").exists():
        return []
    return sorted(Path(output).glob("batch-[0-9][0-9][0-9]"))


def merged_result(results: Sequence[MDResult], parts: Sequence[range], output: Any) -> MDResult:
    """One result for the request: structures and thermo rows in the request's order (each
    row's ``system`` counted over the request), the report of every batch under a heading."""
    structures, thermo, reports = [], [], []
    for number, (result, part) in enumerate(zip(results, parts, strict=True), start=1):
        structures += result.structures
        for row in result.thermo:
            thermo.append({**row, "system": part.start + int(row.get("system", 0))})
        reports.append(
            f"== batch {number} of {len(parts)}: systems {part.start} to {part.stop - 1}\n"
            f"{result.report}"
        )
    first = results[0]
    heading = (
        f"The request ran as {len(parts)} batches, one after another (at most "
        f"{max(len(p) for p in parts)} systems each).\n"
    )
    return MDResult(
        structures=structures, steps=first.steps, thermo=thermo,
        output=None if output is None else Path(output), timings=dict(first.timings),
        model=first.model, ensemble=first.ensemble, report=heading + "\n".join(reports),
    )  # fmt: skip


def _per_system(value: Any, n_systems: int) -> bool:
    return isinstance(value, list | tuple) and len(value) == n_systems and n_systems > 1
