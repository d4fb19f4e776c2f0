"""Build the potential ahead of time once, at a small size, and say how it went (GPU machine).

    python3 tools/validation/aot_probe.py [ATOMS_PER_SIDE]

Prints the report, the build's seconds and, on failure, the whole chain of errors.
"""

from __future__ import annotations

import faulthandler
import sys
import time
import traceback

import ase.build
import torch

from fastmace.dynamics import aot_potential as aot
from fastmace.dynamics.neighbours import NeighbourList
from fastmace.dynamics.potential import Potential
from fastmace.dynamics.state import State
from fastmace.models.backends import convert
from fastmace.models.templates import template


def main() -> int:
    faulthandler.enable()
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
        graph = aot.trace(potential, state, edges, False)
        print(f"traced in {time.perf_counter() - started:.1f} s", flush=True)
        exported = torch.export.export(
            graph, tuple(aot._inputs(state, edges)),
            dynamic_shapes=aot._dynamic_shapes(edges.mirrored), strict=False,
        )  # fmt: skip
        print(f"exported at {time.perf_counter() - started:.1f} s", flush=True)
        with aot._inductor_settings(state.device), aot._cuda_home_for(state.device):
            path = torch._inductor.aoti_compile_and_package(exported, package_path="/tmp/p.pt2")
        print(f"compiled at {time.perf_counter() - started:.1f} s", flush=True)
        runner = torch._inductor.aoti_load_package(path, run_single_threaded=True)
        print(f"loaded at {time.perf_counter() - started:.1f} s", flush=True)
        outputs = runner(*aot._inputs(state, edges))
        torch.cuda.synchronize()
        print(f"called at {time.perf_counter() - started:.1f} s", flush=True)
        expected = potential.evaluate_eagerly(state, edges)
        difference = float((outputs[1] - expected.forces).abs().max())
        print(f"forces differ by {difference:.3g} eV/Å", flush=True)
        started = time.perf_counter()
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
