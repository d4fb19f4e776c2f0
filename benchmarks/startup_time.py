"""Time from ``fastmace md`` start to the first step, phase by phase, on a GPU machine.

Runs the real command line twice on the same structure (rattled rock-salt NaCl, MP-0-medium
template, float32, cuEq, a few steps, no trajectory): the first run fills the cache, the
second is the warm start the performance issue targets (``--profile-warm``: a third run, warm
again, under cProfile and ``-X importtime``, so that the first two keep their own timing;
``--frames-warm``: one more that prints each frame Dynamo compiled, with its times and guards;
``--lists-warm``: that again with cuEquivariance's path tables left as lists;
``--precompile-warm``: three more with and without Dynamo's own cache, precompile_probe.py). The
phases come from each run's metadata.json ``timings`` (docs/output.md: load, gate, setup, first
block, capture, and the time from the process's start to the end of the first block), so they are
what every user's run records. ``--profile`` also runs each child under ``cProfile`` (which
slows Python code) and keeps its largest cumulative times.

    python benchmarks/startup_time.py --atoms 13824 --out $OUT/startup
"""

from __future__ import annotations

import argparse
import json
import pstats
import re
import subprocess
import sys
import time
from pathlib import Path

import ase.build
import ase.io

# metadata.json's start-up timings, in the order the phases happen.
PHASES = (
    "load_s",
    "load_read_s",
    "load_convert_s",
    "load_check_s",
    "load_reused_s",
    "gate_s",
    "setup_s",
    "setup_potential_s",
    "setup_neighbours_s",
    "setup_first_forces_s",
    "first_block_s",
    "capture_s",
    "to_first_step_s",
    "process_to_first_step_s",
    "to_steady_s",
    "steps_per_s",
)


def nacl(atoms: int) -> ase.Atoms:
    repeat = round((atoms / 8) ** (1 / 3))
    if 8 * repeat**3 != atoms:
        raise SystemExit(f"--atoms must be 8 n^3 (rock-salt cubic cells), not {atoms}")
    structure = ase.build.bulk("NaCl", "rocksalt", a=5.64, cubic=True).repeat(repeat)
    structure.rattle(0.05, seed=1)
    return structure


def phase_times(run_directory: Path) -> dict[str, float]:
    """The run's start-up timings from its metadata.json; empty when it wrote none."""
    try:
        timings = json.loads((run_directory / "metadata.json").read_text())["timings"]
    except (OSError, ValueError, KeyError):
        return {}
    return {name: round(timings[name], 3) for name in PHASES if name in timings}


# The files whose functions a profile's summary keeps: FastMACE, mace, the kernel libraries,
# torch.compile and torch's extension loader.
PROFILED_FILES = (
    "fastmace", "mace", "cuequivariance", "openequivariance", "e3nn", "_inductor", "_dynamo",
    "_functorch", "triton", "cpp_extension",
)  # fmt: skip


def largest_imports(log: str, count: int = 40) -> list[str]:
    """The ``count`` slowest imports (cumulative) in ``python -X importtime``'s output."""
    rows = []
    for line in log.splitlines():
        fields = line.removeprefix("import time:").split("|")
        if line.startswith("import time:") and len(fields) == 3 and fields[1].strip().isdigit():
            rows.append((int(fields[1]), f"{int(fields[1]) / 1e6:8.2f} s  {fields[2].rstrip()}"))
    return [text for _, text in sorted(rows, reverse=True)[:count]]


def top_functions(profile: Path, count: int = 60) -> list[str]:
    """The ``count`` largest cumulative times of FastMACE, mace and torch.compile functions."""
    stats = pstats.Stats(str(profile))
    rows = []
    for (filename, line, function), row in stats.stats.items():  # type: ignore[attr-defined]
        if any(key in filename for key in PROFILED_FILES):
            rows.append((row[3], f"{row[3]:8.2f} s  {function}  {filename}:{line}"))
    return [text for _, text in sorted(rows, reverse=True)[:count]]


# `fastmace md` with compiled potentials on CUDA made ahead of time (not yet FastMACE's rule).
AOT_ON_CUDA = (
    "import sys; import fastmace.dynamics.potential as potential; "
    "potential.AHEAD_OF_TIME_DEVICES = ('cpu', 'cuda'); "
    "from fastmace.cli.main import main; sys.exit(main())"
)
# ``--frames-warm``: the command line with, at exit, one line per frame Dynamo compiled (where
# a warm start's tracing and cache loads go, frame by frame; torch's own compilation metrics).
FRAMES_REPORT = (
    "import atexit, sys\n"
    "def report():\n"
    "    from torch._dynamo.utils import get_compilation_metrics\n"
    "    for m in get_compilation_metrics():\n"
    "        us = lambda value: (value or 0) / 1e6\n"
    "        print(f'frame: {m.entire_frame_compile_time_s or 0:7.2f} s whole, '\n"
    "              f'dynamo {us(m.dynamo_cumulative_compile_time_us):6.2f}, '\n"
    "              f'aot {us(m.aot_autograd_cumulative_compile_time_us):6.2f}, '\n"
    "              f'inductor {us(m.inductor_cumulative_compile_time_us):6.2f}, '\n"
    "              f'ops {m.graph_op_count}, guards {m.guard_count}, '\n"
    "              f'fx hits {m.inductor_fx_local_cache_hit_count}, '\n"
    "              f'aot hits {m.aotautograd_local_cache_hit_count} '\n"
    "              f'{m.co_name} {m.co_filename}:{m.co_firstlineno} '\n"
    '              f\'{m.fail_reason or ""} {m.restart_reasons or ""}\', flush=True)\n'
    "atexit.register(report)\n"
)
RUN_MAIN = "from fastmace.cli.main import main; sys.exit(main())"
# ``--lists-warm``: the same, with cuEquivariance's path tables left as the lists it makes
# (models/cueq_constants.py switched off): what the tuples save, on the same machine.
LISTS_PROBE = (
    "import fastmace.models.load as load\nload.path_tables_as_constants = lambda model: 0\n"
)


# ``--precompile-warm``: three more warm runs on the probe's compiled path (benchmarks/
# precompile_probe.py): the first saves what Dynamo makes, the second loads it, the third
# traces as usual (the same path without Dynamo's cache, for comparison).
PRECOMPILE_RUNS = ("warm-precompile-save", "warm-precompile", "warm-precompile-off")


def precompile_probe(cache: bool) -> str:
    """The code that installs the probe in a child, with or without Dynamo's cache."""
    return (
        f"sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\n"
        f"import precompile_probe\nprecompile_probe.install(cache={cache})\n"
    )


def output_of(expired: subprocess.TimeoutExpired) -> str:
    """What a run stopped by the time limit had printed (bytes there, whatever ``text`` says)."""
    parts = (expired.stdout, expired.stderr)
    return "".join(p.decode(errors="replace") if isinstance(p, bytes) else p or "" for p in parts)


# The line `fastmace md` prints after its first block (fastmace.io.progress.startup_line).
FIRST_STEP_LINE = re.compile(r"^start-up ([0-9.]+) s to the first step", re.M)


def first_step_from_log(log: str) -> float | None:
    """Seconds from the process's start to the first step, as the run printed them: for a
    run stopped by ``--timeout-s`` after its first step, whose metadata.json was not final."""
    found = FIRST_STEP_LINE.search(log)
    return float(found.group(1)) if found else None


def startup_cases(summary: dict) -> list[dict]:
    """Each run as a ``cases`` entry (the md_speed shape, with ``to_first_step_s`` from the
    process's start and ``cache``): variant "default" when no option was forced, else the
    options forced ("compile" for --compile)."""
    forced = [option.lstrip("-") for option in summary["extra"] if option.startswith("--")]
    if summary.get("ahead_of_time_on_cuda"):
        forced.append("aot")
    cases = []
    for index, run in enumerate(summary["runs"]):
        if run["run"] == "warm-profiled":  # slowed by its profilers: not a start-up figure
            continue
        phases = run["phases_s"]
        rate = phases.get("steps_per_s")
        # A probe, not the default path.
        probe = ["lists"] if run["run"] == "warm-lists" else []
        if run["run"] in PRECOMPILE_RUNS:  # precompile-save, precompile, precompile-off
            probe = [run["run"].removeprefix("warm-")]
        case = {
            "model": "mp0-medium",
            "atoms": summary["atoms"],
            "path": "fastmace-md",
            "variant": "-".join(forced + probe) or "default",
            "status": "ok" if run["exit"] == 0 and phases else "failed",
            "ms_per_step": round(1000 / rate, 3) if rate else None,
            "to_first_step_s": phases.get("process_to_first_step_s"),
            "cache": "cold" if index == 0 else "warm",  # the first run fills the cache root
            "peak_gib": None,
        }
        # Stopped by the time limit after its first step: its start-up was measured in full.
        if run["exit"] is None and run.get("first_step_s") is not None:
            case.update(status="ok", to_first_step_s=run["first_step_s"],
                        note="stopped by --timeout-s after its first step")  # fmt: skip
        cases.append(case)
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--atoms", type=int, default=13824)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--profile", action="store_true", help="run each child under cProfile")
    parser.add_argument(
        "--importtime", action="store_true", help="keep each child's slowest imports"
    )
    parser.add_argument(
        "--profile-warm",
        action="store_true",
        help="a third run, warm, under cProfile and -X importtime (where a warm start goes)",
    )
    parser.add_argument(
        "--frames-warm",
        action="store_true",
        help="one more warm run that prints each frame Dynamo compiled, with its times",
    )
    parser.add_argument(
        "--lists-warm",
        action="store_true",
        help="one more such run with cuEquivariance's path tables left as lists",
    )
    parser.add_argument(
        "--precompile-warm",
        action="store_true",
        help="three more warm runs: Dynamo's cache saved, loaded, and off (precompile_probe.py)",
    )
    parser.add_argument(
        "--precompile-only",
        action="store_true",
        help="only --precompile-warm's runs (the first on an empty cache root)",
    )
    parser.add_argument("--timeout-s", type=float, default=240.0, help="per run")
    parser.add_argument("--extra", nargs="*", default=[], help="more fastmace md options")
    parser.add_argument(
        "--ahead-of-time-on-cuda",
        action="store_true",
        help="a compiled potential on CUDA as a package compiled ahead of time (variant 'aot')",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    structure = args.out / f"nacl-{args.atoms}.extxyz"
    ase.io.write(structure, nacl(args.atoms))
    runs = []
    names = ["cold", "warm"] + ["warm-profiled"] * args.profile_warm
    names += ["warm-frames"] * args.frames_warm + ["warm-lists"] * args.lists_warm
    names += list(PRECOMPILE_RUNS) * args.precompile_warm
    if args.precompile_only:
        names = list(PRECOMPILE_RUNS)
    for name in names:
        profile = args.out / f"{name}.prof"
        profiled = args.profile or name == "warm-profiled"
        profiler = ["-m", "cProfile", "-o", str(profile)] if profiled else []
        if args.importtime or name == "warm-profiled":
            profiler = ["-X", "importtime", *profiler]
        run_directory = args.out / f"run-{name}"
        launcher = ["-m", "fastmace", "md"]
        if args.ahead_of_time_on_cuda:
            launcher = ["-c", AOT_ON_CUDA, "md"]
        elif name == "warm-frames":
            launcher = ["-c", FRAMES_REPORT + RUN_MAIN, "md"]
        elif name == "warm-lists":
            launcher = ["-c", FRAMES_REPORT + LISTS_PROBE + RUN_MAIN, "md"]
        elif name in PRECOMPILE_RUNS:
            probe = precompile_probe(cache=name != "warm-precompile-off")
            launcher = ["-c", FRAMES_REPORT + probe + RUN_MAIN, "md"]
        command = [
            sys.executable, *profiler, *launcher,
            str(structure), "--model", "template:mp0-medium", "--dtype", "float32",
            "--backend", "cueq", "--steps", str(args.steps), "--traj-every", "0",
            "--temperature", "300", "--output", str(run_directory), *args.extra,
        ]  # fmt: skip
        start = time.perf_counter()
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout_s)
            exit_code, log = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as expired:
            exit_code, log = None, f"timed out after {args.timeout_s} s\n{output_of(expired)}"
        wall = time.perf_counter() - start
        if args.importtime or name == "warm-profiled":
            imports = largest_imports(log)
            (args.out / f"{name}-imports.txt").write_text("\n".join(imports) + "\n")
            log = "\n".join(
                line for line in log.splitlines() if not line.startswith("import time:")
            )
        (args.out / f"{name}.log").write_text(log)
        record = {
            "run": name,
            "exit": exit_code,
            "wall_s": round(wall, 2),
            "phases_s": phase_times(run_directory),
            "first_step_s": first_step_from_log(log),
        }
        if profile.exists():
            (args.out / f"{name}-top.txt").write_text("\n".join(top_functions(profile)) + "\n")
        runs.append(record)
        print(json.dumps(record, indent=1), flush=True)
    summary = {"atoms": args.atoms, "steps": args.steps, "extra": args.extra, "runs": runs,
               "ahead_of_time_on_cuda": args.ahead_of_time_on_cuda}  # fmt: skip
    summary["cases"] = startup_cases(summary)
    (args.out / "startup_time.json").write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
