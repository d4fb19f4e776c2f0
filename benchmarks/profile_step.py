"""Where one FastMACE MD step spends its GPU time: kernel tables and a split by component.

For each size it builds the benchmark's run (random-weight template, rock-salt NaCl, Langevin
NVT at 300 K, 1 fs, float32, no output; the same set-up as ``md_speed.py``) and prints:

* ``ms/step``: graph replays only, timed on the host between synchronisations;
* the kernel table of replayed blocks (torch.profiler): kernel, calls per step, ms per step,
  grouped into families (GEMM, cuEquivariance, indexing, element-wise, reductions, ...);
* the step split by component, each captured in a CUDA graph of its own and replayed:
  neighbour search, skin check, the model's edges (compaction to the
  cutoff), the potential (model forward and forces), and the whole step;
* the aten operators of one eager force evaluation with their input shapes (which operator
  launches which kernels), sorted by their own GPU time.

Run on the GPU machine from the repository root (a few minutes for 216 and 13,824 atoms)::

    . .gpu/setup.sh && PYTHONPATH=$PWD/packages/fastmace/src:$PYTHONPATH \
        python benchmarks/profile_step.py --atoms 216,13824 --out $OUT

Results: ``profile_step.json`` and ``profile_step.md`` in ``--out``.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import ase.build
import torch

from fastmace.dynamics.ensembles import ensemble
from fastmace.io import OutputSchedule
from fastmace.models.load import load
from fastmace.planner import EngineSettings
from fastmace.simulation import RunSettings, Simulation

HEADS = {"mh-1": "omat_pbe"}
# Kernel families, first match wins (names as CUDA reports them).
FAMILIES = (
    ("GEMM (float32, CUDA cores)", r"gemm.*f32f32|sgemm|gemm_f32"),
    ("GEMM (tensor cores)", r"tf32|s1688|s16816|xmma.*tf32|cutlass.*tf32|h16816|bf16"),
    ("GEMM / GEMV (float64)", r"dgemm|gemvx|gemv2T|dot_kernel|gemv"),
    ("GEMM (other)", r"gemm|cutlass"),
    ("cuEquivariance", r"segmented_polynomial|uniform_1d|cuequivariance|tensor_product|kernel_sc"),
    ("indexing backward (sort)", r"indexing_backward|radix|sort|Sort"),
    ("index / gather / scatter", r"index|gather|scatter|take"),
    ("reductions / scans", r"reduce|Reduce|scan|Scan|cumsum|search"),
    ("element-wise", r"elementwise|vectorized|unrolled|Elementwise|fill|copy|CatArray"),
)


def nacl(atoms: int, rattle_A: float = 0.05) -> ase.Atoms:
    """Rock-salt NaCl (8 n^3 atoms), rattled as the performance issue specifies."""
    n = round((atoms / 8) ** (1 / 3))
    if 8 * n**3 != atoms:
        raise ValueError(f"{atoms} atoms is not a cubic NaCl supercell (8 n^3)")
    structure = ase.build.bulk("NaCl", "rocksalt", a=5.64, cubic=True).repeat(n)
    structure.rattle(rattle_A, seed=1)
    return structure


def family(name: str) -> str:
    for label, pattern in FAMILIES:
        if re.search(pattern, name):
            return label
    return "other"


def simulation_for(
    model: str,
    atoms: int,
    backend: str,
    block: int,
    dispersion: bool = False,
    compile_model: bool = False,
) -> Simulation:
    loaded = load(
        f"template:{model}", head=HEADS.get(model), backend=backend,
        device="cuda", dtype="float32", seed=0,
    )  # fmt: skip
    settings = RunSettings(
        ensemble=ensemble("nvt", temperature_K=300.0, friction_per_ps=10.0),
        steps=block * 1000,
        timestep_fs=1.0,
        seed=0,
        schedule=OutputSchedule(0, 0, 0),
        initial_temperature_K=300.0,
        # D3(BJ) with PBE's parameters, the functional MP-0 was fitted to.
        dispersion="d3bj" if dispersion else None,
        dispersion_functional="pbe" if dispersion else None,
    )
    engine = EngineSettings(
        device="cuda", backend=backend, dtype="float32", block_steps=block, compile=compile_model
    )
    return Simulation(
        loaded, [nacl(atoms)], settings, output=None, engine=engine, progress=io.StringIO()
    )


def replay_ms(simulation: Simulation, blocks: int) -> float:
    engine = simulation.engine
    torch.cuda.synchronize()
    tick = time.perf_counter()
    for _ in range(blocks):
        engine.run_block()
    return 1000 * (time.perf_counter() - tick) / (blocks * engine.block_steps)


def kernel_table(simulation: Simulation, blocks: int) -> list[dict[str, Any]]:
    """Kernels of ``blocks`` replayed blocks: calls and ms per MD step, most expensive first."""
    from torch.profiler import ProfilerActivity, profile

    steps = blocks * simulation.engine.block_steps
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(blocks):
            simulation.engine.run_block()
        torch.cuda.synchronize()
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            total = totals[event.name]
            total[0] += 1
            total[1] += event.device_time_total / 1000  # us -> ms
    rows = [
        {"kernel": name, "family": family(name), "calls_per_step": calls / steps,
         "ms_per_step": ms / steps}
        for name, (calls, ms) in totals.items()
    ]  # fmt: skip
    return sorted(rows, key=lambda row: -row["ms_per_step"])


def graph_ms(function: Any, repeats: int = 20, generators: tuple = ()) -> float:
    """ms per call of ``function`` captured in a CUDA graph and replayed ``repeats`` times."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            function()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    for generator in generators:
        graph.register_generator_state(generator)
    with torch.cuda.graph(graph):
        function()
    graph.replay()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        graph.replay()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / repeats


def component_split(simulation: Simulation) -> dict[str, Any]:
    """Each part of the step captured alone (state and list as they are now)."""
    force_field = simulation.engine.force_field
    neighbours, potential = force_field.neighbours, force_field.potential
    md = simulation.engine.md
    state, edges = md.state, force_field.edges
    model_edges = neighbours.cutoff_edges(state, edges)
    stress = force_field.stress
    step = simulation.engine.step_fn
    from fastmace.dynamics.engine import generators_of

    generators = tuple(generators_of(md))
    work = {
        "neighbour search (rebuild)": lambda: neighbours.rebuild(state, edges),
        "skin check only": lambda: neighbours.needs_rebuild(state),
        "model edges (compaction to the cutoff)": lambda: neighbours.cutoff_edges(state, edges),
        "potential (model forward + forces)": lambda: potential(state, model_edges, stress),
        "one step (search, model edges, potential, integrator)": lambda: step(md, force_field),
    }
    term = force_field.dispersion
    kernels = {}
    if term is not None:  # D3(BJ) on its own list: its search and its evaluation alone
        work["D3 list search (rebuild)"] = lambda: term.neighbours.rebuild(state, term.edges)
        chosen = term.d3.kernel
        kernels = {f"D3 energy and forces ({kernel})": kernel for kernel in ("torch", "triton")}
        for name in kernels:
            work[name] = lambda: term.d3(state, term.edges, stress)
    split: dict[str, Any] = {}
    for name, function in work.items():
        if name in kernels:
            term.d3.kernel = kernels[name]  # each evaluation with the kernels it names
        try:
            split[name] = graph_ms(function, generators=generators)
        except Exception as error:  # record and go on: a profile, not a test
            split[name] = f"{type(error).__name__}: {error}"[:300]
    if term is not None:
        term.d3.kernel = chosen
        split["D3 kernel chosen"] = term.kernel_choice
    return split


def eager_operators(simulation: Simulation, rows: int = 45) -> str:
    """aten operators of one eager force evaluation, by the GPU time of the kernels each
    launched itself, grouped by operator and input shapes."""
    from torch.profiler import ProfilerActivity, profile

    force_field = simulation.engine.force_field
    state = simulation.engine.md.state
    force_field(state)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as p:
        force_field(state)
        torch.cuda.synchronize()
    totals: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    for event in p.events():
        if event.device_type != torch.autograd.DeviceType.CPU:
            continue
        own = event.self_device_time_total
        if own <= 0:
            continue
        shapes = str(event.input_shapes)[:70]
        total = totals[(event.name, shapes)]
        total[0] += 1
        total[1] += own / 1000
    ranked = sorted(totals.items(), key=lambda item: -item[1][1])[:rows]
    lines = [f"{'ms':>8} {'calls':>5}  operator  input shapes"]
    for (name, shapes), (calls, ms) in ranked:
        lines.append(f"{ms:8.3f} {calls:5d}  {name}  {shapes}")
    return "\n".join(lines)


def tf32_potential_ms(simulation: Simulation) -> dict[str, float]:
    """The potential captured with float32 GEMMs on CUDA cores and with TF32 tensor cores."""
    force_field = simulation.engine.force_field
    state = simulation.engine.md.state
    model_edges = force_field.model_edges(state)
    before = torch.backends.cuda.matmul.allow_tf32
    result = {}
    try:
        for flag in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = flag
            result["tf32" if flag else "float32"] = graph_ms(
                lambda: force_field.potential(state, model_edges)
            )
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    return result


def compile_probe(simulation: Simulation) -> str:
    """Call the model once through torch.compile (Potential(compile=True)); the error if any."""
    import traceback

    from fastmace.dynamics.potential import Potential

    force_field = simulation.engine.force_field
    state = simulation.engine.md.state
    potential = force_field.potential
    try:
        compiled = Potential(potential.model, potential.species, potential.head, compile=True)
        tick = time.perf_counter()
        compiled(state, force_field.model_edges(state))
        torch.cuda.synchronize()
        first_s = time.perf_counter() - tick
        ms = graph_ms(lambda: compiled(state, force_field.model_edges(state)))
        return f"compiled: first call {first_s:.1f} s, captured {ms:.3f} ms per force call"
    except Exception:
        return traceback.format_exc()[-6000:]


def markdown(record: dict[str, Any]) -> str:
    lines = [f"## {record['model']}, {record['atoms']} atoms, {record['backend']}", ""]
    lines.append(f"ms/step (graph replays): {record['ms_per_step']:.3f}")
    if record.get("regrowths_while_profiled"):
        lines.append(
            f"**Not a replay profile:** {record['regrowths_while_profiled']} regrowth(s) while "
            "profiled; the kernel table includes the eager block and capture that followed."
        )
    lines += ["", "| family | ms/step | launches/step |", "|---|---:|---:|"]
    families: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for row in record["kernels"]:
        families[row["family"]][0] += row["ms_per_step"]
        families[row["family"]][1] += row["calls_per_step"]
    for name, (ms, calls) in sorted(families.items(), key=lambda item: -item[1][0]):
        lines.append(f"| {name} | {ms:.3f} | {calls:.1f} |")
    total = sum(row["ms_per_step"] for row in record["kernels"])
    launches = sum(row["calls_per_step"] for row in record["kernels"])
    lines.append(f"| **total kernel time** | **{total:.3f}** | {launches:.0f} |")
    lines += ["", "| kernel | family | calls/step | ms/step |", "|---|---|---:|---:|"]
    for row in record["kernels"][:30]:
        name = row["kernel"][:90].replace("|", "/")
        lines.append(
            f"| `{name}` | {row['family']} | {row['calls_per_step']:.2f} | "
            f"{row['ms_per_step']:.3f} |"
        )
    lines += ["", "| component (captured alone) | ms |", "|---|---:|"]
    for name, value in record.get("components", {}).items():
        shown = f"{value:.3f}" if isinstance(value, float) else value
        lines.append(f"| {name} | {shown} |")
    if "tf32" in record:
        lines += ["", f"potential, float32 vs TF32 GEMMs (ms): {record['tf32']}"]
    lines += ["", "```", record.get("operators", ""), "```", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="mp0-medium")
    parser.add_argument("--backend", default="cueq")
    parser.add_argument("--atoms", default="216,13824")
    parser.add_argument("--block-steps", type=int, default=20)
    parser.add_argument("--timed-blocks", type=int, default=10)
    parser.add_argument("--no-operators", action="store_true", help="skip the eager op table")
    parser.add_argument("--tf32", action="store_true", help="also time the potential in TF32")
    parser.add_argument("--compile-probe", action="store_true", help="try torch.compile")
    parser.add_argument("--dispersion", action="store_true", help="add D3(BJ) (PBE)")
    parser.add_argument("--compile", action="store_true", help="the model through torch.compile")
    parser.add_argument("--out", default="benchmarks/results/profile")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records: list[dict[str, Any]] = [{"torch": torch.__version__}]
    text = [f"# FastMACE step profile ({torch.cuda.get_device_name()}, torch {torch.__version__})"]
    for atoms in (int(a) for a in args.atoms.split(",")):
        simulation = simulation_for(
            args.model, atoms, args.backend, args.block_steps, args.dispersion, args.compile
        )
        simulation.engine.run_block()  # eager warm-up
        simulation.engine.run_block()  # capture
        record: dict[str, Any] = {
            "model": args.model, "atoms": atoms, "backend": args.backend,
            "dispersion": "d3bj" if args.dispersion else None, "compiled": args.compile,
        }  # fmt: skip
        record["ms_per_step"] = replay_ms(simulation, args.timed_blocks)
        print(f"{atoms} atoms: {record['ms_per_step']:.3f} ms/step", flush=True)
        regrowths = simulation.engine.regrowths
        record["kernels"] = kernel_table(simulation, 2)
        # A regrowth inside the profiled blocks adds an eager block and a capture (with
        # cuEquivariance's kernel tuning) to the table: then it is not a replay profile.
        record["regrowths_while_profiled"] = simulation.engine.regrowths - regrowths
        record["components"] = component_split(simulation)
        if args.tf32:
            record["tf32"] = tf32_potential_ms(simulation)
        if args.compile_probe and atoms <= 2000:  # once, on the small cell
            record["compile"] = compile_probe(simulation)
            print(record["compile"], flush=True)
        if not args.no_operators:
            record["operators"] = eager_operators(simulation)
        records.append(record)
        record["search_every"] = simulation.engine.force_field.search_every
        text.append(markdown(record))
        print(text[-1], flush=True)
        (out / "profile_step.json").write_text(json.dumps(records, indent=1, default=str))
        (out / "profile_step.md").write_text("\n\n".join(text))
        del simulation
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
