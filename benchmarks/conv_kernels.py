"""FastMACE's interaction convolution against cuEquivariance's, on the same inputs (GPU).

For each size of rock-salt NaCl and each interaction block of a template model (float32,
cuEquivariance, the mirrored edges and per-pair radial weights the engine gives the model):

* the block's convolution forward, and forward + backward (what forces need): the GPU's
  kernel time per call (profiler) and the wall time per eager call (CUDA events), for
  cuEquivariance's fused convolution (mace's ``conv_fusion`` with a per-pair weight index)
  and FastMACE's (dynamics/fused_conv.py);
* each one's largest error against the same formulas in float64, relative to the largest
  value, for the messages and for the gradients of features, harmonics and weights;
* the block's radial table and convolution together, from the pairs' lengths: the table then
  cuEquivariance's convolution, against FastMACE's convolution reading the table itself
  (dynamics/table_conv.py), with the difference of their messages;
* FastMACE's kernels alone with other launches (registers per thread capped, the next
  edges' indices loaded ahead), reading per-pair weights and reading the table
  (``--launches-only``: these alone);
* then the whole potential (energy and forces; radial tables as the default path has them)
  with either convolution, captured in a CUDA graph and replayed (ms per evaluation), and the
  forces' difference.

    python benchmarks/conv_kernels.py --atoms 216,1728,13824 --out DIR [--launches-only]

writes DIR/conv_kernels.json (a ``cases`` list as md_speed.py's: model, atoms, path, variant,
status, ms_per_step) and prints a table. The kernels' story is in docs/validation/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from profile_step import graph_ms, nacl

from fastmace.dynamics.fused_conv import (
    FusedConvolution,
    _module_messages,
    convolve_backward_reference,
    convolve_reference,
    coupling_of,
)
from fastmace.dynamics.neighbours import NeighbourList
from fastmace.dynamics.pair_radials import PairIndexedConvolution
from fastmace.dynamics.potential import Potential
from fastmace.dynamics.state import State
from fastmace.dynamics.table_conv import TabulatedConvolution
from fastmace.models.load import load

DEVICE = "cuda"
REPEATS = 20
LAUNCHES_ONLY = False  # --launches-only: FastMACE's kernels at each launch, nothing else


def timed_ms(function: Any) -> dict[str, float]:
    """Median wall ms per call between CUDA events (eager: launches included), and the GPU's
    busy ms per call from the profiler's kernel times. Not a CUDA graph: gradients of leaves
    made outside a capture make autograd touch their stream during it."""
    function()
    if DEVICE != "cuda":  # a smoke test of the script
        started = time.perf_counter()
        function()
        return {"wall_ms": (time.perf_counter() - started) * 1000, "kernel_ms": float("nan")}
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    walls = []
    for _ in range(REPEATS):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        function()
        stop.record()
        torch.cuda.synchronize()
        walls.append(start.elapsed_time(stop))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            function()
        torch.cuda.synchronize()
    busy = sum(event.device_time_total for event in prof.events()
               if event.device_type == torch.autograd.DeviceType.CUDA)  # fmt: skip
    return {"wall_ms": sorted(walls)[len(walls) // 2], "kernel_ms": busy / 1000 / 5}


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-300))


def block_inputs(potential: Potential, state: State, edges: Any, block: torch.nn.Module,
                 generator: torch.Generator) -> dict[str, torch.Tensor]:  # fmt: skip
    """The block's convolution inputs at this size: the real edge index (padding rerouted
    to the padding nodes), random features for every node, harmonics and per-pair weights."""
    graph = potential._graph(state, edges, False)
    edge_index = graph.data["edge_index"]
    coupling = coupling_of(block)
    d1, d2, _ = coupling.coefficients.shape
    # Every node, the padding nodes too (one per 128 atoms): the edges reach them all.
    atoms, count = graph.data["node_attrs"].shape[0], edge_index.shape[1]

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=generator, device=DEVICE)

    return {
        "features": draw(atoms, d1 * coupling.channels),
        "harmonics": draw(count, d2),
        "weights": draw(count // 2, coupling.paths * coupling.channels),
        "edge_index": edge_index,
    }


class _BothHalves(torch.nn.Module):
    """A backend convolution that takes no weight index, given each pair's weights twice."""

    def __init__(self, block: torch.nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, features, harmonics, weights, edge_index):
        return _module_messages(self.block, features, harmonics, torch.cat([weights, weights]),
                                edge_index)  # fmt: skip


class _TableThenConvolution(torch.nn.Module):
    """A block's radial table at the lengths, then a convolution that takes weights."""

    def __init__(self, table: torch.nn.Module, convolution: torch.nn.Module) -> None:
        super().__init__()
        self.table, self.convolution = table, convolution

    def forward(self, features, harmonics, lengths, edge_index):
        return self.convolution(features, harmonics, self.table(lengths), edge_index)


def backend_convolution(potential: Potential, index: int) -> torch.nn.Module:
    """The backend's convolution of block ``index`` as the default path runs it: with a
    per-pair weight index where it has one (cuEquivariance's fused convolution on CUDA)."""
    convolution = potential.pair_model.interactions[index].conv_tp
    if isinstance(convolution, PairIndexedConvolution):
        return convolution
    return _BothHalves(potential.model.interactions[index])


def time_convolution(convolution: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> dict:
    leaves = {name: inputs[name].clone().requires_grad_(True)
              for name in ("features", "harmonics", "weights")}  # fmt: skip
    args = (leaves["features"], leaves["harmonics"], leaves["weights"], inputs["edge_index"])
    grad = torch.randn_like(convolution(*args).detach())

    def forward() -> None:
        with torch.no_grad():
            convolution(*args)

    def both() -> None:
        torch.autograd.grad(convolution(*args), list(leaves.values()), grad)

    out = convolution(*args)
    grads = torch.autograd.grad(out, list(leaves.values()), grad)
    forward_times, both_times = timed_ms(forward), timed_ms(both)
    return {"forward_ms": forward_times["kernel_ms"], "ms": both_times["kernel_ms"],
            "wall_ms": both_times["wall_ms"], "forward_wall_ms": forward_times["wall_ms"],
            "found": [out.detach(), *grads], "grad": grad}  # fmt: skip


def float64_answers(coupling: Any, inputs: dict[str, torch.Tensor], grad: torch.Tensor,
                    chunk: int = 1 << 16) -> list:  # fmt: skip
    """The float64 formulas, ``chunk`` edges at a time: at 13,824 atoms one per-edge float64
    intermediate of the whole run is 18.6 GiB (stage 78 ran out of memory on an H100)."""
    atoms, c = inputs["features"].shape[0], coupling.channels
    x = inputs["features"].double().view(atoms, -1, c)
    w = inputs["weights"].double().view(inputs["weights"].shape[0], -1, c)
    y, index = inputs["harmonics"].double(), inputs["edge_index"]
    t, paths = coupling.coefficients.to(DEVICE), coupling.path_of.to(DEVICE)
    g = grad.double().view(atoms, -1, c)
    out, gx, gy, gw = 0.0, 0.0, [], []
    for start in range(0, y.shape[0], chunk):
        edges = torch.arange(start, min(start + chunk, y.shape[0]), device=y.device)
        rows = w[edges % w.shape[0]]  # edge e reads row e mod rows
        out = out + convolve_reference(x, y[edges], rows, t, paths, index[:, edges], 1)
        parts = convolve_backward_reference(g, x, y[edges], rows, t, paths, index[:, edges], 1)
        gx = gx + parts[0]
        gy.append(parts[1])
        gw.append(parts[2])
    grad_weights = torch.cat(gw)
    grad_weights = grad_weights.view(2, -1, *grad_weights.shape[1:]).sum(0)
    return [out.view(atoms, -1), gx.view(atoms, -1), torch.cat(gy),
            grad_weights.view(grad_weights.shape[0], -1)]  # fmt: skip


def convolution_cases(model_name: str, atoms: int, loaded: Any) -> list[dict[str, Any]]:
    structure = nacl(atoms)
    state = State.from_atoms([structure], device=DEVICE)
    potential = Potential(loaded.module, sorted(set(structure.numbers)), radial_table=True)
    neighbours = NeighbourList(state, potential.r_max, 0.5)
    edges = neighbours.cutoff_edges(state, neighbours.build(state))
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    cases = []
    for index, block in enumerate(potential.model.interactions):
        inputs = block_inputs(potential, state, edges, block, generator)
        coupling = coupling_of(block)
        table = potential.model.interactions[index].conv_tp_weights  # radial_table=True
        if LAUNCHES_ONLY:
            ours = FusedConvolution(coupling, torch.float32, torch.device(DEVICE), skip=1)
            cases += launch_cases(model_name, atoms, index, inputs, ours, table, generator)
            continue
        theirs = backend_convolution(potential, index)
        ours = FusedConvolution(coupling, torch.float32, torch.device(DEVICE), skip=1)
        timings = {"cueq": time_convolution(theirs, inputs),
                   "fastmace": time_convolution(ours, inputs)}  # fmt: skip
        # Both against float64 formulas, for the gradient the cuEq run was given.
        want = float64_answers(coupling, inputs, timings["cueq"]["grad"])
        want_ours = float64_answers(coupling, inputs, timings["fastmace"]["grad"])
        for path, timing in timings.items():
            reference = want if path == "cueq" else want_ours
            # Real atoms and edges only: the padding nodes (the last) and their edges are not
            # needed (ours leaves them zero).
            real = inputs["edge_index"][1] < state.n_atoms
            pairs = real[: real.shape[0] // 2]
            errors = [relative(timing["found"][0][:-1], reference[0][:-1]),
                      relative(timing["found"][1][:-1], reference[1][:-1]),
                      relative(timing["found"][2][real], reference[2][real]),
                      relative(timing["found"][3][pairs], reference[3][pairs])]  # fmt: skip
            cases.append({
                "model": model_name, "atoms": atoms, "path": "convolution",
                "variant": f"{path}-block{index}", "status": "ok",
                "ms_per_step": timing["ms"], "forward_ms": timing["forward_ms"],
                "wall_ms": timing["wall_ms"], "forward_wall_ms": timing["forward_wall_ms"],
                "edges": int(inputs["edge_index"].shape[1]),
                "errors_vs_float64": dict(zip(
                    ("messages", "features_grad", "harmonics_grad", "weights_grad"), errors,
                    strict=True)),
            })  # fmt: skip
        cases += table_cases(model_name, atoms, potential, index, inputs, theirs, ours, generator)
        cases += launch_cases(model_name, atoms, index, inputs, ours, table, generator)
    if LAUNCHES_ONLY:
        return cases
    return cases + potential_cases(model_name, atoms, loaded, state, edges)


def table_cases(model_name: str, atoms: int, potential: Potential, index: int, inputs: dict,
                theirs: torch.nn.Module, ours: FusedConvolution,
                generator: torch.Generator) -> list[dict[str, Any]]:  # fmt: skip
    """The table and the convolution of block ``index`` from each pair's length (uniform on
    [0, r_max]: the timing does not depend on where), both ways."""
    table = potential.model.interactions[index].conv_tp_weights  # built with radial_table=True
    rows = inputs["weights"].shape[0]
    lengths = torch.rand((rows, 1), generator=generator, device=DEVICE) * potential.r_max
    table_inputs = {**inputs, "weights": lengths}
    timings = {
        "cueq-table": time_convolution(_TableThenConvolution(table, theirs), table_inputs),
        "fastmace-table": time_convolution(TabulatedConvolution(ours, table), table_inputs),
    }
    difference = relative(timings["fastmace-table"]["found"][0][:-1],
                          timings["cueq-table"]["found"][0][:-1].double())  # fmt: skip
    return [{
        "model": model_name, "atoms": atoms, "path": "convolution",
        "variant": f"{path}-block{index}", "status": "ok", "ms_per_step": timing["ms"],
        "forward_ms": timing["forward_ms"], "wall_ms": timing["wall_ms"],
        "forward_wall_ms": timing["forward_wall_ms"],
        "errors_vs_float64": None, "messages_vs_cueq_table": difference,
    } for path, timing in timings.items()]  # fmt: skip


# conv_triton.Launch's fields as (channels per program, edges per iteration, registers per
# thread, next indices ahead, warps), None: conv_triton's rule; the module's launch first.
# Stage 109 (H100) made one warp of 64 channels (two a thread) the default; stage 111 chose
# two edges a step for first blocks and found four channels a thread and two warps slower.
# Tried now, on the two-channel programs (ptxas gives MP-0 medium's second block 167-224
# registers a thread, about nine programs an SM): room for 192 and 160 registers, and the
# next edges' indices loaded ahead.
LAUNCH_VARIANTS = ((64, None, None, False, 1), (64, None, 192, False, 1),
                   (64, None, 160, False, 1), (64, None, None, True, 1))  # fmt: skip


def launch_cases(model_name: str, atoms: int, index: int, inputs: dict, ours: FusedConvolution,
                 table: torch.nn.Module, generator: torch.Generator) -> list[dict]:  # fmt: skip
    """FastMACE's forward and backward kernels called directly with other launches, reading
    per-pair weights and reading the radial table: each program walks its atom's edges as a
    chain of dependent loads, and the launches change how much of it overlaps (registers per
    thread, the next edges' indices loaded ahead; docs/design/convolution.md). Each variant's
    results against the module's launch."""
    if DEVICE != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return []  # the kernels run on CUDA, or in Triton's interpreter (a smoke test)
    from fastmace.dynamics import conv_triton

    count = inputs["features"].shape[0]
    features = inputs["features"].view(count, -1, ours.channels)
    weights = inputs["weights"].view(inputs["weights"].shape[0], ours.paths, ours.channels)
    harmonics, edge_index = inputs["harmonics"], inputs["edge_index"]
    reach = table.intervals * table.spacing  # the table spans [0, r_max]
    lengths = torch.rand(weights.shape[0], generator=generator, device=DEVICE) * reach
    grad = torch.randn((count, ours.coefficients.shape[2], ours.channels), generator=generator,
                       device=DEVICE)  # fmt: skip
    receiver_runs = conv_triton.runs(edge_index[1], count)
    sender_runs = conv_triton.runs(edge_index[0], count)
    reads = {"weights": (weights,), "table": (lengths, table.coefficients, table.inverse_spacing)}
    calls = {
        "weights": (conv_triton.forward, conv_triton.backward),
        "table": (conv_triton.forward_from_table, conv_triton.backward_from_table),
    }
    found, cases = {}, []
    for source, (forward_kernel, backward_kernel) in calls.items():
        read = reads[source]
        for variant in LAUNCH_VARIANTS:
            launch = conv_triton.Launch(*variant)
            threads, step, registers, prefetch, warps = variant

            def forward(launch=launch, kernel=forward_kernel, read=read) -> torch.Tensor:
                return kernel(ours.key, features, harmonics, *read, ours.coefficients,
                              edge_index[0], receiver_runs, ours.skip, launch)  # fmt: skip

            def backward(launch=launch, kernel=backward_kernel, read=read) -> tuple:
                return kernel(ours.key, grad, features, harmonics, *read, ours.coefficients,
                              edge_index, receiver_runs, sender_runs, ours.skip,
                              launch)  # fmt: skip

            forward_times, backward_times = timed_ms(forward), timed_ms(backward)
            found[source, variant] = [forward(), *backward()]
            cases.append({
                "model": model_name, "atoms": atoms, "path": "convolution",
                "variant": f"fastmace-{source}-threads{threads}-step{step or 'auto'}"
                           f"-registers{registers or 'any'}{'-prefetch' * prefetch}"
                           f"{f'-warps{warps}' if warps else ''}"
                           f"-block{index}",
                "status": "ok",
                "ms_per_step": forward_times["kernel_ms"] + backward_times["kernel_ms"],
                "forward_ms": forward_times["kernel_ms"],
                "backward_ms": backward_times["kernel_ms"],
                "wall_ms": forward_times["wall_ms"] + backward_times["wall_ms"],
                "reads": source, "threads": threads, "step": step, "registers": registers,
                "prefetch": prefetch, "warps": warps, "launch": variant,
            })  # fmt: skip
    for case in cases:
        reference = found[case["reads"], LAUNCH_VARIANTS[0]]
        pairs = zip(found[case["reads"], case.pop("launch")], reference, strict=True)
        case["vs_module_launch"] = max(relative(got, want.double()) for got, want in pairs)
    return cases


def potential_cases(model_name: str, atoms: int, loaded: Any, state: State,
                    edges: Any) -> list[dict[str, Any]]:  # fmt: skip
    species = sorted(set(state.atomic_numbers.tolist()))
    found, cases = {}, []
    for path, fused in (("cueq", False), ("fastmace-conv", True)):
        potential = Potential(loaded.module, species, radial_table=True, fused_convolution=fused)
        evaluate = lambda potential=potential: potential(state, edges)  # noqa: E731
        ms = graph_ms(evaluate) if DEVICE == "cuda" else timed_ms(evaluate)["wall_ms"]
        found[path] = potential(state, edges).forces
        cases.append({"model": model_name, "atoms": atoms, "path": "potential",
                      "variant": f"{path}-table", "status": "ok", "ms_per_step": ms})  # fmt: skip
    scale = float(found["cueq"].abs().max())
    cases[-1]["forces_vs_cueq"] = (
        float((found["fastmace-conv"] - found["cueq"]).abs().max()) / scale
    )
    return cases


def kernel_benchmark(doc: str, cases_of: Any, path: str, json_name: str) -> None:
    """The command line both kernel benchmarks share (this one and product_kernels.py):
    ``cases_of(model_name, atoms, loaded)`` for each size, a failing size recorded and the
    others kept, a line per case, and DIR/``json_name``."""
    global DEVICE, LAUNCHES_ONLY
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--atoms", default="216,1728,13824")
    parser.add_argument("--model", default="mp0-medium")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda", help="cpu: a smoke test of this script")
    parser.add_argument(
        "--launches-only", action="store_true", help="conv_kernels.py: its own kernels' launches"
    )
    args = parser.parse_args()
    DEVICE = args.device  # the timing helpers read it
    LAUNCHES_ONLY = args.launches_only
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    loaded = load(f"template:{args.model}", backend="cueq", device=DEVICE, dtype="float32")
    cases: list[dict[str, Any]] = []
    for atoms in (int(text) for text in args.atoms.split(",")):
        try:
            cases += cases_of(args.model, atoms, loaded)
        except Exception as error:  # one size failing must not lose the others
            traceback.print_exc()
            cases.append({"model": args.model, "atoms": atoms, "path": path,
                          "variant": "all", "status": "error", "ms_per_step": None,
                          "error": f"{type(error).__name__}: {error}"[:2000]})  # fmt: skip
        for case in cases:
            if case["atoms"] == atoms:
                print(f"{case['atoms']:>7} {case['path']:<14} {case['variant']:<24} "
                      f"{case['status']:<6} {case.get('ms_per_step') or 0:9.3f} ms "
                      f"fwd {case.get('forward_ms') or 0:8.3f} "
                      f"wall {case.get('wall_ms') or 0:8.3f} "
                      f"{json.dumps(_accuracy(case))}",
                      flush=True)  # fmt: skip
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    device = torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE
    record = {"device": device, "torch": torch.__version__,
              "seconds": time.perf_counter() - started, "cases": cases}  # fmt: skip
    (args.out / json_name).write_text(json.dumps(record, indent=1))


def _accuracy(case: dict[str, Any]) -> Any:
    """What a case records of its numbers' accuracy, whichever kind of case it is."""
    for name in (
        "errors_vs_float64",
        "forces_vs_cueq",
        "messages_vs_cueq_table",
        "vs_module_launch",
    ):
        if case.get(name) is not None:
            return case[name]
    return None


def main() -> None:
    kernel_benchmark(__doc__, convolution_cases, "convolution", "conv_kernels.json")


if __name__ == "__main__":
    main()
