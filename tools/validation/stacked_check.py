"""The stacked linear layers on the GPU: forces with and without them, compiled and eager.

One MP-0-medium template in float32 (cuEquivariance, radial tables) on NaCl, the same state and
edges for each potential; prints the energy, the largest force and each one's largest force
difference from the eager potential with cuEquivariance's own layers:

    python tools/validation/stacked_check.py [--atoms 216]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
from profile_step import nacl

from fastmace.dynamics.neighbours import NeighbourList
from fastmace.dynamics.potential import Potential
from fastmace.dynamics.state import State
from fastmace.models.load import load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--atoms", type=int, default=216)
    parser.add_argument("--model", default="mp0-medium")
    args = parser.parse_args()
    loaded = load(f"template:{args.model}", backend="cueq", device="cuda", dtype="float32")
    structure = nacl(args.atoms)
    state = State.from_atoms([structure], device="cuda")
    species = sorted(set(structure.numbers))
    reference = None
    for compiled in (False, True):
        for stacked in (False, True):
            potential = Potential(loaded.module, species, radial_table=True, compile=compiled,
                                  stack_linears=stacked)  # fmt: skip
            neighbours = NeighbourList(state, potential.r_max, 0.5)
            edges = neighbours.cutoff_edges(state, neighbours.build(state))
            out = potential(state, edges)
            forces = out.forces.double()
            if reference is None:
                reference = forces
            scale = float(reference.abs().max())
            print(f"compiled {compiled!s:5} stacked {stacked!s:5} layers "
                  f"{len(potential.stacked_layers):3} energy {float(out.energy.sum()):.6f} "
                  f"max |F| {float(forces.abs().max()):.5f} "
                  f"vs eager unstacked {float((forces - reference).abs().max()) / scale:.2e}",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
