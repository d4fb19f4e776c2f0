"""``fm.md`` and ``fm.relax``: molecular dynamics and relaxation of a structure, in one call."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from fastmace import child_run
from fastmace.charges import PerSystemValue
from fastmace.ensemble_catalog import setting_names
from fastmace.io.progress import setup_note
from fastmace.protocol import PressureSchedule, TemperatureSchedule
from fastmace.runtime import environment
from fastmace.structures import Structure
from fastmace.vocabulary import DEFAULT_TIMESTEP_FS, GPA_PER_BAR, SETUP_PROGRESS_ATOMS

if TYPE_CHECKING:
    import ase

    from fastmace.models.load import LoadedModel
    from fastmace.planner import EngineConfig, GuardConfig, Plan, Workload
    from fastmace.relaxation import RelaxResult
    from fastmace.runner import RunnerConfig
    from fastmace.runs import MDRequest
    from fastmace.simulation import MDResult, RunSettings


def _pressure_GPa(settings: dict[str, Any]) -> float | None:
    if settings.get("pressure_GPa") is not None:
        return float(settings["pressure_GPa"])
    if settings.get("pressure_bar") is not None:
        return float(settings["pressure_bar"]) * GPA_PER_BAR
    return None


def engine_config(config: EngineConfig | None, **keywords: Any) -> EngineConfig:
    """The one EngineConfig of a run: ``config`` with fm.md's keywords that name an
    EngineConfig field forced on top; a setting forced both ways, to different values, is
    refused."""
    from fastmace.planner import EngineConfig, GuardConfig

    values = config.to_dict() if config is not None else {}
    for name, value in keywords.items():
        if value is None or (name == "backend" and value == "auto"):
            continue
        if name == "guard":  # True, False, a mapping or a GuardConfig: compared as a mapping
            value = GuardConfig.coerce(value).to_dict()
        if values.get(name) is not None and values[name] != value:
            raise ValueError(
                f"fm.md got {name}={value!r} and config=EngineConfig({name}="
                f"{values[name]!r}): force each setting once"
            )
        values[name] = value
    return EngineConfig(**values)


def _say_if_cuda_started(plan: Plan) -> None:
    """Warn when the plan's variables come too late: CUDA reads them when it starts."""
    from fastmace.runtime.environment import READ_WHEN_USED

    torch = sys.modules.get("torch")
    late = [s.name for s in plan.environment if s.name not in READ_WHEN_USED]
    if not late or torch is None or not torch.cuda.is_initialized():
        return
    names = ", ".join(late)
    warnings.warn(
        f"CUDA has already started in this process, so the plan's {names} may not take "
        "effect (CUDA and cuBLAS read them when they start); run with "
        "runner=fm.RunnerConfig(subprocess=True) to give the run a fresh process",
        stacklevel=3,
    )


def _plan(structures: list[ase.Atoms], config: EngineConfig, **workload: Any) -> Plan:
    """How fm.md and fm.relax run ``structures`` here: ``workload`` are Workload's fields."""
    from fastmace.machine import probe_availabilities
    from fastmace.planner import Workload, make_plan

    return make_plan(
        Workload.from_structures(structures, **workload), config, probe_availabilities()
    )


@contextlib.contextmanager
def _planned_environment(plan: Plan) -> Iterator[None]:
    """The plan's variables for this call only: set before CUDA starts (allocator, emulation,
    determinism, cuEquivariance's kernel choice), and the user's environment given back after."""
    with environment.restored(plan.environment_values()):
        plan.apply_environment()
        _say_if_cuda_started(plan)
        yield


def _load_planned(
    model: str | os.PathLike[str], plan: Plan, *, seed: int = 0, **trust: Any
) -> LoadedModel:
    """``model`` loaded as the plan says (backend, device, dtype); never downloads.
    ``trust`` holds fm.load's head, checkpoint, sha256 and trusted."""
    from fastmace.models.load import load

    engine = plan.engine_settings()
    return load(
        model, download=False, backend=engine.backend, device=engine.device,
        dtype=engine.dtype, seed=seed, **trust,
    )  # fmt: skip


def _load_and_plan(
    model: str | os.PathLike[str], plan: Plan, *, seed: int = 0, **trust: Any
) -> tuple[LoadedModel, Plan]:
    """``model`` loaded as the plan says, and the plan it runs by: what a checkpoint is becomes
    known only once it is loaded, so the plan is made again with the model's facts (a
    long-range model: eager, e3nn, a fixed cell; radial MLPs that tables can replace; what its
    last compilation at this size cost here), and the model loaded again where the backend or
    dtype changed. ``trust`` holds fm.load's head, checkpoint, sha256 and trusted."""
    loaded = _load_planned(model, plan, seed=seed, **trust)
    workload = _model_facts(loaded, plan)
    if workload == plan.workload:
        return loaded, plan
    from fastmace.planner import make_plan

    replanned = make_plan(workload, plan.config, plan.availabilities)
    engine, settings = plan.engine_settings(), replanned.engine_settings()
    if (engine.backend, engine.dtype) != (settings.backend, settings.dtype):
        loaded = _load_planned(model, replanned, seed=seed, **trust)
    return loaded, replanned


def _model_facts(loaded: LoadedModel, plan: Plan) -> Workload:
    """``plan``'s Workload with what the loaded model says of itself."""
    from dataclasses import replace

    from fastmace.dynamics.pair_table import pair_table_refusal
    from fastmace.dynamics.radial_table import table_refusal
    from fastmace.runtime.compile_costs import warm_cost_s
    from fastmace.simulation import compile_identity
    from fastmace.vocabulary import LONG_RANGE_MODEL_TYPES

    distance_alone = table_refusal(loaded.module) is None
    per_pair = not distance_alone and pair_table_refusal(loaded.module) is None
    return replace(
        plan.workload,
        long_range=loaded.description.model_type in LONG_RANGE_MODEL_TYPES,
        tabulable_radials=distance_alone or per_pair,
        radials_per_element_pair=per_pair,
        compile_cost_s=warm_cost_s(compile_identity(loaded, plan)),
    )


def _named_model_type(model: object) -> str | None:
    """The mace-torch class of a label or template, from the table alone (None for a path,
    a loaded model, or anything else: the request's own checks refuse what is not allowed)."""
    if not isinstance(model, str | os.PathLike):
        return None
    text = os.fspath(model)
    if text.startswith("template:"):
        from fastmace.models.templates import TEMPLATES  # imports torch: only for templates

        shape = TEMPLATES.get(text.removeprefix("template:"))
        return None if shape is None else shape.model_type
    from fastmace.models.label_table import find_checkpoint

    entry = find_checkpoint(text.partition(":")[0])
    return None if entry is None else entry.model_type


def _is_long_range(model: object) -> bool:
    """Whether a label or template names a long-range model (a path: not known yet)."""
    from fastmace.vocabulary import LONG_RANGE_MODEL_TYPES

    return _named_model_type(model) in LONG_RANGE_MODEL_TYPES


def _refuse_charge_for_local(
    model: str | os.PathLike[str], model_type: str | None, charge: Any, spin: Any
) -> None:
    """Refuse ``charge=`` or ``spin=`` for a model known to have no long-range part."""
    from fastmace.charges import refused_for_local_model
    from fastmace.vocabulary import LONG_RANGE_MODEL_TYPES

    if model_type is None or model_type in LONG_RANGE_MODEL_TYPES:
        return
    if charge is not None or spin is not None:
        raise refused_for_local_model(os.fspath(model), "charge" if charge is not None else "spin")


def _gated_structure(atoms: ase.Atoms, charge: float | None, spin: float | None) -> ase.Atoms:
    """The gate's structure with the run's first system's charge and spin in its ``info``,
    where the reference (mace-torch's own data pipeline) reads them."""
    if charge is None or spin is None:
        return atoms
    atoms = atoms.copy()
    atoms.info.update(charge=charge, spin=spin)
    return atoms


def md(
    structure: Structure,
    *,
    model: str | os.PathLike[str] = "demo-emt-cu",
    head: str | None = None,
    ensemble: str = "nvt",
    steps: int = 1000,
    timestep_fs: float | None = None,
    output: str | os.PathLike[str] | None = None,
    seed: int = 0,
    repeat: Sequence[int] | int | None = None,
    replicas: int = 1,
    exchange_every: int = 0,
    max_batch_atoms: int | None = None,
    gpus: int | str | None = None,
    initial_temperature_K: float | None = None,
    trajectory_every: int = 100,
    thermo_every: int = 100,
    restart_every: int = 10_000,
    trajectory_format: str = "auto",
    device: str | None = None,
    dtype: str | None = None,
    backend: str | None = None,
    checkpoint: str | os.PathLike[str] | None = None,
    sha256: str | None = None,
    trusted: bool = False,
    block_steps: int | None = None,
    skin_A: float | None = None,
    graphs: bool | None = None,
    compile: bool | None = None,
    matmul_precision: str | None = None,
    radial_table: bool | None = None,
    guard: GuardConfig | bool | dict[str, float] | None = None,
    resume: bool = False,
    progress: TextIO | None = None,
    check: str | None = None,
    reproducible: bool = False,
    dispersion: str | None = None,
    dispersion_functional: str | None = None,
    charge: PerSystemValue = None,
    spin: PerSystemValue = None,
    config: EngineConfig | None = None,
    runner: RunnerConfig | None = None,
    temperature_schedule: Any = None,
    pressure_schedule: Any = None,
    **ensemble_settings: Any,
) -> MDResult:
    """Run MD of ``structure`` with ``model`` and return the result (summary, final structures).

    ``ensemble`` is ``"nve"``, ``"nvt"`` (Langevin), ``"nvt-csvr"``, ``"nvt-nose-hoover"`` or
    ``"npt"``; its settings are keyword arguments in the units ASE users expect:
    ``temperature_K``, ``friction_per_ps``, ``tau_fs``, ``chain_length``, ``pressure_GPa`` or
    ``pressure_bar``, ``thermostat_tau_fs``, ``barostat_tau_fs``, ``compressibility_per_GPa``,
    ``cell_mode`` ("isotropic", "per_axis", "full"). Velocities are drawn at
    ``initial_temperature_K``. By default, for a structure without velocities, they are drawn
    at ``temperature_K``, and at twice it for a system at rest at an energy minimum (largest
    first force below 0.05 eV/Å), so that equipartition leaves it at ``temperature_K``.

    ``model`` is a label (its file must be present: ``fastmace models fetch`` downloads; this
    function never does), ``template:NAME`` or a path. A path needs ``sha256=`` (the file's
    SHA-256, checked before it is loaded) or ``trusted=True``, as for ``fm.load``, because
    loading a checkpoint runs code from it. With ``output`` the run writes a run
    directory (docs/output.md), which is never overwritten; ``resume=True`` continues it,
    with the same physics (a resume that changes the ensemble's settings, the model, dtype or
    seed is refused) and the saved timestep unless ``timestep_fs`` is given (1 fs for a new
    run).

    ``replicas=N`` runs N copies of each structure in one batch (copies of a structure next to
    each other), each drawing from its own random stream: system ``s`` of a batch, copy or
    not, draws from ``seed + s``, so it follows the trajectory it would follow alone with that
    seed. Settings given per system (``temperature_K=[...]``) count the copies.

    ``exchange_every=N`` runs replica exchange (parallel tempering) between the copies of one
    structure: ``temperature_K`` gives one temperature per replica, lowest first (for instance
    ``fm.geometric_ladder(300, 600, 8)`` with ``replicas=8``), and every N steps neighbouring
    rungs swap temperatures by the Metropolis criterion, decided on the device.

    A request too large for the device's memory runs as several batches of whole systems, one
    after another (``batch-001/``, ... in the run directory; each system as it would run in
    one batch): on CUDA the batch size comes from the memory a few copies of the largest
    structure take, measured before the run; ``max_batch_atoms=N`` sets it.

    ``gpus=N`` (or ``"all"``) spreads the systems over N GPUs of this machine, one child
    process per GPU running its share at once (``gpu-0/``, ... in the run directory; each
    system as it would run on one GPU; :mod:`fastmace.spread`); a replica-exchange ladder's
    processes gather their walkers' energies at each block's end.

    ``dispersion="d3bj"`` adds D3(BJ) dispersion (two-body, mace-torch's
    ``mace_mp(dispersion=True)`` cutoffs) with the parameters of the functional the model's
    head was trained on (the label table's), or of ``dispersion_functional`` (docs/md.md);
    ``dispersion="d3bj-atm"`` adds its three-body (Axilrod-Teller-Muto) term too.

    ``charge`` (total charge in e) and ``spin`` (spin multiplicity 2S + 1: 1 a singlet, 2 a
    doublet) of each system, one value for all or one per system (replicas count), are read
    by long-range models (MACE-POLAR-1) only; left out, each structure's
    ``atoms.info["charge"]`` and ``atoms.info["spin"]`` give them, else a neutral singlet, as
    mace-torch's calculator reads them. A model without a long-range part refuses them. A
    long-range model runs eagerly (no CUDA graphs, no torch.compile: graph-longrange and
    mace-torch synchronise with the host in its forward pass), on e3nn, at a fixed cell: NPT
    is refused, as its stress leaves out the long-range part (docs/models.md#mace-polar-1).

    ``guard`` sets the physical bounds the run must stay within, checked on the device every
    block (docs/md.md): ``None``/``True`` the defaults, ``False`` off, a mapping of bounds or
    an ``fm.GuardConfig``. A run outside them stops with ``GuardError``, naming the last good
    restart.

    How it runs is planned (:mod:`fastmace.planner`): backend, dtype, graphs, block length,
    skin and the environment variables, each decision with its reason (in the report and
    metadata.json). ``device``, ``dtype``, ``backend``, ``block_steps``, ``skin_A``,
    ``graphs`` (CUDA graphs), ``compile`` (the model through ``torch.compile``: faster steps
    after a compilation; left to the plan, on for float32 cuEq runs on CUDA whose predicted
    saving pays for it, weighed with what this model's last compilation here cost,
    docs/md.md), ``matmul_precision`` ("tf32": the model's matrix products on TF32 tensor
    cores, faster and looser; "bf16": its linear layers' GEMMs with BF16 inputs and float32
    sums) and ``radial_table`` (each block's radial weights read from a
    table of the distance instead of computed by its radial MLP; left to the plan, on for
    float32 runs on CUDA of models that allow it; False turns it off, docs/md.md) force a
    decision, as does
    ``config`` (an ``fm.EngineConfig``): the keywords are its fields of the same name, set on
    it, so a setting forced both ways must agree.
    The plan is the one carrier of these settings to the model, the engine and the neighbour
    list. ``reproducible=True`` sets the determinism variables.

    ``temperature_schedule`` anneals, quenches or heats (Langevin, CSVR and NPT): a list of
    ``(step, temperature_K)`` points from step 0, followed linearly, or
    ``fm.TemperatureSchedule(points, mode="step")`` to hold each until the next; the target is
    set on the device before every block (docs/md.md). ``temperature_K`` may be left out; the
    velocities start at the first point unless ``initial_temperature_K`` says otherwise.
    ``pressure_schedule`` does the same for the NPT barostat's target, in GPa
    (``fm.PressureSchedule``).

    ``check="gate"`` compares the model as the engine runs it with mace-torch's float64 e3nn
    model on the structure (the first of a batch; above 4096 atoms the cell before ``repeat``,
    a periodic sub-cell the structure repeats, or else a cluster cut from it:
    :mod:`fastmace.gate.reduce`), in a child process, before the run; a backend that fails
    is replaced by the next one (cuEq -> hybrid -> e3nn) and the failure recorded.

    ``runner`` (an ``fm.RunnerConfig``) with ``subprocess=True`` runs all this in a child
    process (:mod:`fastmace.runner`): the structures are read here, the result comes back the
    same. Its ``environment`` goes to every child process of the run (also the gate's).
    """
    from fastmace.runs import MDRequest

    request = MDRequest(
        model=model, head=head, ensemble=ensemble, steps=steps, timestep_fs=timestep_fs,
        output=output, seed=seed, repeat=repeat, replicas=replicas,
        exchange_every=exchange_every, max_batch_atoms=max_batch_atoms, gpus=gpus,
        initial_temperature_K=initial_temperature_K, trajectory_every=trajectory_every,
        thermo_every=thermo_every, restart_every=restart_every,
        trajectory_format=trajectory_format, device=device, dtype=dtype, backend=backend,
        checkpoint=checkpoint, sha256=sha256, trusted=trusted, block_steps=block_steps,
        skin_A=skin_A, graphs=graphs, compile=compile, matmul_precision=matmul_precision,
        radial_table=radial_table, guard=guard, resume=resume, check=check,
        reproducible=reproducible, dispersion=dispersion,
        dispersion_functional=dispersion_functional, charge=charge, spin=spin,
        config=config, temperature_schedule=temperature_schedule,
        pressure_schedule=pressure_schedule, ensemble_settings=ensemble_settings,
    )  # fmt: skip
    call = _check_call(structure, request, runner, progress)
    if gpus is not None and not call.in_child_process:
        slots = _gpu_slots(gpus, device, call.runner)
        if len(slots) > 1:
            from fastmace.spread import run_spread

            structures = call.checked.structures
            arguments = call.asked.arguments()
            return run_spread(arguments, structures, slots, call.runner, progress or sys.stderr)
    if call.runner.subprocess and not call.in_child_process:
        from fastmace.runner import run_in_subprocess

        arguments = call.asked.arguments()
        return run_in_subprocess(arguments, call.checked.units, call.runner, progress)
    tick = time.perf_counter()
    settings, plan = _settings_and_plan(call)
    planned_s = time.perf_counter() - tick  # torch's import and the machine's probe included
    with _planned_environment(plan):
        prepared = _load_and_gate(call, plan, settings)
        # The request's checks (structures read and checked) came before the plan.
        checked_s = tick - call.called
        prepared.phases = {"check_s": checked_s, "plan_s": planned_s, **prepared.phases}
        parts = _partition(call, prepared)
        return _run_parts(call, settings, prepared, parts, progress)


# -- fm.md's stages, in the order it runs them ------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Call:
    """fm.md's request, checked before a model is loaded or a directory made: what was asked
    (what a child process gets), preflight's structures and units, the one EngineConfig, the
    runner, and whether this process is a child of another run."""

    asked: MDRequest
    checked: Any  # fastmace.preflight.CheckedRequest
    config: EngineConfig
    runner: RunnerConfig
    child: Any  # fastmace.child_run's record, in a child process
    called: float  # time.perf_counter() of the request: the start of the start-up timings

    @property
    def in_child_process(self) -> bool:
        return self.child is not None


def _check_call(
    structure: Structure,
    request: MDRequest,
    runner: RunnerConfig | None,
    progress: TextIO | None,
) -> _Call:
    """Stage 1, the request: every check that needs neither the model nor a directory (a
    large request says so to ``progress`` first)."""
    from fastmace.preflight import check_request
    from fastmace.runner import RunnerConfig

    child = child_run.current()  # the runner's or a spread ladder's child (fastmace.child_run)
    called = time.perf_counter()
    for name in ("temperature_schedule", "pressure_schedule"):
        schedule = getattr(request, name)
        if isinstance(schedule, TemperatureSchedule):  # plain data for a child process
            request = dataclasses.replace(request, **{name: schedule.to_dict()})
    if request.check not in (None, "gate"):
        raise ValueError(f"check must be None or 'gate', got {request.check!r}")
    if "capture" in request.ensemble_settings:
        raise TypeError("fm.md's capture= is now graphs=, the name EngineConfig and the plan use")
    unknown = sorted(set(request.ensemble_settings) - set(setting_names()))
    if unknown:
        raise TypeError(
            f"fm.md got unknown arguments {', '.join(unknown)}; the ensemble settings are: "
            f"{', '.join(setting_names())}"
        )
    runner = RunnerConfig() if runner is None else runner
    if not isinstance(runner, RunnerConfig):
        raise TypeError(f"runner must be an fm.RunnerConfig or None, got {runner!r}")
    config = engine_config(
        request.config, **{name: getattr(request, name) for name in _ENGINE_KEYWORDS}
    )
    # Charges for a label or template without a long-range part: refused before its file is
    # looked for.
    model = request.model
    _refuse_charge_for_local(model, _named_model_type(model), request.charge, request.spin)
    checked = check_request(structure, request.arguments(), runner.environment, progress)
    atoms = sum(len(one) for one in checked.structures)
    if atoms >= SETUP_PROGRESS_ATOMS:  # as check_request's own note, in a child process too
        seconds = time.perf_counter() - called
        setup_note(progress, f"request checked in {seconds:.1f} s; planning, loading the model")
    return _Call(request, checked, config, runner, child, called)


# fm.md's keywords that are EngineConfig's fields of the same names.
_ENGINE_KEYWORDS = (
    "backend", "dtype", "block_steps", "skin_A", "graphs", "compile", "matmul_precision",
    "radial_table", "guard", "max_batch_atoms",
)  # fmt: skip


def _settings_and_plan(call: _Call) -> tuple[RunSettings, Plan]:
    """Stage 2, what to run: the ensemble (a schedule's start as its target), the timestep (a
    resumed run keeps its own), the velocities' start, the output schedule, and the plan made
    before the model loads."""
    from fastmace.dynamics.ensembles import ensemble as make_ensemble
    from fastmace.io import OutputSchedule
    from fastmace.simulation import RunSettings

    given, settings = call.asked, dict(call.asked.ensemble_settings)
    temperatures = given.temperature_schedule
    schedule = None if temperatures is None else TemperatureSchedule.coerce(temperatures)
    if schedule is not None and settings.get("temperature_K") is None:
        settings["temperature_K"] = schedule.points[0][1]  # the schedule's start
    pressures = given.pressure_schedule
    pressures = None if pressures is None else PressureSchedule.coerce(pressures)
    if pressures is not None and settings.get("pressure_GPa") is None:
        settings["pressure_GPa"] = pressures.points[0][1]
    chosen = make_ensemble(given.ensemble, **settings)
    output, resume = given.output, given.resume
    timestep_fs = given.timestep_fs
    if timestep_fs is None:  # a resumed run keeps its timestep unless another is given
        from fastmace.batching import batch_directories
        from fastmace.resuming import saved_timestep_fs

        batches = batch_directories(output) if resume else []
        saved = saved_timestep_fs(batches[0] if batches else output) if resume else None
        timestep_fs = DEFAULT_TIMESTEP_FS if saved is None else saved
    structures = call.checked.structures
    initial_temperature_K = given.initial_temperature_K
    drawn_by_default = False  # the velocities are ours to choose (thermal_start.py)
    if initial_temperature_K is None and not resume:
        has_velocities = any(abs(atoms.get_velocities()).max() > 0 for atoms in structures)
        if not has_velocities:
            initial_temperature_K = settings.get("temperature_K")
            drawn_by_default = initial_temperature_K is not None
    trajectory_every = given.trajectory_every
    if given.trajectory_format == "none":
        trajectory_every = 0  # "none" writes no frames, whatever the interval says
    plan = _plan(
        structures, call.config, ensemble=chosen.name,
        temperature_K=chosen.settings.get("temperature_K"),
        pressure_GPa=_pressure_GPa(chosen.settings), steps=given.steps,
        timestep_fs=timestep_fs, reproducible=given.reproducible,
        device=given.device or "auto", long_range=_is_long_range(given.model),
    )  # fmt: skip
    run = RunSettings(
        ensemble=chosen, steps=given.steps, timestep_fs=timestep_fs, seed=given.seed,
        schedule=OutputSchedule(trajectory_every, given.thermo_every, given.restart_every),
        initial_temperature_K=initial_temperature_K,
        start_at_equipartition=drawn_by_default,
        trajectory_format=given.trajectory_format, temperature_schedule=schedule,
        pressure_schedule=pressures, dispersion=given.dispersion,
        dispersion_functional=given.dispersion_functional,
        exchange_every=given.exchange_every, charge=call.checked.charge,
        spin=call.checked.spin,
    )  # fmt: skip
    return run, plan


@dataclasses.dataclass
class _Prepared:
    """What stage 3 made: the model loaded (and gated), the plan it runs by, each system's
    charge and spin, the gate's result and the backends it replaced, start-up phases."""

    model: LoadedModel
    plan: Plan
    charges: list[float] | None
    spins: list[float] | None
    gate: Any
    fallbacks: list[dict[str, Any]]
    phases: dict[str, float]


def _load_and_gate(call: _Call, plan: Plan, settings: RunSettings) -> _Prepared:
    """Stage 3, the model: loaded as planned (and the plan made again with its facts), each
    system's charge and spin checked, and with check="gate" checked against mace-torch in a
    child process, a failing backend replaced by the next."""
    given = call.asked
    tick = time.perf_counter()
    loaded, plan = _load_and_plan(
        given.model, plan, head=given.head, checkpoint=given.checkpoint,
        sha256=given.sha256, trusted=given.trusted, seed=given.seed,
    )  # fmt: skip
    phases = {"load_s": time.perf_counter() - tick}  # with conversion and its checks
    phases.update({f"load_{part}": seconds for part, seconds in loaded.timings.items()})
    from fastmace.simulation import run_charges_and_spins

    structures = call.checked.structures
    charges, spins = run_charges_and_spins(settings, loaded, structures)
    gate, fallbacks = None, []
    if given.check == "gate":
        tick = time.perf_counter()
        from fastmace.gate import gate_with_fallback, reduced_structure

        engine = plan.engine_settings()
        candidates = list(dict.fromkeys(candidate.backend for candidate in plan.candidates()))
        checked = reduced_structure(structures[0], call.checked.units[0])
        first = (charges[0], spins[0]) if charges and spins else (None, None)
        gated = gate_with_fallback(
            loaded, _gated_structure(checked.atoms, *first), candidates=candidates,
            environment=call.runner.environment, structure=checked.description,
            matmul_precision=engine.matmul_precision, radial_table=engine.radial_table,
            fused_convolution=engine.fused_convolution, product_basis=engine.product_basis,
        )  # fmt: skip
        loaded, gate, fallbacks = gated.model, gated.gate, gated.failures
        phases["gate_s"] = time.perf_counter() - tick
    return _Prepared(loaded, plan, charges, spins, gate, fallbacks, phases)


@dataclasses.dataclass(frozen=True)
class _Parts:
    """The request's systems cut into batches run one after another: the ranges, how their
    size was chosen (for the report), and whether they are a resumed request's own."""

    ranges: list[range]
    sizing: str
    resumed: bool


def _partition(call: _Call, prepared: _Prepared) -> _Parts:
    """Stage 4, the batches: a resumed request's own, at most ``max_batch_atoms`` each, or
    on CUDA as many as the measured memory holds; open and periodic systems of a long-range
    model never share one."""
    from fastmace.batching import saved_parts

    given, config = call.asked, call.config
    structures, exchange_every = call.checked.structures, given.exchange_every
    resumed = saved_parts(given.output, len(structures)) if given.resume else None
    parts = resumed or _batches(structures, config.max_batch_atoms, exchange_every)
    if resumed is not None:
        sizing = "Batches as recorded when the run started (batches.json)."
    elif config.max_batch_atoms is not None:
        sizing = f"At most {config.max_batch_atoms} atoms per batch (max_batch_atoms)."
    else:
        sizing = ""
    if resumed is None and config.max_batch_atoms is None and len(structures) > 1:
        from fastmace.batching import measured_budget

        budget = measured_budget(prepared.model, structures, prepared.plan.engine_settings().skin_A)
        if budget is not None:
            largest = max(len(atoms) for atoms in structures)
            parts = _batches(structures, budget.max_atoms(largest), exchange_every)
            sizing = budget.describe(largest)
    if prepared.charges is not None:  # a long-range model: no batch mixes open and periodic
        from fastmace.batching import OPEN_APART, open_systems, split_open_from_periodic

        is_open = open_systems([atoms.pbc for atoms in structures])
        split = split_open_from_periodic(parts, is_open)
        if len(split) > len(parts):
            parts, sizing = split, f"{sizing} {OPEN_APART}".strip()
    return _Parts(list(parts), sizing, resumed is not None)


def _run_parts(
    call: _Call,
    settings: RunSettings,
    prepared: _Prepared,
    parts: _Parts,
    progress: TextIO | None,
) -> MDResult:
    """Stage 5, the run: one Simulation, or one per batch with their results merged."""
    from fastmace.runner import runner_record
    from fastmace.simulation import Simulation

    given, structures = call.asked, call.checked.structures
    output, resume = given.output, given.resume
    common = dict(
        progress=progress, gate=prepared.gate, fallbacks=prepared.fallbacks,
        plan=prepared.plan, called=call.called,
        runner=runner_record(call.runner, in_child=call.in_child_process),
    )  # fmt: skip
    if len(parts.ranges) == 1:
        from fastmace.dynamics.exchange_group import ExchangeGroup

        saved = call.child.exchange_group if call.child is not None else None
        group = None if saved is None else ExchangeGroup.from_dict(saved)
        simulation = Simulation(
            prepared.model, structures, settings, output, resume=resume,
            phases=prepared.phases, exchange_group=group, **common,
        )  # fmt: skip
        return simulation.run()
    from fastmace.batching import (
        batch_output,
        batch_settings,
        batches_heading,
        merged_result,
        release_device_memory,
        write_parts,
    )

    if not parts.resumed:
        write_parts(output, parts.ranges, parts.sizing)
    results = []
    for number, part in enumerate(parts.ranges, start=1):
        where = batch_output(output, number)
        # A resumed request resumes the batches it had started and starts the others.
        again = resume and where is not None and where.exists()
        simulation = Simulation(
            prepared.model, structures[part.start : part.stop],
            batch_settings(settings, part, len(structures)), where, resume=again,
            phases=prepared.phases if number == 1 else {}, **common,
        )  # fmt: skip
        results.append(simulation.run())
        del simulation  # its graphs' memory pools, before the next batch is set up
        release_device_memory()
    return merged_result(results, parts.ranges, output, batches_heading(parts.ranges, parts.sizing))


def _gpu_slots(gpus: int | str, device: str | None, runner: RunnerConfig) -> list:
    """The devices ``gpus`` asks for (fastmace.spread.cuda_slots), on this machine."""
    from fastmace.spread import VISIBLE_DEVICES, SpreadError, cuda_slots

    if device not in (None, "auto", "cuda"):
        raise SpreadError(f"gpus={gpus!r} spreads the run over CUDA GPUs; device={device!r}")
    import torch

    visible = runner.environment.get(VISIBLE_DEVICES, os.environ.get(VISIBLE_DEVICES))
    return cuda_slots(gpus, visible, torch.cuda.device_count())


def _batches(structures: list[ase.Atoms], max_atoms: int | None, exchange_every: int) -> list:
    """The request's systems as consecutive batches of at most ``max_atoms`` atoms (one batch
    for None); replica exchange needs all its replicas in one."""
    from fastmace.batching import BatchError, split_into_batches

    if max_atoms is None:
        return [range(len(structures))]
    parts = split_into_batches([len(atoms) for atoms in structures], max_atoms)
    if len(parts) > 1 and exchange_every:
        raise BatchError(
            f"replica exchange needs all {len(structures)} replicas in one batch, and they "
            f"hold more than {max_atoms} atoms, what one batch may hold here"
        )
    return parts


def relax(
    structure: Structure,
    *,
    model: str | os.PathLike[str] = "demo-emt-cu",
    head: str | None = None,
    fmax: float = 0.05,
    steps: int = 1000,
    cell: bool = False,
    pressure_GPa: float = 0.0,
    max_step_A: float = 0.2,
    output: str | os.PathLike[str] | None = None,
    repeat: Sequence[int] | int | None = None,
    device: str | None = None,
    dtype: str | None = None,
    backend: str | None = None,
    checkpoint: str | os.PathLike[str] | None = None,
    sha256: str | None = None,
    trusted: bool = False,
    dispersion: str | None = None,
    dispersion_functional: str | None = None,
    charge: PerSystemValue = None,
    spin: PerSystemValue = None,
    config: EngineConfig | None = None,
    progress: TextIO | None = None,
) -> RelaxResult:
    """Relax ``structure`` (one or several systems, batched) with FIRE, on the device.

    Each system stops at its own convergence: its largest force below ``fmax`` (eV/Å), with
    ``cell=True`` also the cell's generalised forces, as ASE's ``FIRE`` with
    ``FrechetCellFilter`` (at ``pressure_GPa``; periodic structures only). ``steps`` bounds the
    iterations; a system not converged by then is reported as such, not raised. FIRE's
    parameters are ASE's defaults, ``max_step_A`` its largest move per iteration.

    ``model``, ``head``, ``checkpoint``, ``sha256``, ``trusted``, ``device``, ``dtype``,
    ``backend``, ``dispersion``, ``dispersion_functional``, ``charge``, ``spin`` and ``config``
    are as for :func:`fm.md <fastmace.api.md>`, and the run is planned the same way (a
    long-range model, MACE-POLAR-1, relaxes the positions only: its stress leaves out the
    long-range part, so ``cell=True`` is refused for it): with
    ``dispersion="d3bj"`` the structure relaxes on the model plus D3(BJ), the force field an MD
    run with the same settings uses. With ``output`` a new directory receives
    ``relaxed.extxyz``, ``relax.csv`` (per block and system: energy, enthalpy, largest force,
    volume), ``metadata.json`` and ``report.txt`` (docs/relax.md).
    """
    from fastmace.dynamics.relax import FireSettings
    from fastmace.relaxation import Relaxation
    from fastmace.structures import read_structures

    model_type = _named_model_type(model)
    _refuse_charge_for_local(model, model_type, charge, spin)
    if cell and _is_long_range(model):
        from fastmace.relaxation import refused_cell_relaxation

        raise refused_cell_relaxation(os.fspath(model), model_type)
    settings = FireSettings(fmax=fmax, cell=cell, pressure_GPa=pressure_GPa, max_step_A=max_step_A)
    if isinstance(steps, bool) or not (isinstance(steps, int) and steps >= 0):
        raise ValueError(f"steps must be a whole number >= 0, got {steps!r}")
    structures = read_structures(structure, repeat)
    config = engine_config(config, backend=backend, dtype=dtype)
    # Planned as the NVE run of the same systems: device, backend, dtype, graphs, block length
    # and the neighbour list's settings do not depend on the integrator.
    plan = _plan(
        structures, config, ensemble="nve", steps=max(steps, 1), device=device or "auto",
        long_range=_is_long_range(model),
    )  # fmt: skip
    with _planned_environment(plan):
        loaded, plan = _load_and_plan(
            model, plan, head=head, checkpoint=checkpoint, sha256=sha256, trusted=trusted
        )
        relaxation = Relaxation(
            loaded, structures, settings, max_steps=steps, plan=plan, output=output,
            progress=progress, dispersion=dispersion,
            dispersion_functional=dispersion_functional, charge=charge, spin=spin,
        )  # fmt: skip
        return relaxation.run()
