"""Fallback: if a plan's backend fails the gate, try the next one, recording every failure.

The order is fastmace.vocabulary's CUDA_BACKEND_ORDER (fastest first: cuEq -> hybrid ->
e3nn); a candidate is only tried when it is available on the device. A run never silently
uses a backend that failed: the failures go into the report and metadata.json, and if
nothing passes, :class:`GateError` lists them all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import ase

from fastmace.gate.check import GateError, GateResult, run_gate
from fastmace.models.backends import availability
from fastmace.models.load import LoadedModel, load
from fastmace.vocabulary import CUDA_BACKEND_ORDER, DEFAULT_MATMUL_PRECISION


@dataclass
class GatedModel:
    """The model that passed, its gate result, and the candidates that failed before it."""

    model: LoadedModel
    gate: GateResult
    failures: list[dict[str, Any]] = field(default_factory=list)


def _later_candidates(backend: str, device: str) -> list[str]:
    start = CUDA_BACKEND_ORDER.index(backend) + 1 if backend in CUDA_BACKEND_ORDER else 0
    return [b for b in CUDA_BACKEND_ORDER[start:] if availability(b, device).available]


def _reload(model: LoadedModel, backend: str) -> LoadedModel:
    origin = model.origin
    return load(
        origin["model"], head=origin.get("head"), checkpoint=origin.get("checkpoint"),
        sha256=origin.get("sha256"), trusted=bool(origin.get("trusted", False)),
        seed=int(origin.get("seed", 0)), backend=backend, device=model.device,
        dtype=model.dtype,
    )  # fmt: skip


def gate_with_fallback(
    model: LoadedModel,
    atoms: ase.Atoms,
    candidates: list[str] | None = None,
    environment: Mapping[str, str] | None = None,
    structure: str | None = None,
    matmul_precision: str = DEFAULT_MATMUL_PRECISION,
    radial_table: bool = False,
    *,
    fused_convolution: bool = False,
    product_basis: bool = False,
) -> GatedModel:
    """The first of ``candidates`` (default: ``model``'s backend, then the slower available
    ones) that passes the gate; ``model`` is the first candidate, already loaded.
    ``environment`` goes to the gate's reference child (RunnerConfig.environment);
    ``structure`` says what ``atoms`` is and ``matmul_precision`` how the run's matrix
    products go, ``radial_table`` whether radial weights come from tables,
    ``fused_convolution`` and ``product_basis`` whether FastMACE's own kernels run (see
    :func:`run_gate`)."""
    failures: list[dict[str, Any]] = []
    if candidates is None:
        candidates = [model.backend, *_later_candidates(model.backend, model.device)]
    for backend in candidates:
        try:
            current = model if backend == model.backend else _reload(model, backend)
            result = run_gate(
                current, atoms, environment, structure, matmul_precision, radial_table,
                fused_convolution=fused_convolution, product_basis=product_basis,
            )  # fmt: skip
        except Exception as error:  # a candidate that cannot even be built or checked
            failures.append({"backend": backend, "reason": f"{type(error).__name__}: {error}"})
            continue
        if result.passed:
            return GatedModel(current, result, failures)
        failures.append({"backend": backend, "reason": result.summary()})
    raise GateError(
        "no backend passed the gate against mace-torch's float64 e3nn model: "
        + "; ".join(f"{f['backend']}: {f['reason']}" for f in failures)
    )
