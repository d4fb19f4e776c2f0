"""The start-up and scale issue's targets, read from recorded benchmark results.

Every ``*.json`` under the given result directories whose ``cases`` list holds measured runs
(md_speed.py, startup_time.py) is read; for each target the best recorded case that counts is
shown beside the target, with the file it came from. Nothing is measured here.

    python benchmarks/scale_targets.py benchmarks/results/2026-12-03-h200
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Case = dict[str, Any]
MEDIUM = "mp0-medium"
MILLION = 1_000_000


@dataclass(frozen=True)
class Target:
    """One row: which cases count, which of their figures, and the bound it must meet."""

    name: str
    counts: Callable[[Case], bool]
    figure: Callable[[Case], float | None]
    bound: float
    unit: str
    larger_is_better: bool = False

    def met(self, value: float) -> bool:
        return value >= self.bound if self.larger_is_better else value <= self.bound


def _default(atoms: int) -> Callable[[Case], bool]:
    return lambda c: (
        c.get("model") == MEDIUM and c.get("atoms") == atoms and c.get("variant") == "default"
    )


def _start(cache: str) -> Callable[[Case], bool]:
    # The compiled default path (the path of runs that pay for compilation), forced with
    # --compile for a run short enough to time its start-up.
    return lambda c: (
        c.get("path") == "fastmace-md" and c.get("atoms") == 13_824 and c.get("cache") == cache
        and c.get("variant") == "compile"
    )  # fmt: skip


def _million(case: Case) -> bool:
    return case.get("atoms", 0) >= MILLION


def _to_first_step_s(case: Case) -> float | None:
    """Process-free set-up to the first step: recorded, or (large_cells.py) the set-up plus
    the whole first block, an upper bound."""
    if "to_first_step_s" in case:
        return case["to_first_step_s"]
    if "setup_s" in case and case.get("block_s"):
        return case["setup_s"] + case["block_s"][0]
    return None


def _per_atom_mib(case: Case) -> float | None:
    peak = case.get("peak_gib", case.get("peak_memory_GiB"))
    return None if peak is None else peak * 1024 / case["atoms"]


TARGETS = (
    Target("fm.md, no options, 13,824 atoms", _default(13_824), lambda c: c["ms_per_step"], 20.0,
           "ms/step"),
    Target("fm.md, no options, 216 atoms", _default(216), lambda c: c["ms_per_step"], 1.2,
           "ms/step"),
    Target("fastmace md to the first step, 13,824 atoms, warm", _start("warm"),
           lambda c: c["to_first_step_s"], 8.0, "s"),
    Target("the same, cold", _start("cold"), lambda c: c["to_first_step_s"], 45.0, "s"),
    Target("largest MP-0-medium cell that runs", lambda c: c.get("model") == MEDIUM,
           lambda c: c["atoms"], MILLION, "atoms", larger_is_better=True),
    Target("memory per atom at 1,000,000 atoms", _million, _per_atom_mib,
           0.12, "MiB"),
    Target("time per atom-step at 1,000,000 atoms", _million,
           lambda c: c["ms_per_step"] * 1000 / c["atoms"], 1.5, "us"),
    Target("set-up to the first step at 1,000,000 atoms", _million, _to_first_step_s, 60.0,
           "s"),
)  # fmt: skip


def recorded_cases(directories: list[Path]) -> Iterator[tuple[Case, str]]:
    """Every measured case (status ok) in the JSON files under ``directories``."""
    for directory in directories:
        for path in sorted(directory.rglob("*.json")):
            try:
                cases = json.loads(path.read_text()).get("cases", [])
            except (ValueError, AttributeError):
                continue
            for case in cases:
                if isinstance(case, dict) and case.get("status") == "ok":
                    yield case, str(path)


def table(directories: list[Path]) -> str:
    """The targets as a Markdown table: the best recorded figure, the target, met or not."""
    cases = list(recorded_cases(directories))
    rows = ["| target | best recorded | bound | met | from |", "|---|---:|---:|---|---|"]
    for target in TARGETS:
        found = [
            (value, source) for case, source in cases
            if target.counts(case) and (value := target.figure(case)) is not None
        ]  # fmt: skip
        if not found:
            rows.append(f"| {target.name} | not measured | {target.bound:g} {target.unit} | - | |")
            continue
        pick = max if target.larger_is_better else min
        value, source = pick(found, key=lambda item: item[0])
        met = "yes" if target.met(value) else "no"
        rows.append(
            f"| {target.name} | {value:,.3g} {target.unit} | {target.bound:,g} {target.unit} "
            f"| {met} | {source} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directories", nargs="+", type=Path)
    print(table(parser.parse_args().directories))


if __name__ == "__main__":
    main()
