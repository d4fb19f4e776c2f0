"""What a run records: ``metadata.json`` (what ran, with which software, on what, how fast)
and the one-screen report.

Every run with an output directory writes it when the run starts (``status: running``), and
again when it ends (``finished`` or ``failed``, with the error). The layout is described by
``schemas/metadata.schema.json`` (shipped in the package); tests validate real runs against it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from importlib import metadata
from importlib import util as importlib_util
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ase
import numpy as np
import torch

import fastmace
from fastmace.dynamics.fusion import fusion_failures
from fastmace.dynamics.integrators.units import KB_EV_PER_K
from fastmace.io.plot import INSTALL_HINT, can_plot
from fastmace.oeq import host_extension
from fastmace.runtime import environment
from fastmace.runtime.driver import nvidia_driver_version
from fastmace.structures import chemical_formula

if TYPE_CHECKING:
    from fastmace.dynamics.potential import Potential
    from fastmace.models.load import LoadedModel
    from fastmace.planner import EngineSettings, Plan
    from fastmace.runs import MDResult, RunRecord, RunSettings

SCHEMA_VERSION = 1
SCHEMA = Path(__file__).with_name("schemas") / "metadata.schema.json"
# Distributions whose versions decide what ran.
DISTRIBUTIONS = (
    "torch", "mace-torch", "e3nn", "cuequivariance", "cuequivariance-torch",
    "cuequivariance-ops-torch-cu13", "cuequivariance-ops-cu13", "openequivariance",
    "fastmace-oeq-ext", "ase", "numpy", "h5py",
)  # fmt: skip

# The report's final lines name at most this many systems (the rest: thermo.csv).
MAX_SYSTEMS_REPORTED = 8


# The import names of those that can run from a source tree without package metadata (as
# OpenEquivariance does on the GPU machine): such a module is recorded as there, version unknown.
_MODULES = {
    "mace-torch": "mace", "e3nn": "e3nn", "cuequivariance": "cuequivariance",
    "cuequivariance-torch": "cuequivariance_torch", "openequivariance": "openequivariance",
}  # fmt: skip


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        pass
    module = _MODULES.get(distribution)
    spec = importlib_util.find_spec(module) if module else None  # finds; imports nothing
    if spec is None or spec.origin is None:
        return None
    return f"unknown (no package metadata; {Path(spec.origin).parent})"


def checkout_state() -> dict[str, Any]:
    """The git commit of the FastMACE checkout this package runs from, if it is one."""
    package = Path(fastmace.__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(package), "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
        if commit.returncode != 0:
            return {"kind": "installed"}
        status = subprocess.run(
            ["git", "-C", str(package), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return {"kind": "installed"}
    return {
        "kind": "checkout",
        "commit": commit.stdout.strip(),
        "modified": bool(status.stdout.strip()),
    }


def software() -> dict[str, Any]:
    versions = {name: _version(name) for name in DISTRIBUTIONS}
    record = host_extension.record()
    return {
        "fastmace": {"version": fastmace.__version__, **checkout_state()},
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "packages": versions,
        "oeq_extension": record.as_dict() if record is not None else None,
        "oeq_runtime": (
            f"stand-in CUDA home {record.cuda_home}; cpp_extension.load answered for "
            f"libtorch_tp_jit during mace's import; {record.summary()}"
            if record is not None
            else None
        ),
    }


def device_record(device: str) -> dict[str, Any]:
    record: dict[str, Any] = {"device": device, "driver": nvidia_driver_version()}
    if device.startswith("cuda") and torch.cuda.is_available():
        index = torch.device(device).index or 0
        properties = torch.cuda.get_device_properties(index)
        record.update(
            name=properties.name,
            capability=f"{properties.major}.{properties.minor}",
            memory_GiB=round(properties.total_memory / 2**30, 1),
        )
    return record


def model_record(model: LoadedModel, backend_reason: str) -> dict[str, Any]:
    """``metadata.json``'s ``model``; ``backend_reason`` is :func:`backend_reason`'s."""
    return {
        "name": model.name,
        "label": model.checkpoint.id if model.checkpoint else None,
        "file": str(model.file.path) if model.file else None,
        "sha256": model.file.sha256 if model.file else None,
        "head": model.head,
        "head_functional": model.head_functional,
        "dtype": model.dtype,
        "backend": model.backend,
        "backend_reason": backend_reason,
        "licence": model.licence,
        "content_hash": model.description.content_hash,
        "r_max": model.description.r_max,
        "conversion_check": (
            dataclasses.asdict(model.conversion_check) if model.conversion_check else None
        ),
    }


def structure_hash(atoms: ase.Atoms) -> str:
    """SHA-256 over species, positions, cell and periodicity (float64, little-endian)."""
    digest = hashlib.sha256()
    digest.update(np.ascontiguousarray(atoms.get_atomic_numbers(), dtype="<i8").tobytes())
    digest.update(np.ascontiguousarray(atoms.get_positions(), dtype="<f8").tobytes())
    digest.update(np.ascontiguousarray(np.asarray(atoms.get_cell()), dtype="<f8").tobytes())
    digest.update(np.ascontiguousarray(atoms.get_pbc(), dtype="u1").tobytes())
    return digest.hexdigest()


def structures_record(
    structures: Sequence[ase.Atoms],
    charges: Sequence[float] | None = None,
    spins: Sequence[float] | None = None,
) -> list[dict[str, Any]]:
    """Each system: formula, size, cell, hash, and the total charge and spin multiplicity a
    long-range model ran it with (None for a local model)."""
    return [
        {
            "formula": chemical_formula(atoms),
            "atoms": len(atoms),
            "cell": np.asarray(atoms.get_cell()).tolist(),
            "pbc": [bool(p) for p in atoms.get_pbc()],
            "sha256": structure_hash(atoms),
            "charge": None if charges is None else charges[index],
            "spin": None if spins is None else spins[index],
        }
        for index, atoms in enumerate(structures)
    ]


def settings_record(settings: RunSettings, engine: EngineSettings) -> dict[str, Any]:
    """What was asked for; the block length, skin and graphs are the engine settings'."""
    return {
        "ensemble": settings.ensemble.name,
        "ensemble_settings": dict(settings.ensemble.settings),
        "steps": settings.steps,
        "timestep_fs": settings.timestep_fs,
        "seed": settings.seed,
        "initial_temperature_K": settings.initial_temperature_K,
        "schedule": dataclasses.asdict(settings.schedule),
        "block_steps": engine.block_steps,
        "skin_A": engine.skin_A,
        "capture": engine.graphs,
        "trajectory_format": settings.trajectory_format,
        "temperature_schedule": (
            None
            if settings.temperature_schedule is None
            else settings.temperature_schedule.to_dict()
        ),
        "pressure_schedule": (
            None if settings.pressure_schedule is None else settings.pressure_schedule.to_dict()
        ),
        "dispersion": settings.dispersion,
        "dispersion_functional": settings.dispersion_functional,
        "charge": list(settings.charge) or None,  # as given; per system: "structures"
        "spin": list(settings.spin) or None,
    }


def environment_record() -> dict[str, Any]:
    """The variables FastMACE reads (their values now) and what it set in this process."""
    return {
        "read": {variable.name: os.environ.get(variable.name) for variable in environment.READ},
        "changes": [dataclasses.asdict(change) for change in environment.changes()],
    }


def run_metadata(
    *,
    model: LoadedModel,
    structures: Sequence[ase.Atoms],
    settings: RunSettings,
    engine_settings: EngineSettings,
    engine: dict[str, Any],
    status: str,
    timings: dict[str, float],
    error: str | None = None,
    gate: dict[str, Any] | None = None,
    fallbacks: Sequence[dict[str, Any]] = (),
    plan: dict[str, Any] | None = None,
    backend_reason: str,
    runner: dict[str, Any] | None = None,
    charges: Sequence[float] | None = None,
    spins: Sequence[float] | None = None,
) -> dict[str, Any]:
    """The whole ``metadata.json`` document.

    ``backend_reason``: why the model runs on its backend, as the report says it
    (:func:`backend_reason`).

    ``runner``: whether the run ran in a child process, and the names of the extra variables
    its child processes got (:func:`fastmace.runner.runner_record`); default: in process.

    ``charges`` and ``spins``: each system's, for a long-range model (None: a local model).
    """
    return {
        "schema_version": SCHEMA_VERSION,
        "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "status": status,
        "error": error,
        "software": software(),
        "device": device_record(model.device),
        "model": model_record(model, backend_reason),
        "structures": structures_record(structures, charges, spins),
        "settings": settings_record(settings, engine_settings),
        "engine": engine,
        "plan": plan,
        "gate": gate,
        "fallbacks": list(fallbacks),
        "runner": runner or {"subprocess": False, "environment": []},
        "runtime_info": dataclasses.asdict(fastmace.runtime_info()),
        "environment": environment_record(),
        "seed": settings.seed,
        "timings": timings,
    }


def edge_chunking_record(potential: Any) -> dict[str, Any] | None:
    """How many edges an evaluation took at once, why, and how many evaluations needed
    chunks (dynamics/edge_chunks.py); None when every evaluation took all its edges."""
    chosen = potential.edge_chunking
    if chosen is None:
        return None
    return {"rows": chosen.rows, "reason": chosen.reason, "chunked_calls": potential.chunked_calls}


def engine_record(run: RunRecord) -> dict[str, Any]:
    """``metadata.json``'s ``engine``: what the engine, the list and the model actually used."""
    engine = run.engine
    neighbours = engine.force_field.neighbours
    return {
        "device": str(engine.md.state.device),
        "block_steps": run.block_steps,
        "capture": engine.capture,
        "compile": run.potential.compiled,
        "compile_failure": run.potential.compile_failure,
        "compiled_potentials": [dataclasses.asdict(report) for report in run.potential.aot_reports],
        "radial_table": (
            dataclasses.asdict(report) if (report := run.potential.table_report) else None
        ),
        "radial_table_failure": run.potential.table_failure,
        "product_basis": run.potential.product_basis_used,
        "product_basis_failure": run.potential.product_basis_failure,
        "fused_convolution": run.potential.fused_convolution_used,
        "fused_convolution_failure": run.potential.fused_convolution_failure,
        "own_kernels_check": run.potential.own_kernels_check,
        "matmul_precision": run.potential.matmul_precision,
        "bf16_layers": list(run.potential.bf16_layers),
        "stacked_layers": list(run.potential.stacked_layers),
        "stacked_refused": dict(run.potential.stacked_refused),
        "edge_chunking": edge_chunking_record(run.potential),
        "skin_A": neighbours.skin,
        "headroom": neighbours.headroom,
        "edge_capacity": neighbours.capacity,
        "model_edge_capacity": neighbours.cutoff_capacity,
        "neighbour_method": neighbours.method,
        "regrowths": engine.regrowths,
        "search_every": engine.force_field.search_every,
        "search_halvings": engine.search_halvings,
        "capture_failure": engine.capture_failure,
        "fused_step": engine.fuse,
        "fused_step_failures": fusion_failures() if engine.fuse else {},
        "dispersion": (
            engine.force_field.dispersion.record()
            if engine.force_field.dispersion is not None
            else None
        ),
        "guard": (
            run.guard.record() if run.guard is not None else run.engine_settings.guard.to_dict()
        ),
        "exchange": (run.exchange.record(1.0 / KB_EV_PER_K) if run.exchange is not None else None),
    }


def simulation_metadata(run: RunRecord, status: str, error: str | None = None) -> dict[str, Any]:
    """The ``metadata.json`` document of the run ``run`` records, as it stands (``status``)."""
    timings = {k: v for k, v in run.timings.items() if math.isfinite(v)}
    gate, plan = run.gate, run.plan
    document = run_metadata(
        model=run.model, structures=run.structures, settings=run.settings,
        engine_settings=run.engine_settings, engine=engine_record(run),
        status=status, timings=timings, error=error,
        gate=gate.to_dict() if gate is not None else None,
        plan=plan.to_dict() if plan is not None else None,
        fallbacks=run.fallbacks, runner=run.runner,
        backend_reason=backend_reason(run), charges=run.charges,
        spins=run.spins,
    )  # fmt: skip
    started = run.thermal_start
    document["settings"]["thermal_start"] = None if started is None else started.to_dict()
    return document


# -- the report ------------------------------------------------------------------------------


def planned_backend_reason(model: LoadedModel, plan: Plan | None) -> str:
    """Why ``model``'s backend: the plan's reason when the run was planned for that backend,
    else what loading the model said (MD runs and relaxations alike)."""
    if plan is not None and model.backend == plan.backend:
        return plan.decision("backend").reason
    return model.backend_reason


def backend_reason(run: RunRecord) -> str:
    """Why this backend, for ``metadata.json``, the report and so the plan alike: the plan's
    reason when the run was planned (a fallback's when the gate replaced it), else what
    loading the model said."""
    reason = planned_backend_reason(run.model, run.plan)
    if run.fallbacks:
        reason += f" (after {len(run.fallbacks)} failed: see the gate)"
    return reason


def _dispersion_summary(term: Any) -> str:
    """The report's line on the dispersion term (a DispersionTerm or None)."""
    if term is None:
        return "none"
    record = term.record()
    return (
        f"D3(BJ), {record['functional']} parameters, cutoff {record['cutoff_A']:.2f} Å "
        f"(CN {record['cn_cutoff_A']:.2f} Å), "
        f"{'two- and three-body' if record['three_body'] else 'two-body'}, "
        f"edge capacity {record['edge_capacity']}, "
        f"kernel {record['kernel']}"
    )


# The start-up phases in the order they happen, as metadata.json's timings names them.
STARTUP_PHASES = (
    ("check_s", "request check"),
    ("plan_s", "plan"),
    ("load_s", "load"),
    ("gate_s", "gate"),
    ("setup_s", "setup"),
    ("first_outputs_s", "step 0's outputs"),
    ("first_block_s", "first block"),
    ("capture_s", "capture"),
)


# The parts of a phase, timed inside it: (phase, ((timing, label), ...)).
STARTUP_PHASE_PARTS = {
    "load_s": (
        ("load_read_s", "read"),
        ("load_convert_s", "convert"),
        ("load_check_s", "check"),
        ("load_reused_s", "conversion kept from an earlier run"),
    ),
    "setup_s": (
        ("setup_potential_s", "potential"),
        ("setup_neighbours_s", "neighbours"),
        ("setup_first_forces_s", "first forces"),
    ),
}


def _phase_summary(timings: dict[str, float], name: str, label: str) -> str:
    """``label`` and its seconds, with its timed parts in brackets."""
    parts = ", ".join(
        f"{part_label} {timings[part]:.1f}"
        for part, part_label in STARTUP_PHASE_PARTS.get(name, ())
        if part in timings
    )
    return f"{label} {timings[name]:.1f} s" + (f" ({parts})" if parts else "")


def startup_summary(timings: dict[str, float]) -> str:
    """Each start-up phase's seconds, then the time to the first step (docs/output.md)."""
    text = ", ".join(
        _phase_summary(timings, name, label) for name, label in STARTUP_PHASES if name in timings
    )
    if "to_first_step_s" in timings:
        text += f"; first step done {timings['to_first_step_s']:.1f} s after the request"
        if "process_to_first_step_s" in timings:
            text += f", {timings['process_to_first_step_s']:.1f} s after the process started"
    return text


def _output_summary(run: RunRecord, result: MDResult) -> str:
    """The run directory, and its plot or how to get one."""
    if result.output is None:
        return "none (no directory)"
    where = Path(result.output).absolute()  # the default directory name is relative
    if run.plot is not None:
        return f"{where} (plot: {run.plot.name})"
    if run.has_output and not can_plot():
        return f"{where} (no plot: matplotlib is not installed; {INSTALL_HINT})"
    return str(where)


def run_report(run: RunRecord, result: MDResult) -> str:
    """One screen: model, structure, run, engine, gate, speed, final state, output."""
    model, settings, engine = run.model, run.settings, run.engine
    neighbours = engine.force_field.neighbours
    formulas = ", ".join(f"{chemical_formula(a)} ({len(a)} atoms)" for a in run.structures[:4])
    if len(run.structures) > 4:
        formulas += f" and {len(run.structures) - 4} more"
    graphs = "CUDA graphs" if engine.capture else "no CUDA graphs"
    if engine.capture_failure:
        graphs += f" ({engine.capture_failure})"
    if run.potential.compiled:
        graphs += f", {compiled_text(run.potential)}"
    elif run.potential.compile_failure:
        graphs += f", model uncompiled (compilation failed: {run.potential.compile_failure})"
    if (table := run.potential.table_report) is not None:
        pairs = f", one per pair of elements ({table.element_pairs})" if table.element_pairs else ""
        graphs += (
            f", radial weights from tables ({table.intervals} intervals{pairs}, error "
            f"{table.max_relative_error:.0e} of the weights)"
        )
    elif run.potential.table_failure:
        graphs += f", radial MLPs (tables not built: {run.potential.table_failure})"
    if run.potential.product_basis_used:
        graphs += ", FastMACE's own product basis"
    elif run.potential.product_basis_failure:
        failure = run.potential.product_basis_failure
        graphs += f", cuEquivariance's product basis (the own one failed: {failure})"
    if run.potential.fused_convolution_used:
        graphs += ", FastMACE's own convolution"
    elif run.potential.fused_convolution_failure:
        failure = run.potential.fused_convolution_failure
        graphs += f", cuEquivariance's convolution (the own one failed: {failure})"
    if run.potential.own_kernels_check and run.potential.own_kernels:
        graphs += f" ({run.potential.own_kernels_check})"
    if run.potential.bf16_layers:
        graphs += f", {len(run.potential.bf16_layers)} linear layers in BF16"
    if run.potential.stacked_layers:
        graphs += f", {len(run.potential.stacked_layers)} linear layers as batched GEMMs"
    if run.potential.stacked_refused:
        graphs += f" ({len(run.potential.stacked_refused)} kept: their stacked maps failed "
        graphs += "the check, see metadata.json)"
    if run.potential.chunked_calls:
        rows = run.potential.edge_chunk_rows
        graphs += f", edges worked through in chunks of {rows} rows (uncompiled)"
    launch = f"{run.block_steps} steps per launch"
    planned = run.engine_settings.block_steps
    if planned != run.block_steps:
        launch += f" (the plan's K = {planned}, shortened to divide every output interval)"
    gate = run.gate.summary() if run.gate is not None else "not run (fm.md check='gate')"
    lines = [
        "FastMACE run report",
        f"model:     {model.summary()}",
        f"backend:   {model.backend}: {backend_reason(run)}",
        f"structure: {formulas}",
        f"run:       {settings.ensemble.describe()}, {result.steps} steps of "
        f"{settings.timestep_fs} fs, seed {settings.seed}"
        + "".join(f"; {schedule.describe()}" for schedule in settings.schedules()),
        f"engine:    {launch}, {graphs}, edge capacity "
        f"{neighbours.capacity} ({neighbours.method}; model edges "
        f"{neighbours.cutoff_capacity}), list regrown {engine.regrowths}x",
        f"gate:      {gate}",
        f"dispersion: {_dispersion_summary(engine.force_field.dispersion)}",
    ]
    started = run.thermal_start
    if started is not None and (start := started.describe()) is not None:
        lines.append(f"start:     {start}")
    if run.charges is not None and run.spins is not None:
        from fastmace.charges import describe

        lines.append(f"charge:    {describe(run.charges, run.spins)}")
    if run.runner["subprocess"]:
        extra = ", ".join(run.runner["environment"]) or "none"
        lines.append(f"runner:    a child process (extra variables: {extra})")
    if run.plan is not None:
        lines.extend(run.plan.describe().splitlines())
    for failure in run.fallbacks:
        lines.append(f"fallback:  {failure['backend']} was not used: {failure['reason']}")
    speed = result.timings.get("steps_per_s", float("nan"))
    lines.append(
        f"speed:     {speed:.1f} steps/s, {result.timings.get('ns_per_day', float('nan')):.3f}"
        " ns/day (steady blocks; warm-up and capture count as start-up)"
    )
    lines.append(f"start-up:  {startup_summary(result.timings)}")
    exchange = run.exchange
    if exchange is not None:
        tried = exchange.attempts.tolist()
        made = exchange.accepted.tolist()
        rates = ", ".join(f"{m / t:.2f}" if t else "-" for m, t in zip(made, tried, strict=True))
        lines.append(
            f"exchange:  every {run.settings.exchange_every} steps; acceptance per "
            f"neighbouring pair {rates} ({sum(tried)} tried)"
        )
    many = len(result.thermo) > 1
    means = result.mean_temperature_K
    for index, last in enumerate(result.thermo[:MAX_SYSTEMS_REPORTED]):
        state = f"T = {last.get('temperature_K', float('nan')):.1f} K"
        if index < len(means):  # what the run sampled, not one instant
            state += f" (mean from step {result.mean_from_step}: {means[index]:.1f} K)"
        if last.get("pressure_GPa") is not None:
            state += f", P = {last['pressure_GPa']:.3f} GPa"
        label = f"final {index}:" if many else "final:"
        lines.append(f"{label:<11}{state}, E_pot = {last.get('potential_energy_eV'):.4f} eV")
    if len(result.thermo) > MAX_SYSTEMS_REPORTED:
        lines.append(
            f"           ... {len(result.thermo) - MAX_SYSTEMS_REPORTED} more systems in thermo.csv"
        )
    note = cool_start_note(run.settings, result.thermo)
    if note is not None:
        lines.append(f"note:      {note}")
    lines.append(f"output:    {_output_summary(run, result)}")
    lines.append(f"licence:   the weights are under {model.licence}")
    return "\n".join(lines) + "\n"


def compiled_text(potential: Potential) -> str:
    """How the model runs, in a few words: uncompiled, compiled (torch.compile), or compiled
    ahead of time and how that package was had (loaded from the cache root, or built)."""
    if not potential.compiled:
        return "uncompiled"
    if not potential.aot_reports:
        return "compiled"
    how = ", ".join(f"{report.how} in {report.seconds:.1f} s" for report in potential.aot_reports)
    return f"compiled ahead of time ({how})"


def kernel_words(potential: Potential) -> list[str]:
    """The start-up line's words for what replaced the model's own parts: radial tables and
    FastMACE's own convolution and product basis, where they run."""
    chosen = (
        (potential.table_report is not None, "radial tables"),
        (potential.fused_convolution_used, "own convolution"),
        (potential.product_basis_used, "own product basis"),
    )
    return [words for used, words in chosen if used]


# Below this fraction of the target at the end of a run, the report says why and what to do.
COOL_FRACTION = 0.8


def cool_start_note(settings: RunSettings, final_rows: Sequence[dict[str, Any]]) -> str | None:
    """Why a thermostatted run ended well below its target temperature, and what to do; None
    when it did not (or has no single target: a schedule, a ladder, no thermostat).

    Velocities drawn at T into a crystal at its energy minimum share their energy with the
    lattice: about half becomes potential energy, so the temperature drops to about T/2 within
    a few vibrations, and a gentle thermostat takes picoseconds to bring it back.
    """
    target = settings.ensemble.settings.get("temperature_K")
    if settings.temperature_schedule is not None or not isinstance(target, int | float):
        return None
    temperatures = [row.get("temperature_K") for row in final_rows]
    if not temperatures or any(t is None or t >= COOL_FRACTION * target for t in temperatures):
        return None
    started = settings.initial_temperature_K or target
    lowest = min(temperatures)
    return (
        f"the run ended at {lowest:.0f} K, below the {target:g} K asked: the velocities drawn at "
        f"{started:g} K shared their energy with the lattice (a structure at its energy minimum "
        "takes about half of it as potential energy), and the thermostat restores the "
        "temperature only over picoseconds. Start at about twice the target "
        f"(--initial-temperature {2 * target:g}, what FastMACE's own draw gives a structure at "
        "rest at an energy minimum), or run longer"
    )
