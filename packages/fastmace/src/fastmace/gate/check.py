"""The gate: the plan's energy, forces and stress against mace-torch's float64 e3nn model.

``run_gate`` evaluates the loaded (converted) model through FastMACE's own potential on the
user's structure, asks a child process for mace-torch's reference on the same structure
(:mod:`fastmace.gate.child`, scratch in ``<cache>/gate-*``, removed when it ends),
and compares: the largest and RMS error of each quantity against tolerances for the plan's
dtype. ``fm.md(check="gate")`` and ``fastmace md --check`` use it, and fall back to the next
backend when it fails.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import ase
import ase.io
import numpy as np
import torch

from fastmace.charges import charges_and_spins
from fastmace.dynamics.neighbours import NeighbourList
from fastmace.dynamics.potential import Potential
from fastmace.dynamics.state import State
from fastmace.models.backends import precision_loosening, rounding_tolerances
from fastmace.models.load import LoadedModel
from fastmace.runtime.cache import scratch_dir
from fastmace.runtime.environment import child_environment
from fastmace.structures import chemical_formula
from fastmace.vocabulary import DEFAULT_MATMUL_PRECISION

CHILD_TIMEOUT_S = 3600


class GateError(RuntimeError):
    """No candidate plan passed the gate."""


@dataclass(frozen=True)
class QuantityError:
    """How far one quantity is from the reference."""

    max: float
    rms: float
    tolerance: float

    @property
    def passed(self) -> bool:
        return math.isfinite(self.max) and self.max <= self.tolerance


@dataclass(frozen=True)
class GateResult:
    """The comparison of one plan with the reference on one structure."""

    backend: str
    dtype: str
    device: str
    atoms: int
    formula: str
    structure: str
    """Which structure was checked: the run's own or a reduced one (gate/reduce.py)."""
    energy_eV: QuantityError
    forces_eV_per_A: QuantityError
    stress_eV_per_A3: QuantityError | None
    reference: str
    child_seconds: float
    matmul_precision: str = DEFAULT_MATMUL_PRECISION
    radial_table: bool = False
    own_kernels: tuple[str, ...] = ()
    """FastMACE's own kernels the checked potential ran ("convolution", "product basis")."""

    @property
    def passed(self) -> bool:
        quantities = [self.energy_eV, self.forces_eV_per_A, self.stress_eV_per_A3]
        return all(q.passed for q in quantities if q is not None)

    def summary(self) -> str:
        verdict = "passed" if self.passed else "FAILED"
        parts = [f"energy {self.energy_eV.max:.2e} (tol {self.energy_eV.tolerance:.1e}) eV"]
        parts.append(
            f"forces max {self.forces_eV_per_A.max:.2e} rms {self.forces_eV_per_A.rms:.1e} "
            f"(tol {self.forces_eV_per_A.tolerance:.1e}) eV/Å"
        )
        if self.stress_eV_per_A3 is not None:
            parts.append(
                f"stress {self.stress_eV_per_A3.max:.2e} "
                f"(tol {self.stress_eV_per_A3.tolerance:.1e}) eV/Å^3"
            )
        path = f"{self.backend} {self.dtype} on {self.device}"
        if self.own_kernels:
            path += f" with the own {' and '.join(self.own_kernels)}"
        return (
            f"gate {verdict}: {path} vs {self.reference}, "
            f"{self.formula} ({self.structure}): " + "; ".join(parts)
        )

    def to_dict(self) -> dict[str, Any]:
        document = asdict(self)
        document["passed"] = self.passed
        return document


def _plan_values(
    model: LoadedModel,
    atoms: ase.Atoms,
    matmul_precision: str,
    radial_table: bool,
    fused_convolution: bool = False,
    product_basis: bool = False,
) -> dict[str, Any]:
    """Energy, forces and stress from FastMACE's potential: what the engine will use (its own
    kernels, where the plan has them, as the run builds them: falling back when they fail a
    check), and which own kernels ran."""
    state = State.from_atoms(atoms, device=model.device)
    potential = Potential.from_loaded(
        model, state.atomic_numbers, matmul_precision=matmul_precision, radial_table=radial_table,
        fused_convolution=fused_convolution, fused_convolution_fallback=True,
        product_basis=product_basis, product_basis_fallback=True,
    )  # fmt: skip
    neighbours = NeighbourList(state, potential.r_max, 0.0)
    # The model's edges as the engine gives them (mirrored: radial weights once per pair),
    # from a list planned for this structure, so they fit.
    edges = neighbours.cutoff_edges(state, neighbours.build(state))
    periodic = bool(atoms.pbc.all())
    # A long-range model's charge and spin from the structure, as the reference reads them.
    charges, spins = charges_and_spins([atoms]) if potential.long_range else (None, None)
    out = potential(state, edges, compute_stress=periodic, charge=charges, spin=spins)
    values: dict[str, Any] = {
        "energy": np.array(float(out.energy.sum())),
        "forces": out.forces.detach().cpu().numpy(),
        "own_kernels": potential.own_kernels,
    }
    if periodic and out.stress is not None:
        values["stress"] = out.stress[0].detach().cpu().numpy()
    return values


def _reference_values(
    model: LoadedModel, atoms: ase.Atoms, environment: Mapping[str, str] | None = None
) -> tuple[dict, float]:
    """mace-torch's float64 e3nn result, computed in a child process.

    The child gets this process's environment plus ``environment`` (RunnerConfig.environment)
    and imports this same FastMACE, whatever its own path says.
    """
    scratch = scratch_dir("gate-")
    try:
        structure = scratch / "structure.traj"  # ASE's binary format: float64, lossless
        ase.io.write(structure, atoms, format="traj")
        request = {
            "model": model.origin,
            "structure": str(structure),
            "device": model.device,
            "output": str(scratch / "reference.npz"),
        }
        (scratch / "request.json").write_text(json.dumps(request), encoding="utf-8")
        started = time.perf_counter()
        child = subprocess.run(
            [sys.executable, "-m", "fastmace.gate.child", str(scratch / "request.json")],
            env=child_environment(environment), capture_output=True, text=True,
            timeout=CHILD_TIMEOUT_S, check=False,
        )  # fmt: skip
        seconds = time.perf_counter() - started
        if child.returncode != 0:
            raise GateError(
                f"the gate's reference process failed ({child.returncode}): "
                f"{child.stderr.strip()[-1500:]}"
            )
        with np.load(scratch / "reference.npz") as data:
            return {name: data[name] for name in data.files}, seconds
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _error(actual: np.ndarray, expected: np.ndarray, tolerance: float) -> QuantityError:
    difference = np.abs(np.asarray(actual, dtype=np.float64) - expected)
    return QuantityError(
        max=float(difference.max()), rms=float(np.sqrt(np.mean(difference**2))), tolerance=tolerance
    )


def run_gate(
    model: LoadedModel,
    atoms: ase.Atoms,
    environment: Mapping[str, str] | None = None,
    structure: str | None = None,
    matmul_precision: str = DEFAULT_MATMUL_PRECISION,
    radial_table: bool = False,
    *,
    fused_convolution: bool = False,
    product_basis: bool = False,
) -> GateResult:
    """Compare ``model`` (as the engine runs it) with mace-torch's float64 e3nn model.

    Tolerances are 1000 epsilon of the model dtype's rounding (models/backends.py); with
    ``matmul_precision="tf32"`` or ``"bf16"`` they are that mode's own: ``TF32_GATE_EPSILONS``
    TF32 epsilons or ``BF16_GATE_EPSILONS`` BF16 epsilons of the same scales (vocabulary.py;
    docs/md.md). With ``radial_table`` the
    potential reads its radial weights from tables (float32 models only), held to the
    float32 tolerances: the tables' own error is below 1e-6 of the weights. With
    ``fused_convolution`` or ``product_basis`` it runs FastMACE's own kernels as the run will
    (each dropped if it fails its own checks; ``own_kernels`` says which ran).

    ``environment``: extra variables for the reference child (RunnerConfig.environment).
    ``structure`` says what ``atoms`` is, for the record (default: the run's structure);
    :func:`fastmace.gate.reduce.reduced_structure` picks it for large runs.
    """
    reference, seconds = _reference_values(model, atoms, environment)
    plan = _plan_values(
        model, atoms, matmul_precision, radial_table, fused_convolution, product_basis
    )
    dtype = torch.float32 if model.dtype == "float32" else torch.float64
    energy_tol, force_tol = rounding_tolerances(
        dtype, float(reference["energy"]), reference["forces"], len(atoms)
    )
    loosening = precision_loosening(dtype, matmul_precision)  # the tier's own, or 1
    energy_tol, force_tol = energy_tol * loosening, force_tol * loosening
    epsilons = 1000 * torch.finfo(dtype).eps * loosening
    stress = None
    if "stress" in reference and "stress" in plan:
        scale = max(float(np.abs(reference["stress"]).max()), 1e-2)
        stress = _error(plan["stress"], reference["stress"], epsilons * scale)
    return GateResult(
        backend=model.backend,
        dtype=model.dtype,
        device=model.device,
        atoms=len(atoms),
        formula=chemical_formula(atoms),
        structure=structure or f"the run's structure ({len(atoms)} atoms)",
        energy_eV=_error(plan["energy"], reference["energy"], energy_tol),
        forces_eV_per_A=_error(plan["forces"], reference["forces"], force_tol),
        stress_eV_per_A3=stress,
        reference="mace-torch e3nn float64 (child process)",
        child_seconds=seconds,
        matmul_precision=matmul_precision,
        radial_table=radial_table,
        own_kernels=plan["own_kernels"],
    )
