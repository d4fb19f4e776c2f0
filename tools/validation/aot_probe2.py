"""Ways to keep a traced potential between processes, tried one per process (GPU machine).

    python3 tools/validation/aot_probe2.py inductor           # trace, Inductor's Python wrapper
    python3 tools/validation/aot_probe2.py aoti-build PATH [separate-weights]
        (AOT_PROBE_LIBS=":libstdc++.so.6" links those libraries too)
    python3 tools/validation/aot_probe2.py aoti-load PATH      # in a fresh process
    python3 tools/validation/aot_probe2.py compare             # package against torch.compile

`compare` builds one Potential evaluated through a package compiled ahead of time (built, or
loaded from the cache root on a second run) and one through torch.compile, and times each
one's first call and 20 more (AOT_PROBE_REPEAT NaCl cells a side, default 3).

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


def setup(compiled: bool = False):
    name = os.environ.get("AOT_PROBE_TEMPLATE", "mp0-medium")
    model = convert(template(name, dtype=torch.float32), "cueq", "cuda")
    repeat = int(os.environ.get("AOT_PROBE_REPEAT", "3"))
    atoms = ase.build.bulk("NaCl", "rocksalt", a=5.64, cubic=True).repeat((repeat,) * 3)
    atoms.rattle(0.02, seed=1)
    potential = Potential(model, [11, 17], radial_table=True, compile=compiled)
    state = State.from_atoms(atoms, device="cuda")
    neighbours = NeighbourList(state, potential.r_max)
    return potential, state, neighbours.cutoff_edges(state, neighbours.build(state))


def report(potential, state, edges, outputs, started) -> None:
    torch.cuda.synchronize()
    expected = potential.evaluate_eagerly(state, edges)
    difference = float((outputs[1] - expected.forces).abs().max())
    print(f"called at {time.perf_counter() - started:.1f} s; forces differ by {difference:.3g}")


def timed(label: str, potential, state, edges, calls: int = 20) -> torch.Tensor:
    torch.cuda.synchronize()
    started = time.perf_counter()
    forces = potential(state, edges).forces
    torch.cuda.synchronize()
    first = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(calls):
        potential(state, edges)
    torch.cuda.synchronize()
    each = (time.perf_counter() - started) / calls * 1e3
    print(f"{label}: first call {first:.1f} s, then {each:.2f} ms per call", flush=True)
    return forces


def compare() -> int:
    potential, state, edges = setup(compiled=True)
    print(f"{state.n_atoms} atoms, {int(edges.capacity)} edge slots", flush=True)
    potential.ahead_of_time = True  # what the CPU does; CUDA's rule is what this measures
    ahead = timed("ahead of time", potential, state, edges)
    print(f"  {potential.aot_reports}", flush=True)
    potential.ahead_of_time = False
    compiled = timed("torch.compile", potential, state, edges)
    eager = potential.evaluate_eagerly(state, edges).forces
    for label, forces in (("ahead of time", ahead), ("torch.compile", compiled)):
        print(f"{label}: forces {float((forces - eager).abs().max()):.3g} eV/A from eager")
    return 0


def main() -> int:
    faulthandler.enable()
    mode = sys.argv[1]
    if mode == "compare":
        return compare()
    potential, state, edges = setup()
    started = time.perf_counter()
    if mode == "aoti-load":
        # The load took 33 s on the H200 (stage 63): Python's stack every 5 s says where.
        faulthandler.dump_traceback_later(5, repeat=True)
        with open(sys.argv[2], "rb") as package:
            runner = aot._load(package.read())
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
