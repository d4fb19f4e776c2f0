"""``Relaxation``: FIRE on the engine, for a batch of structures, each to its own convergence.

It ties a loaded model, the structures and :class:`~fastmace.dynamics.relax.FireSettings` to
the same engine MD uses (neighbour list, potential, blocks of K iterations captured as CUDA
graphs) and, with an output directory, writes the relaxed structures, a log and the record of
what ran (docs/relax.md).
"""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import ase
import ase.io
import numpy as np
from ase.calculators.singlepoint import SinglePointCalculator

from fastmace import assembly
from fastmace.charges import PerSystemValue
from fastmace.dynamics.checks import check_structures
from fastmace.dynamics.compile_workers import inductor_workers
from fastmace.dynamics.dispersion import model_dispersion_functional
from fastmace.dynamics.engine import Engine
from fastmace.dynamics.integrators.common import cell_volume
from fastmace.dynamics.relax import FireSettings, FireState, fire_init, fire_step
from fastmace.dynamics.state import State
from fastmace.models.load import LoadedModel
from fastmace.planner import EngineSettings, Plan, engine_settings_for
from fastmace.runtime.atomic import atomic_write_text
from fastmace.structures import chemical_formula

# The files of a relaxation's output directory.
RELAXED = "relaxed.extxyz"
LOG = "relax.csv"
METADATA = "metadata.json"
REPORT = "report.txt"
LOG_COLUMNS = ("iteration", "system", "energy_eV", "enthalpy_eV", "fmax_eV_per_A", "volume_A3",
               "converged")  # fmt: skip
_PROGRESS_EVERY_S = 5.0


@dataclass
class RelaxResult:
    """What a relaxation returns: the relaxed structures and, per system, how it ended."""

    structures: list[ase.Atoms]
    """Relaxed, each with a calculator holding its energy, forces (and stress with a cell)."""
    energies_eV: list[float]
    enthalpies_eV: list[float]
    """Energy plus pressure times volume (the energy itself at zero pressure)."""
    fmax_eV_per_A: list[float]
    """The largest generalised force at the end (with a cell, the cell's rows count too)."""
    iterations: list[int]
    converged: list[bool]
    output: Path | None = None
    timings: dict[str, float] = field(default_factory=dict)
    report: str = ""

    def summary(self) -> str:
        """One line per system: converged or not, iterations, energy and the largest force."""
        lines = []
        for index, atoms in enumerate(self.structures):
            state = "converged" if self.converged[index] else "NOT converged"
            lines.append(
                f"system {index} ({chemical_formula(atoms)}): {state} after "
                f"{self.iterations[index]} iterations, E = {self.energies_eV[index]:.6f} eV, "
                f"fmax = {self.fmax_eV_per_A[index]:.4f} eV/Å"
            )
        return "\n".join(lines)


class Relaxation:
    """Relax ``structures`` with ``model`` by FIRE, for at most ``max_steps`` iterations."""

    def __init__(
        self,
        model: LoadedModel,
        structures: Sequence[ase.Atoms],
        settings: FireSettings,
        *,
        max_steps: int = 1000,
        engine: EngineSettings | None = None,
        plan: Plan | None = None,
        output: str | Path | None = None,
        progress: TextIO | None = None,
        dispersion: str | None = None,
        dispersion_functional: str | None = None,
        charge: PerSystemValue = None,
        spin: PerSystemValue = None,
    ) -> None:
        """``charge`` and ``spin``: each system's total charge and spin multiplicity for a
        long-range model (MACE-POLAR-1), as for fm.md (default: ``atoms.info``). ``plan``:
        the run's plan (fm.relax), whose engine settings and reasons the relaxation uses;
        else ``engine``, or the model's own device and backend."""
        started = time.perf_counter()
        if isinstance(max_steps, bool) or not (isinstance(max_steps, int) and max_steps >= 0):
            raise ValueError(f"max_steps must be a whole number >= 0, got {max_steps!r}")
        check_structures(structures, model.description.atomic_numbers)
        if settings.cell and not all(atoms.pbc.all() for atoms in structures):
            raise ValueError(
                "cell=True relaxes the cell, which needs every structure periodic in x, y and "
                "z; relax the positions alone (cell=False) for molecules and slabs"
            )
        self.charges, self.spins = _charges_and_spins(model, structures, settings, charge, spin)
        # Before anything is created: a dispersion the model or structures cannot take.
        self.dispersion_functional = model_dispersion_functional(
            dispersion, dispersion_functional, model, structures
        )
        self.model, self.settings, self.max_steps = model, settings, max_steps
        self.plan = plan
        # One compile worker where the plan expects Inductor's cache to hold the compilation.
        self.compile_workers = plan.compile_workers if plan is not None else None
        own = EngineSettings(device=model.device, backend=model.backend)
        self.engine_settings = engine_settings_for("Relaxation", engine, plan, own)
        self.structures = [atoms.copy() for atoms in structures]
        self.progress = progress
        self.output = _claim_output(Path(output)) if output is not None else None
        state = State.from_atoms(self.structures, device=model.device)
        self.potential = assembly.potential(model, state.atomic_numbers, self.engine_settings)
        engine = self.engine_settings
        neighbours = assembly.neighbour_list(state, self.potential, engine)
        # D3(BJ) on a list of its own, as in MD: the relaxed structure is the minimum of the
        # same force field the MD run that follows will use.
        self.dispersion = assembly.dispersion(
            state, self.dispersion_functional, engine, three_body=dispersion == "d3bj-atm"
        )
        force_field = assembly.force_field(
            state, self.potential, neighbours, stress=settings.cell, dispersion=self.dispersion,
            charges=self.charges, spins=self.spins,
        )  # fmt: skip
        with inductor_workers(self.compile_workers):  # the first compiled call
            md = assembly.first_forces(
                lambda: fire_init(state, force_field, settings, history=engine.block_steps),
                force_field,
                state,
            )
        self.engine = Engine(
            md, fire_step, force_field, block_steps=engine.block_steps, capture=engine.graphs
        )
        self.log_rows: list[dict[str, Any]] = []
        self._logged_steps = 0  # the batch's steps whose rows are in log_rows
        self._logged_iterations = [-1] * len(self.structures)  # each system's last row
        self.timings = {"setup_s": time.perf_counter() - started}

    @property
    def md(self) -> FireState:
        return self.engine.md  # type: ignore[return-value]

    def run(self) -> RelaxResult:
        """Iterate in blocks until every system has converged or ``max_steps`` are done."""
        started = time.perf_counter()
        last_said = started
        status = self._log_block()
        said = False  # whether the line for the latest block has been shown
        while not all(status["converged"]) and self.engine.steps_done < self.max_steps:
            with inductor_workers(self.compile_workers):  # the FIRE step compiles in the first
                self.engine.run_block(min(self.engine.block_steps,
                                          self.max_steps - self.engine.steps_done))  # fmt: skip
            status = self._log_block()
            said = False
            if self.progress is not None and time.perf_counter() - last_said >= _PROGRESS_EVERY_S:
                self._say(status)
                last_said, said = time.perf_counter(), True
        self.timings["relax_s"] = time.perf_counter() - started
        result = self._result(status)
        if self.progress is not None and not said:  # the last block's line, once
            self._say(status)
        if self.output is not None:
            self._write(result)
        return result

    # -- what the host reads once per block --------------------------------------------------

    def _log_block(self) -> dict[str, list]:
        md = self.md
        columns = (md.energy, md.enthalpy(), md.fmax, cell_volume(md.state.cell),
                   md.converged().to(md.energy.dtype), md.iterations)  # fmt: skip
        table = np.stack([column.detach().double().cpu().numpy() for column in columns])
        status = {
            "energy": table[0].tolist(),
            "enthalpy": table[1].tolist(),
            "fmax": table[2].tolist(),
            "volume": table[3].tolist(),
            "converged": [bool(value) for value in table[4]],
            "iterations": [int(value) for value in table[5]],
        }
        # The block's steps, from the history ring (the start: the current values).
        done = self.engine.steps_done
        if done == self._logged_steps:
            rows = [table.T]  # the columns above, in HISTORY_COLUMNS' order
        else:
            history = md.history.detach().double().cpu().numpy()
            slots = [step % history.shape[0] for step in range(self._logged_steps, done)]
            rows = [history[slot] for slot in slots]
        self._logged_steps = done
        for row in rows:
            for system, values in enumerate(row):
                iteration = int(values[5])
                if iteration <= self._logged_iterations[system]:
                    continue  # a converged system holds still: no new row
                self._logged_iterations[system] = iteration
                self.log_rows.append({
                    "iteration": iteration,
                    "system": system,
                    "energy_eV": float(values[0]),
                    "enthalpy_eV": float(values[1]),
                    "fmax_eV_per_A": float(values[2]),
                    "volume_A3": float(values[3]),
                    "converged": int(values[4]),
                })  # fmt: skip
        return status

    def _say(self, status: dict[str, list]) -> None:
        done = sum(status["converged"])
        assert self.progress is not None
        self.progress.write(
            f"relax: iteration {self.engine.steps_done:,}/{self.max_steps:,}, largest force "
            f"{max(status['fmax']):.4f} eV/Å, {done} of {len(status['fmax'])} converged\n"
        )
        self.progress.flush()

    # -- the result ---------------------------------------------------------------------------

    def _result(self, status: dict[str, list]) -> RelaxResult:
        md = self.md
        state = md.state
        positions = state.positions.detach().cpu().numpy()
        forces = md.forces.detach().double().cpu().numpy()
        cells = state.cell.detach().cpu().numpy()
        stress = None if md.stress is None else md.stress.detach().double().cpu().numpy()
        system = state.system.cpu().numpy()
        structures = []
        for index, original in enumerate(self.structures):
            rows = system == index
            atoms = original.copy()
            atoms.set_cell(cells[index], scale_atoms=False)
            atoms.set_positions(positions[rows])
            atoms.set_velocities(np.zeros((len(atoms), 3)))
            results = {"energy": status["energy"][index], "forces": forces[rows]}
            if stress is not None:
                results["stress"] = stress[index]
            atoms.calc = SinglePointCalculator(atoms, **results)
            structures.append(atoms)
        return RelaxResult(
            structures=structures,
            energies_eV=status["energy"],
            enthalpies_eV=status["enthalpy"],
            fmax_eV_per_A=status["fmax"],
            iterations=status["iterations"],
            converged=status["converged"],
            output=self.output,
            timings=dict(self.timings),
        )

    def report(self, result: RelaxResult) -> str:
        """One screen: model, settings, engine, each system's outcome, output."""
        from fastmace.provenance import planned_backend_reason

        settings = self.settings
        target = (
            f"positions and cell at {settings.pressure_GPa:g} GPa" if settings.cell
            else "positions"
        )  # fmt: skip
        lines = [
            "FastMACE relaxation report",
            f"model:     {self.model.summary()}",
            f"backend:   {self.model.backend}: {planned_backend_reason(self.model, self.plan)}",
            f"relax:     FIRE on the {target}, fmax {settings.fmax:g} eV/Å, at most "
            f"{self.max_steps} iterations, largest step {settings.max_step_A:g} Å",
            f"dispersion: {self._dispersion_summary()}",
            f"engine:    {self.engine.block_steps} iterations per launch, "
            f"{'CUDA graphs' if self.engine.capture else 'no CUDA graphs'}, list regrown "
            f"{self.engine.regrowths}x",
            *result.summary().splitlines(),
            f"time:      setup {result.timings['setup_s']:.1f} s, relaxation "
            f"{result.timings['relax_s']:.1f} s",
            f"output:    {result.output if result.output else 'none (no directory)'}",
            f"licence:   the weights are under {self.model.licence}",
        ]
        return "\n".join(lines) + "\n"

    def _dispersion_summary(self) -> str:
        if self.dispersion is None:
            return "none"
        return (
            f"D3(BJ), {self.dispersion_functional} parameters, cutoff "
            f"{self.dispersion.d3.cutoff:.2f} Å, "
            f"{'two- and three-body' if self.dispersion.d3.three_body else 'two-body'}"
        )

    def _write(self, result: RelaxResult) -> None:
        assert self.output is not None
        frames = io.StringIO()
        ase.io.write(frames, result.structures, format="extxyz")
        atomic_write_text(self.output / RELAXED, frames.getvalue())
        table = io.StringIO()
        writer = csv.DictWriter(table, fieldnames=LOG_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.log_rows)
        atomic_write_text(self.output / LOG, table.getvalue())
        atomic_write_text(self.output / METADATA, json.dumps(self.metadata(result), indent=1))
        result.report = self.report(result)
        atomic_write_text(self.output / REPORT, result.report)

    def metadata(self, result: RelaxResult) -> dict[str, Any]:
        """The relaxation's ``metadata.json``: software, device, model, structures, settings,
        engine and each system's outcome."""
        from fastmace.provenance import (
            device_record,
            environment_record,
            model_record,
            planned_backend_reason,
            software,
            structures_record,
        )

        return {
            "kind": "relaxation",
            "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "status": "finished",
            "software": software(),
            "device": device_record(self.model.device),
            "model": model_record(self.model, planned_backend_reason(self.model, self.plan)),
            "structures": structures_record(self.structures, self.charges, self.spins),
            "settings": {"fire": vars(self.settings), "max_steps": self.max_steps},
            "dispersion": self.dispersion.record() if self.dispersion is not None else None,
            "engine": {
                "block_steps": self.engine.block_steps,
                "capture": self.engine.capture,
                "compile_workers": self.compile_workers,
                "regrowths": self.engine.regrowths,
                "settings": self.engine_settings.to_dict(),
            },
            "environment": environment_record(),
            "results": {
                "energies_eV": result.energies_eV,
                "enthalpies_eV": result.enthalpies_eV,
                "fmax_eV_per_A": result.fmax_eV_per_A,
                "iterations": result.iterations,
                "converged": result.converged,
            },
            "timings": result.timings,
        }


def _claim_output(path: Path) -> Path:
    """The output directory, made now; one that already holds files is never written over."""
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise FileExistsError(
            f"output directory {path} already exists and is not empty; relaxation output is "
            "never written over: choose another directory"
        )
    path.mkdir(parents=True, exist_ok=True)
    return path


def refused_cell_relaxation(model: str, model_type: str | None) -> ValueError:
    """Why a long-range model does not relax a cell, and what to do instead."""
    return ValueError(
        f"{model} is a {model_type} (MACE-POLAR-1's long-range model), whose stress (as "
        "mace-torch computes it) leaves out the long-range part (docs/validation/polar.md), so "
        "cell=True would relax the cell on the wrong stress: relax the positions alone "
        "(cell=False), or the cell with another model"
    )


def _charges_and_spins(
    model: LoadedModel,
    structures: Sequence[ase.Atoms],
    settings: FireSettings,
    charge: PerSystemValue,
    spin: PerSystemValue,
) -> tuple[tuple[float, ...] | None, tuple[float, ...] | None]:
    """Each system's charge and spin for a long-range model, which relaxes positions only;
    (None, None) for a local model, which is refused any."""
    from fastmace.batching import check_open_apart
    from fastmace.charges import charges_and_spins, refused_for_local_model
    from fastmace.vocabulary import LONG_RANGE_MODEL_TYPES

    model_type = model.description.model_type
    if model_type not in LONG_RANGE_MODEL_TYPES:
        if charge is not None or spin is not None:
            raise refused_for_local_model(model.name, "charge" if charge is not None else "spin")
        return None, None
    if settings.cell:
        raise refused_cell_relaxation(model.name, model_type)
    check_open_apart([atoms.pbc for atoms in structures])
    return charges_and_spins(structures, charge, spin)
