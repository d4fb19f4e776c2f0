"""Ways to keep a traced potential between processes, tried one per process (GPU machine).

    python3 tools/validation/aot_probe2.py inductor           # trace, Inductor's Python wrapper
    python3 tools/validation/aot_probe2.py aoti-build PATH [separate-weights]
        (AOT_PROBE_LIBS=":libstdc++.so.6" links those libraries too)
    python3 tools/validation/aot_probe2.py aoti-load PATH      # in a fresh process

Each prints its phases' seconds and the largest force difference from the eager evaluation.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import time

import ase.build
import torch

from fastmace.dynamics import aot_potential as aot
from fastmace.dynamics.neighbours import NeighbourList
from fastmace.dynamics.potential import Potential
from fastmace.dynamics.state import State
from fastmace.models.backends import convert
from fastmace.models.templates import template


def setup():
    name = os.environ.get("AOT_PROBE_TEMPLATE", "mp0-medium")
    model = convert(template(name, dtype=torch.float32), "cueq", "cuda")
    atoms = ase.build.bulk("NaCl", "rocksalt", a=5.64, cubic=True).repeat((3, 3, 3))
    atoms.rattle(0.02, seed=1)
    potential = Potential(model, [11, 17], radial_table=True)
    state = State.from_atoms(atoms, device="cuda")
    neighbours = NeighbourList(state, potential.r_max)
    return potential, state, neighbours.cutoff_edges(state, neighbours.build(state))


def report(potential, state, edges, outputs, started) -> None:
    torch.cuda.synchronize()
    expected = potential.evaluate_eagerly(state, edges)
    difference = float((outputs[1] - expected.forces).abs().max())
    print(f"called at {time.perf_counter() - started:.1f} s; forces differ by {difference:.3g}")


def main() -> int:
    faulthandler.enable()
    mode = sys.argv[1]
    potential, state, edges = setup()
    started = time.perf_counter()
    if mode == "aoti-load":
        # The load took 33 s on the H200 (stage 63): Python's stack every 5 s says where.
        faulthandler.dump_traceback_later(5, repeat=True)
        runner = torch._inductor.aoti_load_package(sys.argv[2], run_single_threaded=True)
        faulthandler.cancel_dump_traceback_later()
        print(f"loaded at {time.perf_counter() - started:.1f} s", flush=True)
        report(potential, state, edges, runner(*aot._inputs(state, edges)), started)
        return 0
    graph = aot.trace(potential, state, edges, False)
    print(f"traced at {time.perf_counter() - started:.1f} s", flush=True)
    if mode == "inductor":
        from torch._inductor.compile_fx import compile_fx

        fake = [node.meta["val"] for node in graph.graph.nodes if node.op == "placeholder"]
        with aot._inductor_settings(state.device):
            compiled = compile_fx(graph, fake)
        print(f"compiled at {time.perf_counter() - started:.1f} s", flush=True)
        report(potential, state, edges, compiled(*aot._inputs(state, edges)), started)
        return 0
    exported = torch.export.export(
        graph, tuple(aot._inputs(state, edges)),
        dynamic_shapes=aot._dynamic_shapes(edges.mirrored), strict=False,
    )  # fmt: skip
    options = {}
    if len(sys.argv) > 3:
        options = {"aot_inductor.package_constants_in_so": False}
    if os.environ.get("AOT_PROBE_LIBS"):  # more libraries to link, e.g. ":libstdc++.so.6"
        options["aot_inductor.custom_op_libs"] = os.environ["AOT_PROBE_LIBS"].split(",")
    with aot._inductor_settings(state.device), aot._cuda_home_for(state.device):
        torch._inductor.aoti_compile_and_package(
            exported, package_path=sys.argv[2], inductor_configs=options
        )
    print(f"built at {time.perf_counter() - started:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
