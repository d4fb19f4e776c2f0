"""The cost of D3's three-body (ATM) term: triples per atom at the default cutoffs in fcc Cu,
and the time of one evaluation (energy, forces, stress) with and without it.

    python benchmarks/d3_atm_cost.py --atoms 32 256 --device cpu

Prints one line per size; docs/validation/dispersion.md ("Three-body term") quotes it.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from ase.build import bulk

from fastmace.dynamics.dispersion import D3BJ, DEFAULT_CUTOFF_A, D3BJParameters
from fastmace.dynamics.neighbours import NeighbourList
from fastmace.dynamics.state import State

REPEATS = {32: (2, 2, 2), 256: (4, 4, 4), 864: (6, 6, 6)}


def triples_per_centre(atoms, cutoff: float) -> tuple[int, int]:
    """Unordered pairs of one atom's neighbours within the cutoff whose third side is too."""
    state = State.from_atoms([atoms])
    edges = NeighbourList(state, cutoff, skin=0.0).build(state)
    sender, receiver = edges.edge_index[:, edges.mask]
    shifts = edges.unit_shifts[edges.mask] @ state.cell[0]
    vectors = state.positions[receiver] - state.positions[sender] + shifts
    mine = vectors[sender == 0]
    mine = mine[(mine * mine).sum(-1).sqrt() <= cutoff]
    count = 0
    for block in torch.split(mine, 512):
        count += int((torch.cdist(block, mine) <= cutoff).sum())
    return (count - mine.shape[0]) // 2, mine.shape[0]


def evaluation_seconds(atoms, device: str, three_body: bool, repeats: int) -> tuple[float, int]:
    state = State.from_atoms([atoms], device=device)
    edges = NeighbourList(state, DEFAULT_CUTOFF_A, skin=0.0).build(state)
    d3 = D3BJ(D3BJParameters.for_functional("pbe"), [29], three_body=three_body, device=device)
    if three_body:
        d3.size_triples(edges)
    d3(state, edges, compute_stress=True)  # warm-up
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        d3(state, edges, compute_stress=True)
    sync()
    return (time.perf_counter() - start) / repeats, d3.slots or 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--atoms", type=int, nargs="+", default=[32, 256])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, {args.device}")
    for n in args.atoms:
        atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat(REPEATS[n])
        atoms.rattle(0.02, seed=1)
        triples, neighbours = triples_per_centre(atoms, DEFAULT_CUTOFF_A)
        two, _ = evaluation_seconds(atoms, args.device, False, args.repeats)
        three, slots = evaluation_seconds(atoms, args.device, True, args.repeats)
        print(
            f"{n} atoms: {neighbours} neighbours and {triples} triples per centre "
            f"({triples // 3} distinct triangles per atom), {slots} slots; one evaluation "
            f"two-body {two:.3g} s, with ATM {three:.3g} s",
            flush=True,
        )


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
