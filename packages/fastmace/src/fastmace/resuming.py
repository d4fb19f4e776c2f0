"""Resuming a run: what a restart records of the run's physics, and the check that a resume
asks for the same physics.

The policy (docs/output.md): a resume continues the same dynamics, so the ensemble and its
settings, the model (its content, head and dtype), the seed and the structures' elements must
be those of the saved run, and a resume that changes any of them is refused, naming each
difference. The timestep may change (to continue a run the guard stopped with a smaller one):
time then continues from the restart's time. The run's length, output intervals and engine
settings (device, backend, graphs, block length, guard bounds) are not physics and may change.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from ase.data import chemical_symbols

from fastmace.io.restart import Restart, load_restart
from fastmace.vocabulary import GPA_PER_BAR

if TYPE_CHECKING:
    from fastmace.dynamics.ensembles import Ensemble
    from fastmace.models.load import LoadedModel
    from fastmace.protocol import TemperatureSchedule
    from fastmace.runs import RunSettings

RESTART_FILE = "restart.npz"


class ResumeError(ValueError):
    """A resume asks for other physics than the run it continues; the message names each
    setting that differs, with the saved and the requested value."""


def physics_record(
    settings: RunSettings,
    model: LoadedModel,
    n_systems: int,
    dispersion_functional: str | None = None,
    *,
    charges: Sequence[float] | None = None,
    spins: Sequence[float] | None = None,
) -> dict[str, Any]:
    """What a restart keeps of the run's physics, for :func:`check_resume`;
    ``dispersion_functional`` is the D3(BJ) parameter set the run resolved (None: no D3);
    ``charges`` and ``spins`` a long-range model's per-system values (None: a local model)."""
    return {
        "ensemble": settings.ensemble.name,
        "ensemble_settings": canonical_settings(settings.ensemble, n_systems),
        "model": model.name,
        "model_content_hash": model.description.content_hash,
        "head": model.head,
        "dtype": model.dtype,
        "seed": settings.seed,
        "temperature_schedule": _schedule(settings.temperature_schedule),
        "pressure_schedule": _schedule(settings.pressure_schedule),
        "dispersion": (
            None
            if dispersion_functional is None
            else f"{settings.dispersion} ({dispersion_functional})"
        ),
        "charge": None if charges is None else list(charges),
        "spin": None if spins is None else list(spins),
    }


def _schedule(schedule: TemperatureSchedule | None) -> dict[str, Any] | None:
    return None if schedule is None else schedule.to_dict()


def canonical_settings(ensemble: Ensemble, n_systems: int) -> dict[str, Any]:
    """The ensemble's settings as compared: defaults filled in, pressures in GPa, and every
    number given once or per system as one float per system."""
    settings = ensemble.resolved_settings()
    if "pressure_bar" in settings:
        settings["pressure_GPa"] = np.asarray(settings.pop("pressure_bar"), float) * GPA_PER_BAR
    described = ensemble.descriptor
    canonical: dict[str, Any] = {}
    for name, value in sorted(settings.items()):
        if name in described.setting_names and not described.setting(name).per_system:
            canonical[name] = value  # a word or a whole number, the same for every system
        else:
            canonical[name] = np.broadcast_to(np.asarray(value, float), (n_systems,)).tolist()
    return canonical


def saved_restart(output: str | Path | None) -> Restart | None:
    """The restart of run directory ``output``, or None when it has none (yet)."""
    if output is None:
        return None
    path = Path(output) / RESTART_FILE
    return load_restart(path) if path.is_file() else None


def saved_timestep_fs(output: str | Path | None) -> float | None:
    """The timestep the run in ``output`` last ran with, or None without a restart."""
    restart = saved_restart(output)
    if restart is None or "timestep_fs" not in restart.payload:
        return None
    return float(restart.payload["timestep_fs"])


def restart_time_fs(restart: Restart) -> float:
    """The simulated time at the restart's step (older restarts kept only the timestep)."""
    payload = restart.payload
    if "time_fs" in payload:
        return float(payload["time_fs"])
    return restart.step * float(payload.get("timestep_fs", 1.0))


def too_few_steps(steps: int, restart_step: int, output: str | Path) -> str | None:
    """Why a resume to ``steps`` cannot continue the restart at ``restart_step`` in run
    directory ``output``, or None when it can.

    ``steps`` counts the whole run from step 0, not the steps to add: a run at step 400
    resumed with ``steps=200`` has nothing to do, and its files would be cut back for it.
    """
    if steps >= restart_step:
        return None
    return (
        f"cannot resume {output} with steps={steps}: its restart is at step {restart_step}, "
        f"and steps counts the whole run from step 0, not the steps to add. Give steps >= "
        f"{restart_step} (e.g. {restart_step + steps} to run {steps} more)"
    )


def check_resume(
    restart: Restart,
    requested: dict[str, Any],
    atomic_numbers: np.ndarray,
    output: str | Path,
    *,
    describe: str,
) -> None:
    """Raise ResumeError when ``requested`` (a :func:`physics_record`) or the structures'
    ``atomic_numbers`` differ from what ``restart`` saved. ``describe`` is the requested
    ensemble's one-line description, compared with restarts that predate the record."""
    payload = restart.payload
    differences = _structure_difference(payload, np.asarray(atomic_numbers))
    saved = payload.get("physics")
    if saved is None:  # an older restart: only the ensemble's description was kept
        if payload.get("ensemble") not in (None, describe):
            differences.append(f"ensemble: saved {payload['ensemble']}, requested {describe}")
    else:
        differences += _differences(saved, requested)
    if differences:
        raise ResumeError(
            f"cannot resume {output}: a resume continues the same physics, and this one would "
            f"change {'; '.join(differences)}. Resume with the saved settings (only the "
            "timestep, the number of steps, the output intervals and engine settings such as "
            "the device, backend or guard may change), or start a new run from a frame of its "
            "trajectory (frames keep the velocities) to change them"
        )


def _differences(saved: dict[str, Any], requested: dict[str, Any]) -> list[str]:
    found = []
    if saved.get("ensemble") != requested["ensemble"]:
        found.append(f"ensemble: saved {saved.get('ensemble')}, requested {requested['ensemble']}")
    else:
        old, new = saved.get("ensemble_settings", {}), requested["ensemble_settings"]
        for name in sorted(set(old) | set(new)):
            if not _same(old.get(name), new.get(name)):
                found.append(
                    f"{name}: saved {_show(old.get(name))}, requested {_show(new.get(name))}"
                )
    if saved.get("model_content_hash") != requested["model_content_hash"]:
        found.append(
            f"model: saved {saved.get('model')} ({str(saved.get('model_content_hash'))[:12]}), "
            f"requested {requested['model']} ({requested['model_content_hash'][:12]})"
        )
    names = (
        "head", "dtype", "seed", "temperature_schedule", "pressure_schedule", "dispersion",
        "charge", "spin",
    )  # fmt: skip
    for name in names:
        if saved.get(name) != requested.get(name):  # older restarts lack the newer: None
            found.append(f"{name}: saved {saved.get(name)}, requested {requested.get(name)}")
    return found


def _structure_difference(payload: dict[str, Any], requested: np.ndarray) -> list[str]:
    saved = payload.get("tensors", {}).get("state.atomic_numbers")
    if saved is None:
        return []
    saved = np.asarray(saved)
    if saved.shape != requested.shape:
        return [f"structures: saved {saved.size} atoms, requested {requested.size}"]
    differ = np.flatnonzero(saved != requested)
    if not differ.size:
        return []
    atom = int(differ[0])
    return [
        f"structures: the elements differ at {differ.size} atoms (first atom {atom}: saved "
        f"{chemical_symbols[int(saved[atom])]}, requested {chemical_symbols[int(requested[atom])]})"
    ]


def _same(saved: Any, requested: Any) -> bool:
    if isinstance(saved, list) and isinstance(requested, list) and len(saved) == len(requested):
        return all(math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-300)
                   for a, b in zip(saved, requested, strict=True))  # fmt: skip
    return saved == requested


def _show(value: Any) -> str:
    if value is None:
        return "not set"
    if isinstance(value, list) and len(set(value)) == 1:
        return f"{value[0]:g}"  # the same for every system
    if isinstance(value, list):
        return "[" + ", ".join(f"{v:g}" for v in value) + "]"
    return str(value)
