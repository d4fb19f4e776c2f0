"""A run: structures, a loaded model, an ensemble and an output directory, tied together.

:class:`Simulation` builds the batched State, the potential on its neighbour list, the
integrator and the engine, then runs blocks of K steps and, between blocks, writes what the
output schedule asks for (thermo rows, trajectory frames, restarts) and shows progress. A
restart holds every tensor of the integrator state, the random generators and the neighbour
list's reference positions, so a resumed run continues bit for bit on the same device; it also
records the run's physics, which a resume must not change (:mod:`fastmace.resuming`), and the
guard's references. A run that blows up or leaves the guard's bounds stops with an error that
names the last good restart.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

import ase
import torch

from fastmace import assembly
from fastmace.batching import check_open_apart
from fastmace.dynamics.checks import check_structures
from fastmace.dynamics.compile_workers import inductor_workers
from fastmace.dynamics.dispersion import model_dispersion_functional
from fastmace.dynamics.engine import Engine, generators_of, tensors_of
from fastmace.dynamics.errors import GuardError, SimulationError
from fastmace.dynamics.exchange_group import ExchangeGroup
from fastmace.dynamics.guard import Guard
from fastmace.dynamics.integrators import (
    Barostatted,
    Thermostatted,
    maxwell_boltzmann_velocities,
    random_streams,
)
from fastmace.dynamics.integrators.units import EV_PER_A3_PER_GPA, KB_EV_PER_K
from fastmace.dynamics.neighbours import DEFAULT_CELL_MARGIN, NeighbourList
from fastmace.dynamics.replica_exchange import ReplicaExchange
from fastmace.dynamics.state import State
from fastmace.dynamics.thermal_start import ThermalStart, equipartition_start
from fastmace.dynamics.thermo import thermo_rows
from fastmace.ensemble_catalog import exchanging
from fastmace.io import Progress, RunDirectory, RunOutput
from fastmace.io.plot import can_plot
from fastmace.io.progress import setup_note, startup_line
from fastmace.io.run_directory import DiskFullError, is_disk_full
from fastmace.models.load import LoadedModel
from fastmace.planner import EngineSettings, Plan, engine_settings_for
from fastmace.resuming import (
    ResumeError,
    check_resume,
    physics_record,
    restart_time_fs,
    saved_restart,
    too_few_steps,
)
from fastmace.runs import MDResult, RunRecord, RunSettings, SecondHalfMean
from fastmace.runtime.compile_costs import CompileIdentity, record_cost_s
from fastmace.runtime.process_clock import seconds_since_process_start
from fastmace.vocabulary import SETUP_PROGRESS_ATOMS

__all__ = ["MDResult", "RunSettings", "Simulation"]


@dataclass
class _Speed:
    """How long the blocks took: the first (start-up included) and the steady ones."""

    first_block_s: float = 0.0
    steady_s: float = 0.0
    steady_steps: int = 0

    def steps_per_s(self, steps_run: int) -> float:
        """The steady rate, else the first block's, else NaN (nothing ran)."""
        if self.steady_steps:
            return self.steady_steps / self.steady_s
        if self.first_block_s:
            return steps_run / self.first_block_s
        return float("nan")


class Simulation:
    """Run ``settings`` on ``structures`` with ``model``, writing to ``output`` (optional)."""

    def __init__(
        self,
        model: LoadedModel,
        structures: Sequence[ase.Atoms],
        settings: RunSettings,
        output: str | Path | None = None,
        *,
        engine: EngineSettings | None = None,
        plan: Plan | None = None,
        resume: bool = False,
        progress: TextIO | None = None,
        gate: Any = None,
        fallbacks: Sequence[dict[str, Any]] = (),
        runner: dict[str, Any] | None = None,
        phases: Mapping[str, float] | None = None,
        called: float | None = None,
        exchange_group: ExchangeGroup | None = None,
    ) -> None:
        """``phases`` are the start-up phases timed before (fm.md: ``load_s``, ``gate_s``) and
        ``called`` the ``time.perf_counter()`` of the request: the start of ``to_first_step_s``
        (default: now). ``exchange_group``: this run's walkers are part of a ladder spread over
        processes (fastmace.spread)."""
        started = time.perf_counter()
        self.called = started if called is None else called
        self.plan = plan  # when the run was planned (fm.md): its decisions are the engine's
        # One compile worker where the plan expects Inductor's cache to hold the compilation.
        self.compile_workers = plan.compile_workers if plan is not None else None
        self.engine_settings = engine_settings_for("Simulation", engine, plan, EngineSettings())
        # metadata.json's runner record (fastmace.runner.runner_record): in a child process?
        self.runner = runner or {"subprocess": False, "environment": []}
        self.gate = gate  # a fastmace.gate.GateResult, when the run was checked
        self.fallbacks = list(fallbacks)
        self.exchange_group = exchange_group
        self.model = model
        self.settings = settings
        self.structures = list(structures)
        self.block_steps = settings.block_steps_for(self.engine_settings.block_steps)
        self.progress_stream = progress
        self.output: RunOutput | None = None
        self.plot: Path | None = None  # thermo.png, once the run has drawn it
        self.start_step = 0
        self.start_time_fs = 0.0
        self.setup_parts: dict[str, float] = {}  # each part's seconds (metadata.json)
        # The stages of the set-up, in order; nothing is written before the run directory.
        self._check_request()
        state = self._initial_state(output, resume)
        # The potential before the run directory: a model it refuses (its species, a radial
        # table it cannot have) leaves nothing behind. A restart keeps the atoms' elements.
        with self._timed("setup_potential_s"):
            self.potential = assembly.potential(model, state.atomic_numbers, self.engine_settings)
        restart = self._open_output(output, resume, state)
        try:
            if restart is not None:
                state = _state_from_restart(state, restart.payload)
            with inductor_workers(self.compile_workers):  # the first compiled call
                md, force_field = self._first_forces(state, restart)
            # The first compiled call: the set-up's first forces, or else (where those run
            # eagerly to check FastMACE's own kernels on the first state) the first block.
            self._compiled_in_setup = self.potential.first_compiled_call_s is not None
            if self._compiled_in_setup:
                self._record_compile_cost(model, plan)
            self._continue_from(restart, md, force_field)
            self._assemble_engine(md, state, force_field, restart, resume)
            self.timings = {
                **(phases or {}),
                **self.setup_parts,
                "setup_s": time.perf_counter() - started,
            }
            self._write_metadata("running")
        except BaseException:
            # Nothing ran: the directory is given up (its lock released), its files stay.
            if self.output is not None:
                self.output.close()
            raise

    # -- the set-up's stages ---------------------------------------------------------------

    @contextlib.contextmanager
    def _timed(self, part: str) -> Iterator[None]:
        tick = time.perf_counter()
        yield
        self.setup_parts[part] = time.perf_counter() - tick

    def _check_request(self) -> None:
        """Refuse what the model or the structures cannot take, before anything is created:
        their elements, a dispersion, charges and spins (None: a local model reads none)."""
        model, structures, settings = self.model, self.structures, self.settings
        check_structures(structures, model.description.atomic_numbers)
        self.dispersion_functional = model_dispersion_functional(
            settings.dispersion, settings.dispersion_functional, model, structures
        )
        self.charges, self.spins = run_charges_and_spins(settings, model, structures)
        if self.charges is not None:
            check_open_apart([atoms.pbc for atoms in structures])

    def _initial_state(self, output: str | Path | None, resume: bool) -> State:
        """The batched State with its starting velocities, the run's physics record, and a
        resume's check against the restart (before the directory is cut back to it)."""
        settings = self.settings
        state = State.from_atoms(self.structures, device=self.model.device)
        self.physics = physics_record(
            settings, self.model, state.n_systems, self.dispersion_functional,
            charges=self.charges, spins=self.spins,
        )  # fmt: skip
        if resume:  # a refusal here changes nothing on disk
            self._check_resume(output, state)
        # One stream per system from the seed (system s: seed + s), for the velocities and then
        # the integrator's noise: two generators seeded alike made Langevin's first noise repeat
        # the velocities' draw, a kick of 12% of the kinetic energy at 1/ps (38% at 10/ps) on
        # the first step. Per system, a system's trajectory does not depend on its batch.
        self.streams = random_streams(settings.seed, state)
        if settings.initial_temperature_K is not None and not resume:
            state = maxwell_boltzmann_velocities(
                state, settings.initial_temperature_K, self.streams
            )
        return state

    def _open_output(self, output: str | Path | None, resume: bool, state: State) -> Any:
        """The run directory, created or reopened; the restart to resume from, if any."""
        if output is None:
            if resume:
                raise ValueError("resume=True needs the output directory of the run to resume")
            return None
        settings = self.settings
        self.output = (
            RunDirectory.resume(output)
            if resume
            else RunDirectory.create(
                output, n_atoms=state.n_atoms, n_systems=state.n_systems,
                n_steps=settings.steps, schedule=settings.schedule,
                trajectory_format=settings.trajectory_format,
            )
        )  # fmt: skip
        return self.output.restart

    def _first_forces(self, state: State, restart: Any) -> tuple[Any, Any]:
        """The neighbour list, the force field and the integrator's first state, its forces
        computed (the list grown until it holds every edge); a large set-up says each part."""
        settings, progress, parts = self.settings, self.progress_stream, self.setup_parts
        # A large set-up says what it is doing as it goes (the first forces of a million
        # atoms take minutes on a CPU).
        say = state.n_atoms >= SETUP_PROGRESS_ATOMS
        if say:
            setup_note(progress, (
                f"{state.n_atoms:,} atoms; potential ready in "
                f"{parts['setup_potential_s']:.1f} s; building the neighbour list"
            ))  # fmt: skip
        with self._timed("setup_neighbours_s"):
            neighbours, edges = self._neighbour_list(state, restart)
        if say:
            chunks = self.potential.edge_chunk_rows
            setup_note(progress, (
                f"neighbour list of {neighbours.capacity:,} edges in "
                f"{parts['setup_neighbours_s']:.1f} s; computing the first forces"
                + (f" (edges in chunks of up to {chunks:,} rows)" if chunks else "")
            ))  # fmt: skip
        force_field = assembly.force_field(
            state, self.potential, neighbours, edges=edges,
            stress=settings.ensemble.needs_stress,
            dispersion=assembly.dispersion(
                state, self.dispersion_functional, self.engine_settings,
                three_body=settings.dispersion == "d3bj-atm",
            ),
            charges=self.charges, spins=self.spins,
        )  # fmt: skip
        with self._timed("setup_first_forces_s"):
            md = assembly.first_forces(
                lambda: settings.ensemble.init(
                    state, force_field, settings.timestep_fs, self.streams
                ),
                force_field,
                state,
            )
        # Our own draw from rest at a minimum starts at twice the target (thermal_start.py).
        self.thermal_start: ThermalStart | None = None
        if settings.start_at_equipartition and restart is None:
            md, self.thermal_start = equipartition_start(md)
        if say:
            setup_note(progress, f"first forces in {parts['setup_first_forces_s']:.1f} s")
        return md, force_field

    def _continue_from(self, restart: Any, md: Any, force_field: Any) -> None:
        """A resumed run's state, step, time and search pattern, as its restart saved them."""
        # The last restart on disk, with its step: where a failed run can be resumed from.
        self.last_restart: int | None = None if restart is None else restart.step
        if restart is None:
            return
        self._restore(md, restart.payload)
        self.start_step = restart.step
        self.start_time_fs = restart_time_fs(restart)
        # The same search pattern as the interrupted run, so it continues bit for bit.
        saved_every = restart.payload["neighbours"].get("search_every")
        force_field.search_every = int(saved_every or force_field.search_every)

    def _assemble_engine(
        self, md: Any, state: State, force_field: Any, restart: Any, resume: bool
    ) -> None:
        """The guard, replica exchange and the engine that captures the blocks."""
        settings = self.settings
        guard, schedule = self.engine_settings.guard, settings.temperature_schedule
        self.guard = (
            Guard(
                md, guard, skin_A=force_field.neighbours.skin,
                references=restart.payload.get("guard") if restart is not None else None,
                hottest_target_K=schedule.largest() if schedule is not None else 0.0,
            )
            if guard.enabled
            else None
        )  # fmt: skip
        saved_exchange = restart.payload.get("exchange") if restart is not None else None
        self.exchange = self._replica_exchange(md, state, resume, saved_exchange)
        self.engine = Engine(
            md,
            settings.ensemble.step,
            force_field,
            block_steps=self.block_steps,
            capture=self.engine_settings.graphs,
            guard=self.guard,
            block_end=self.exchange,  # the swaps (inside the captured block in one process)
            # A run that compiles its model on CUDA has its step's own arithmetic fused too.
            fuse=self.potential.compiled and state.device.type == "cuda",
        )
        self.engine.steps_done = self.start_step

    def _record_compile_cost(self, model: LoadedModel, plan: Plan | None) -> None:
        """What this run's compilation cost, for the next plan of the same model and size
        (called once, after the first compiled call)."""
        seconds = self.potential.first_compiled_call_s
        if plan is not None and seconds is not None:
            record_cost_s(compile_identity(model, plan), seconds)

    def record(self) -> RunRecord:
        """What metadata.json and the report read of this run (fastmace.provenance)."""
        return RunRecord(
            model=self.model, structures=self.structures, settings=self.settings,
            engine_settings=self.engine_settings, block_steps=self.block_steps,
            engine=self.engine, potential=self.potential, guard=self.guard,
            exchange=self.exchange, thermal_start=self.thermal_start, plan=self.plan,
            gate=self.gate, fallbacks=self.fallbacks, runner=self.runner,
            charges=self.charges, spins=self.spins, timings=self.timings, plot=self.plot,
            has_output=self.output is not None,
        )  # fmt: skip

    def _write_metadata(self, status: str, error: str | None = None) -> None:
        if self.output is not None:
            from fastmace.provenance import simulation_metadata

            self.output.write_metadata(simulation_metadata(self.record(), status, error))

    def _check_resume(self, output: str | Path | None, state: State) -> None:
        """Refuse a resume that changes the run's physics (fastmace.resuming), naming each
        difference; a directory without a restart is left to RunDirectory.resume's error."""
        restart = saved_restart(output)
        if restart is not None:
            check_resume(
                restart, self.physics, state.atomic_numbers.cpu().numpy(), output,
                describe=self.settings.ensemble.describe(),
            )  # fmt: skip
            fewer = too_few_steps(self.settings.steps, restart.step, output)
            if fewer is not None:
                raise ResumeError(fewer)

    def time_fs(self, step: int) -> float:
        """The simulated time at ``step``: a resumed run continues from its restart's time,
        with its own timestep."""
        return self.start_time_fs + (step - self.start_step) * self.settings.timestep_fs

    @property
    def neighbours(self) -> NeighbourList:
        """The neighbour list in use (it is replaced when it grows)."""
        return self.engine.force_field.neighbours

    def _neighbour_list(self, state: State, restart: Any) -> tuple[NeighbourList, Any]:
        engine = self.engine_settings
        if restart is None:
            neighbours = assembly.neighbour_list(state, self.potential, engine)
            return neighbours, neighbours.build(state)
        saved = restart.payload["neighbours"]
        kept = saved.get("list")  # restarts written before 2026-12-03 have no such entry
        neighbours = assembly.neighbour_list(
            state,
            self.potential,
            engine,
            capacity=int(saved["capacity"]),
            cutoff_capacity=int(kept["cutoff_capacity"]) if kept else None,
            bin_capacity=int(saved["bin_capacity"]),
            cell_margin=float(kept["cell_margin"]) if kept else DEFAULT_CELL_MARGIN,
        )
        if kept:
            neighbours.restore(kept)
        # Rebuilding from the reference positions gives exactly the interrupted run's edges.
        device = state.device
        reference = replace(
            state,
            positions=torch.as_tensor(saved["positions"], device=device),
            cell=torch.as_tensor(saved["cell"], device=device),
        )
        return neighbours, neighbours.build(reference)

    # -- restarts --------------------------------------------------------------------------

    def _payload(self, step: int) -> dict[str, Any]:
        md = self.engine.md
        positions, cell = self.engine.force_field.neighbours.reference()
        neighbours = self.engine.force_field.neighbours
        return {
            "step": step,
            "tensors": {name: t.detach().cpu().numpy() for name, t in tensors_of(md)},
            "generators": [bytes(g.get_state().cpu().numpy()) for g in generators_of(md)],
            "neighbours": {
                "positions": positions.detach().cpu().numpy(),
                "cell": cell.detach().cpu().numpy(),
                "capacity": neighbours.capacity,
                "bin_capacity": neighbours.bin_capacity,
                "search_every": self.engine.force_field.search_every,
                "list": neighbours.saved(),
            },
            "ensemble": self.settings.ensemble.describe(),
            "timestep_fs": self.settings.timestep_fs,
            "time_fs": self.time_fs(step),
            "physics": self.physics,
            "guard": self.guard.references() if self.guard is not None else None,
            "exchange": self.exchange.saved() if self.exchange is not None else None,
        }

    def _restore(self, md: Any, payload: dict[str, Any]) -> None:
        saved = payload["tensors"]
        for name, tensor in tensors_of(md):
            if name not in saved or tuple(saved[name].shape) != tuple(tensor.shape):
                raise ValueError(
                    f"the restart does not match this run ({name}); resume with the same "
                    "structures, model and ensemble"
                )
            tensor.copy_(torch.as_tensor(saved[name], device=tensor.device))
        generators, saved = generators_of(md), payload["generators"]
        if len(generators) != len(saved):
            raise ValueError(
                f"the restart holds {len(saved)} random streams and this run draws from "
                f"{len(generators)} (one per system since 2026-12-01; a batch used to share "
                "one): resume it with the FastMACE that wrote it, or start the run again"
            )
        for generator, state in zip(generators, saved, strict=True):
            generator.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))

    # -- the run ---------------------------------------------------------------------------

    def _write_outputs(self, step: int, final: bool) -> list[dict[str, Any]]:
        md = self.engine.md
        schedule = self.settings.schedule
        time_fs = self.time_fs(step)
        rows: list[dict[str, Any]] = []
        if schedule.thermo_due(step) or final:
            rows = thermo_rows(md, self.engine.force_field.stress_at, step, time_fs)
            if self.exchange is not None:  # which rung of the ladder each walker is at
                for row, rung in zip(rows, self.exchange.local_rungs(), strict=True):
                    row["rung"] = rung
            self.second_half.add(rows)
        if self.output is None:
            return rows
        writes_frames = self.output.trajectory_path is not None  # not with format "none"
        if writes_frames and (
            schedule.trajectory_due(step) or (final and schedule.trajectory_every)
        ):
            atoms = md.state.to_atoms()
            energies = md.energy.detach().cpu().numpy()
            forces = md.forces.detach().cpu().numpy()
            # By temperature: only where the whole ladder's walkers are here.
            whole = self.exchange is not None and self.exchange_group is None
            order = self.exchange.walkers().tolist() if whole else None
            self.output.write_frames(step, time_fs, atoms, energies, forces, walker_at_rung=order)
        if rows:
            self.output.write_thermo(rows)
        if schedule.restart_due(step) or final:
            self.output.write_restart(step, self._payload(step))
            self.last_restart = step
        return rows

    def _leave_exchange_group(self) -> None:
        if self.exchange_group is not None:
            self.exchange_group.leave()

    def _replica_exchange(
        self, md: Any, state: State, resume: bool, saved: dict[str, Any] | None
    ) -> ReplicaExchange | None:
        """The ladder and its swap statistics, when the run exchanges (host-side checks);
        ``saved``: the exchange's part of the restart being resumed, if any."""
        if not self.settings.exchange_every:
            if resume and saved is not None:
                raise ValueError(
                    "the restart was written by a replica-exchange run: resume it with the "
                    "same exchange_every"
                )
            return None
        if not self.settings.ensemble.descriptor.exchanges_temperatures or not isinstance(
            md, Thermostatted
        ):
            raise ValueError(
                f"replica exchange needs a thermostat at a fixed cell; the "
                f"{self.settings.ensemble.name} ensemble is not one (use "
                f"{' or '.join(exchanging())})"
            )
        numbers = [tuple(int(z) for z in state.atomic_numbers[state.system == s].tolist())
                   for s in range(state.n_systems)]  # fmt: skip
        if len(set(numbers)) != 1:
            raise ValueError(
                "replica exchange swaps temperatures between copies of one structure: give "
                "one structure with replicas=N and temperature_K=[one per replica]"
            )
        group = self.exchange_group
        generator = torch.Generator(device=state.device)
        # Apart from the systems' streams; a spread ladder's processes all seed it as one would.
        if group is None:
            generator.manual_seed(self.settings.seed + state.n_systems)
        else:
            generator.manual_seed(group.seed + len(group.ladder_K))
        saved = saved if resume else None
        if resume and saved is None:
            raise ValueError(
                "the restart was written by a run without replica exchange: resume it without "
                "exchange_every, or start a new run"
            )
        # A fresh run's walker s starts at rung s, so md.kT is the ladder; a resumed md.kT
        # holds each walker's present rung, and the ladder comes from the restart.
        if saved is not None:
            ladder = torch.as_tensor(saved["ladder_kT"])
        elif group is not None:  # the whole ladder, of which this process holds a part
            ladder = torch.tensor(group.ladder_K, dtype=torch.float64) * KB_EV_PER_K
        else:
            ladder = md.kT.clone()
        try:
            exchange = ReplicaExchange.start(
                ladder.to(md.kT), generator, every=self.settings.exchange_every,
                local=slice(None) if group is None else group.local,
                gather=None if group is None else group.join(state.device),
            )  # fmt: skip
        except ValueError as error:
            raise ValueError(
                f"{error}: give temperature_K as one value per replica, lowest first"
            ) from None
        if saved is not None:
            exchange.restore(saved)
        return exchange

    def _follow_schedule(self, first_step: int, steps: int) -> None:
        """Set the next block's targets from the temperature and pressure schedules: fills on
        the device, read by the captured block like any other input (no sync)."""
        md, settings = self.engine.md, self.settings
        if settings.temperature_schedule is not None:
            assert isinstance(md, Thermostatted)  # preflight checked the ensemble takes one
            temperature = settings.temperature_schedule.block_value(first_step, steps)
            md.kT.fill_(temperature * KB_EV_PER_K)
        if settings.pressure_schedule is not None:
            assert isinstance(md, Barostatted)
            pressure = settings.pressure_schedule.block_value(first_step, steps)
            md.pressure.fill_(pressure * EV_PER_A3_PER_GPA)

    def _time_first_step(self) -> None:
        """Start-up as the user sees it: to the end of the first block, from the request and
        from the process's start (the ``fastmace md`` command; Linux only)."""
        self.timings["to_first_step_s"] = time.perf_counter() - self.called
        since_start = seconds_since_process_start()
        if since_start is not None:
            self.timings["process_to_first_step_s"] = since_start

    def _path_text(self) -> str:
        """Which path runs, in a few words: backend, dtype, device, compile, tables, own
        kernels, graphs."""
        words = [f"{self.model.backend} {self.model.dtype} on {self.model.device}"]
        from fastmace.provenance import compiled_text, kernel_words

        words.append(compiled_text(self.potential))
        words += kernel_words(self.potential)
        launch = "CUDA graphs" if self.engine.capture else "no CUDA graphs"
        words.append(f"{launch}, K={self.block_steps}")
        return ", ".join(words)

    def run(self) -> MDResult:
        """Run to ``settings.steps`` (from the restart's step when resuming)."""
        settings = self.settings
        progress = Progress(
            settings.steps, settings.timestep_fs, start_step=self.start_step,
            stream=self.progress_stream,
        )  # fmt: skip
        self.second_half = SecondHalfMean(settings.steps, self.start_step)
        speed = _Speed()
        try:
            with inductor_workers(self.compile_workers):  # the fused step compiles here
                step, rows = self._run_blocks(progress, speed)
        except BaseException as error:
            self._give_up(error, progress)
            raise
        return self._finish(step, rows, speed, progress)

    def _run_blocks(self, progress: Progress, speed: _Speed) -> tuple[int, list[dict[str, Any]]]:
        """Every block to the last step, its outputs written when due: the last step and the
        last thermo rows written."""
        total, step = self.settings.steps, self.start_step
        rows: list[dict[str, Any]] = []
        # A resumed run's restart step is already in the files (cut back to it on resume).
        if step == 0 and self.output is not None and self.output.restart is None:
            tick = time.perf_counter()
            rows = self._write_outputs(0, final=total == 0)
            # Part of the start-up: step 0's thermo row evaluates the stress eagerly.
            self.timings["first_outputs_s"] = time.perf_counter() - tick
        while step < total:
            steps = min(self.block_steps, total - step)
            self._follow_schedule(step, steps)
            tick = time.perf_counter()
            try:
                self.engine.run_block(steps)  # the block's one host synchronisation
                if self.output is not None:
                    self.output.keep_alive()  # run.lock's heartbeat (fastmace.io.run_lock)
            except SimulationError as error:
                error.args = (f"{error.args[0]}. {self._resumable(error)}",)
                raise
            self._time_block(time.perf_counter() - tick, steps, speed, progress)
            step += steps
            rows = self._write_outputs(step, final=step == total) or rows
            progress.update(step)
        return step, rows

    def _time_block(self, elapsed: float, steps: int, speed: _Speed, progress: Progress) -> None:
        """Start-up (the first block, said once) and the steady speed: graph replays when
        capturing, else every block after the first; warm-up, capture and redone blocks count
        as set-up."""
        steady = (
            self.engine.last_launch == "replay" if self.engine.capture else speed.first_block_s > 0
        )
        if speed.first_block_s == 0.0:
            speed.first_block_s = elapsed
            self._time_first_step()
            startup = {**self.timings, "first_block_s": elapsed}
            compile_s = self.potential.first_compiled_call_s
            where = "setup_s" if self._compiled_in_setup else "first_block_s"
            progress.note(startup_line(self._path_text(), startup, compile_s, where))
            if not self._compiled_in_setup:  # this block held the first compiled call
                self._record_compile_cost(self.model, self.plan)
        elif steady:
            if not speed.steady_steps:
                self.timings["to_steady_s"] = time.perf_counter() - self.called
            speed.steady_s += elapsed
            speed.steady_steps += steps
        if self.engine.last_launch == "capture" and "capture_s" not in self.timings:
            self.timings["capture_s"] = elapsed

    def _give_up(self, error: BaseException, progress: Progress) -> None:
        """A run that stops early: what was written stays, the last restart is intact,
        metadata.json says why and run.lock goes; a full disk is said as such."""
        progress.close()
        self._leave_exchange_group()
        try:
            self._write_metadata("failed", f"{type(error).__name__}: {error}")
        except OSError:
            pass  # a full disk takes this write too: the error raised below says so
        finally:
            if self.output is not None:
                with contextlib.suppress(OSError):
                    self.output.close()
        if self.output is not None and is_disk_full(error):
            raise DiskFullError(self._disk_full_message(error)) from error

    def _finish(
        self, step: int, rows: list[dict[str, Any]], speed: _Speed, progress: Progress
    ) -> MDResult:
        """The result, its report, metadata.json and the plot of a run that reached its end."""
        settings = self.settings
        if not rows:
            rows = thermo_rows(
                self.engine.md, self.engine.force_field.stress_at, step, self.time_fs(step)
            )
            self.second_half.add(rows)
        self._leave_exchange_group()
        self.timings["first_block_s"] = speed.first_block_s
        rate = speed.steps_per_s(step - self.start_step)
        self.timings["steps_per_s"] = rate
        self.timings["ns_per_day"] = rate * settings.timestep_fs * 86400 * 1e-6
        progress.close(steady_steps_per_s=rate)
        result = MDResult(
            structures=self.engine.md.state.to_atoms(),
            steps=step,
            thermo=rows,
            output=self.output.directory.path if self.output else None,
            timings=dict(self.timings),
            model=self.model.name,
            ensemble=settings.ensemble.describe(),
            mean_temperature_K=self.second_half.means(),
            mean_from_step=self.second_half.from_step,
        )
        if self.output is not None and self.output.directory.thermo_path.is_file() and can_plot():
            self.plot = self.output.write_plot()  # without matplotlib the report says how
        from fastmace.provenance import run_report

        result.report = run_report(self.record(), result)
        if self.output is not None:
            self._write_metadata("finished")
            self.output.write_report(result.report)
            self.output.close()
        return result

    def _disk_full_message(self, error: BaseException) -> str:
        """What stopped the run, what is kept and how to go on, for a full disk or quota."""
        assert self.output is not None
        directory = self.output.directory
        kept = (
            f"its last restart, at step {self.last_restart}, is intact"
            if self.last_restart is not None
            else "it wrote no restart yet"
        )
        return (
            f"the disk holding {directory.path} is full ({error}): the run stopped and {kept}; "
            "metadata.json may still say 'running' (it could not be rewritten either). Free "
            f"space there, then resume (fastmace md ... --output {directory.path} --resume, or "
            "fm.md(..., resume=True))"
        )

    def _resumable(self, error: SimulationError) -> str:
        """Which restart a failed run can be resumed from: for SimulationError's message."""
        if self.output is None:
            return "This run has no output directory, so no restart to resume from"
        if self.last_restart is None:
            return "No restart was written, so there is nothing to resume from"
        directory = self.output.directory
        # Only the guard's bounds can be raised; a collapse or a non-finite state cannot.
        raised = (
            ", or, if the state is physical, with the guard's bound raised (--guard "
            "NAME=VALUE, fm.md(guard={...}); docs/md.md)"
            if isinstance(error, GuardError)
            else ""
        )
        return (
            f"The last good restart is {directory.restart_path} at step {self.last_restart} "
            f"(t = {self.time_fs(self.last_restart):g} fs): resume from it (fastmace md ... "
            f"--output {directory.path} --resume, or fm.md(..., resume=True)) with a smaller "
            f"timestep{raised}"
        )


def run_charges_and_spins(
    settings: RunSettings, model: LoadedModel, structures: Sequence[ase.Atoms]
) -> tuple[tuple[float, ...] | None, tuple[float, ...] | None]:
    """Each system's total charge and spin multiplicity for a long-range model: the settings'
    where given, else the structures' ``atoms.info``, else a neutral singlet (None, None for
    a local model, which is refused charges and spins it would not read)."""
    from fastmace.charges import charges_and_spins, refused_for_local_model
    from fastmace.vocabulary import LONG_RANGE_MODEL_TYPES

    if model.description.model_type not in LONG_RANGE_MODEL_TYPES:
        if settings.charge or settings.spin:
            raise refused_for_local_model(model.name, "charge" if settings.charge else "spin")
        return None, None
    return charges_and_spins(structures, settings.charge or None, settings.spin or None)


def _state_from_restart(state: State, payload: dict[str, Any]) -> State:
    """``state`` with the restart's positions, velocities and cells (checked to fit)."""
    saved = payload["tensors"]
    fields = {}
    for name in ("positions", "velocities", "cell"):
        array = saved.get(f"state.{name}")
        current = getattr(state, name)
        if array is None or tuple(array.shape) != tuple(current.shape):
            raise ValueError(
                f"the restart's {name} do not fit these structures; resume with the structures "
                "the run started from"
            )
        fields[name] = torch.as_tensor(array, dtype=current.dtype, device=current.device)
    return replace(state, **fields)


def compile_identity(model: LoadedModel, plan: Plan) -> CompileIdentity:
    """What compiling ``model`` for ``plan``'s systems depends on (runtime.compile_costs)."""
    machine = plan.availabilities
    return CompileIdentity(
        model_hash=model.description.content_hash,
        backend=model.backend,
        dtype=model.dtype,
        n_atoms=plan.workload.n_atoms,
        gpu=machine.gpu_name or "none",
        torch=machine.torch_version or "unknown",
    )
