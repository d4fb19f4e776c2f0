"""Build the potential ahead of time once, at a small size, and say how it went (GPU machine).

    python3 tools/validation/aot_probe.py [ATOMS_PER_SIDE]

Prints the report, the build's seconds and, on failure, the whole chain of errors.
"""

from __future__ import annotations

import sys
import time
import traceback

import ase.build
import torch

from fastmace.dynamics.neighbours import NeighbourList
from fastmace.dynamics.potential import Potential
from fastmace.dynamics.state import State
from fastmace.models.backends import convert
from fastmace.models.templates import template


def main() -> int:
    side = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = convert(template("mp0-medium", dtype=torch.float32), "cueq", device)
    atoms = ase.build.bulk("NaCl", "rocksalt", a=5.64, cubic=True).repeat((side,) * 3)
    atoms.rattle(0.02, seed=1)
    potential = Potential(model, [11, 17], radial_table=True, compile=True)
    state = State.from_atoms(atoms, device=device)
    neighbours = NeighbourList(state, potential.r_max)
    edges = neighbours.cutoff_edges(state, neighbours.build(state))
    started = time.perf_counter()
    try:
        output = potential(state, edges, compute_stress=False)
    except Exception:
        traceback.print_exc()
        return 1
    print(f"first call {time.perf_counter() - started:.1f} s: {potential.aot_reports}")
    expected = potential.evaluate_eagerly(state, edges)
    print(f"forces differ by {float((output.forces - expected.forces).abs().max()):.3g} eV/Å")
    return 0


if __name__ == "__main__":
    sys.exit(main())
