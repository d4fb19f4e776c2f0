"""The run's plot: temperature, energies, pressure and volume against time, from thermo.csv.

The targets the run asked for (temperature, pressure, or their schedules over time) are drawn
as dashed lines, read from metadata.json beside thermo.csv; a thermostat's conserved energy is
drawn with the total energy, which it should hold steady where the total does not.

matplotlib is optional (``pip install "fastmace[plot]"``). The figure is drawn on its own Agg
canvas, so neither pyplot's global state nor the user's chosen backend is touched.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
from pathlib import Path
from typing import Any

from fastmace.runtime.atomic import atomic_write
from fastmace.vocabulary import GPA_PER_BAR

PLOT_FILE = "thermo.png"
RELAX_PLOT_FILE = "relax.png"
# (relax.csv column, panel title, logarithmic): a relaxation's panels, against the iteration.
RELAX_PANELS = (
    ("energy_eV", "energy (eV)", False),
    ("fmax_eV_per_A", "largest force (eV/Å)", True),
    ("enthalpy_eV", "enthalpy (eV)", False),
    ("volume_A3", "volume (Å³)", False),
)
INSTALL_HINT = 'pip install "fastmace[plot]"'
# (thermo.csv column, panel title), one panel each, in reading order on a 2-column grid.
PANELS = (
    ("temperature_K", "temperature (K)"),
    ("pressure_GPa", "pressure (GPa)"),
    ("potential_energy_eV", "potential energy (eV)"),
    ("volume_A3", "volume (Å³)"),
    ("kinetic_energy_eV", "kinetic energy (eV)"),
    ("total_energy_eV", "total energy (eV); dashed: conserved"),
)
CONSERVED = "conserved_energy_eV"  # drawn dashed in the total energy's panel


class PlotUnavailableError(ImportError):
    """matplotlib is not installed, so there is no plot."""


def can_plot() -> bool:
    """Whether matplotlib is installed (looked up, not imported)."""
    return importlib.util.find_spec("matplotlib") is not None


def read_series(thermo_csv: Path) -> dict[int, dict[str, list[float]]]:
    """Each system's columns of ``thermo_csv``: {system: {column: values}}, time in ps.

    An empty cell (a value a row does not give) reads as NaN. FileNotFoundError names the
    file; ValueError says what is missing.
    """
    thermo_csv = Path(thermo_csv)
    try:
        with thermo_csv.open(encoding="utf-8", newline="") as stream:
            rows = list(csv.DictReader(stream))
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{thermo_csv} not found: a run writes it when thermo_every > 0 (--thermo-every)"
        ) from None
    if not rows or "time_fs" not in rows[0]:
        raise ValueError(f"{thermo_csv} has no thermo rows to plot")
    series: dict[int, dict[str, list[float]]] = {}
    for row in rows:
        system = series.setdefault(int(row.get("system") or 0), {"time_ps": []})
        system["time_ps"].append(_number(row["time_fs"]) / 1000.0)
        for column in (*(column for column, _ in PANELS), CONSERVED):
            system.setdefault(column, []).append(_number(row.get(column)))
    return series


def run_settings(metadata_json: Path) -> dict[str, Any]:
    """The ``settings`` of a run's metadata.json; empty when there is none to read (a
    thermo.csv copied alone: the plot then has no targets)."""
    try:
        settings = json.loads(Path(metadata_json).read_text(encoding="utf-8"))["settings"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return settings if isinstance(settings, dict) else {}


def run_targets(settings: dict[str, Any]) -> dict[str, Any]:
    """What the run asked for: {"temperature_K": a number, a list per system or a
    schedule's points, "pressure_GPa": likewise}; empty when unknown."""
    ensemble = settings.get("ensemble_settings") or {}
    targets: dict[str, Any] = {}
    schedule = settings.get("temperature_schedule")
    if schedule:
        targets["temperature_K"] = schedule
    elif ensemble.get("temperature_K") is not None:
        targets["temperature_K"] = ensemble["temperature_K"]
    schedule = settings.get("pressure_schedule")
    if schedule:
        targets["pressure_GPa"] = schedule
    elif ensemble.get("pressure_GPa") is not None:
        targets["pressure_GPa"] = ensemble["pressure_GPa"]
    elif ensemble.get("pressure_bar") is not None:
        bar = ensemble["pressure_bar"]
        targets["pressure_GPa"] = (
            [b * GPA_PER_BAR for b in bar] if isinstance(bar, list) else bar * GPA_PER_BAR
        )
    return targets


def _draw_target(ax: Any, target: Any, timestep_fs: float | None) -> None:
    """A dashed line at each target value, or along a schedule's points (needs the
    timestep, to put its steps on the time axis)."""
    style = {"color": "black", "linestyle": "--", "linewidth": 1, "label": "target"}
    if isinstance(target, dict):
        if timestep_fs is None:
            return
        points = target.get("points") or []
        times = [step * timestep_fs / 1000.0 for step, _ in points]
        values = [value for _, value in points]
        if target.get("mode") == "step":
            ax.step(times, values, where="post", **style)
        else:
            ax.plot(times, values, **style)
        return
    for value in sorted(set(target if isinstance(target, list) else [target])):
        ax.axhline(value, **style)
        style["label"] = None


def _number(text: str | None) -> float:
    return float(text) if text else math.nan


def plot_thermo(thermo_csv: Path, png: Path) -> Path:
    """Draw ``thermo_csv`` into ``png`` (replaced atomically), one line per system; ``png``.

    PlotUnavailableError without matplotlib; FileNotFoundError or ValueError (naming the
    file) without thermo rows.
    """
    if not can_plot():
        raise PlotUnavailableError(f"plotting needs matplotlib: {INSTALL_HINT}")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    series = read_series(thermo_csv)
    settings = run_settings(Path(thermo_csv).parent / "metadata.json")
    targets = run_targets(settings)
    timestep_fs = settings.get("timestep_fs")
    figure = Figure(figsize=(10, 8), layout="constrained")
    FigureCanvasAgg(figure)  # the figure's own canvas: no pyplot, no global backend
    axes = figure.subplots(3, 2, sharex=True).ravel()
    for ax, (column, title) in zip(axes, PANELS, strict=True):
        for system, values in series.items():
            label = f"system {system}" if len(series) > 1 else None
            line = ax.plot(values["time_ps"], values[column], label=label, linewidth=1)[0]
            if column == "total_energy_eV" and not all(map(math.isnan, values[CONSERVED])):
                ax.plot(values["time_ps"], values[CONSERVED], linewidth=1, linestyle="--",
                        color=line.get_color())  # fmt: skip
        if all(math.isnan(v) for values in series.values() for v in values[column]):
            ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes)
        elif column in targets:
            _draw_target(ax, targets[column], timestep_fs)
        ax.set_title(title, fontsize="medium")
    for ax in axes[-2:]:
        ax.set_xlabel("time (ps)")
    if len(series) <= 10 and (len(series) > 1 or targets):  # more would hide the lines
        axes[0].legend(fontsize="small")
    figure.suptitle(str(Path(thermo_csv).resolve().parent.name))
    png = Path(png)
    atomic_write(png, lambda stream: figure.savefig(stream, format="png", dpi=100))
    return png


def read_relaxation(relax_csv: Path) -> dict[int, dict[str, list[float]]]:
    """Each system's columns of a relaxation's ``relax_csv``: {system: {column: values}}."""
    relax_csv = Path(relax_csv)
    with relax_csv.open(encoding="utf-8", newline="") as stream:
        rows = list(csv.DictReader(stream))
    if not rows or "iteration" not in rows[0]:
        raise ValueError(f"{relax_csv} has no relaxation rows to plot")
    series: dict[int, dict[str, list[float]]] = {}
    for row in rows:
        system = series.setdefault(int(row.get("system") or 0), {"iteration": []})
        system["iteration"].append(_number(row["iteration"]))
        for column, _, _ in RELAX_PANELS:
            system.setdefault(column, []).append(_number(row.get(column)))
    return series


def plot_relaxation(relax_csv: Path, png: Path) -> Path:
    """Draw a relaxation's ``relax_csv`` (energy, largest force, enthalpy and volume against
    the iteration, one line per system) into ``png``, replaced atomically; ``png``."""
    if not can_plot():
        raise PlotUnavailableError(f"plotting needs matplotlib: {INSTALL_HINT}")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    series = read_relaxation(relax_csv)
    figure = Figure(figsize=(10, 6), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(2, 2, sharex=True).ravel()
    for ax, (column, title, logarithmic) in zip(axes, RELAX_PANELS, strict=True):
        for system, values in series.items():
            label = f"system {system}" if len(series) > 1 else None
            ax.plot(values["iteration"], values[column], label=label, linewidth=1, marker=".")
        positive = [v for values in series.values() for v in values[column] if v > 0]
        if logarithmic and positive:
            ax.set_yscale("log")
        ax.set_title(title, fontsize="medium")
    for ax in axes[-2:]:
        ax.set_xlabel("iteration")
    if 1 < len(series) <= 10:
        axes[0].legend(fontsize="small")
    figure.suptitle(str(Path(relax_csv).resolve().parent.name))
    png = Path(png)
    atomic_write(png, lambda stream: figure.savefig(stream, format="png", dpi=100))
    return png
