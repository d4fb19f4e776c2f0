"""The structure check's close-pair search (dynamics/checks.py) against ASE's neighbour list.

For each size of rattled rock-salt NaCl (profile_step.nacl, as the other benchmarks build it;
the runs of benchmarks/results/2026-12-06-cpu/ used a copy of it with seed 0), one timed run
each of ASE's
``neighbor_list("ijd", atoms, 0.5)`` and of FastMACE's ``_close_pairs(atoms, 0.5)`` (the cell
list for such cells), with the pairs each found and whether the two agree. ``--overlap``
first moves atom 1 to 0.3 Å from atom 0, so both must find that pair.

    python benchmarks/close_pairs.py --atoms 13824,157464,1000000 --out close_pairs.json

writes a JSON with a ``cases`` list of {atoms, method, seconds, pairs} and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ase
import numpy as np
from ase.neighborlist import neighbor_list

sys.path.insert(0, str(Path(__file__).parent))
from profile_step import nacl

from fastmace.dynamics.checks import _close_pairs

CUTOFF_A = 0.5  # checks.MIN_DISTANCE_A, the check's distance
Pairs = tuple[np.ndarray, np.ndarray, np.ndarray]


def structure(atoms: int, overlap: bool) -> ase.Atoms:
    """``atoms`` of NaCl; with ``overlap``, atom 1 moved to 0.3 Å of atom 0."""
    built = nacl(atoms)
    if overlap:
        built.positions[1] = built.positions[0] + [0.3, 0.0, 0.0]
    return built


def ase_pairs(atoms: ase.Atoms) -> Pairs:
    return neighbor_list("ijd", atoms, CUTOFF_A)


def fastmace_pairs(atoms: ase.Atoms) -> Pairs:
    return _close_pairs(atoms, CUTOFF_A)


def timed(search: Callable[[ase.Atoms], Pairs], atoms: ase.Atoms) -> tuple[float, Pairs]:
    start = time.perf_counter()
    pairs = search(atoms)
    return time.perf_counter() - start, pairs


def by_pair(pairs: Pairs) -> Pairs:
    order = np.lexsort((pairs[1], pairs[0]))
    return pairs[0][order], pairs[1][order], pairs[2][order]


def same_pairs(ours: Pairs, theirs: Pairs) -> bool:
    """The same (i, j) pairs, in any order, at the same distances."""
    (i, j, d), (i_, j_, d_) = by_pair(ours), by_pair(theirs)
    if len(i) != len(i_):
        return False
    return np.array_equal(i, i_) and np.array_equal(j, j_) and np.allclose(d, d_, atol=1e-9)


def case(atoms: int, method: str, seconds: float, pairs: Pairs) -> dict[str, Any]:
    row: dict[str, Any] = {"atoms": atoms, "method": method, "seconds": seconds}
    row["pairs"] = len(pairs[0])
    if len(pairs[0]):
        closest = int(np.argmin(pairs[2]))
        row["closest"] = [int(pairs[0][closest]), int(pairs[1][closest]), float(pairs[2][closest])]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--atoms", default="13824,157464,1000000", help="comma-separated sizes")
    parser.add_argument("--overlap", action="store_true", help="move atom 1 to 0.3 Å of atom 0")
    parser.add_argument("--out", type=Path, help="the JSON file to write")
    arguments = parser.parse_args()
    cases = []
    print(f"{'atoms':>9} {'ASE s':>8} {'FastMACE s':>11} {'pairs':>6} agree")
    for size in (int(text) for text in arguments.atoms.split(",")):
        built = structure(size, arguments.overlap)
        ase_s, theirs = timed(ase_pairs, built)
        ours_s, ours = timed(fastmace_pairs, built)
        cases += [case(size, "ase", ase_s, theirs), case(size, "fastmace", ours_s, ours)]
        agree = same_pairs(ours, theirs)
        print(f"{size:>9} {ase_s:>8.2f} {ours_s:>11.2f} {len(ours[0]):>6} {agree}", flush=True)
    if arguments.out:
        arguments.out.parent.mkdir(parents=True, exist_ok=True)
        arguments.out.write_text(json.dumps({"cutoff_A": CUTOFF_A, "cases": cases}, indent=1))


if __name__ == "__main__":
    main()
