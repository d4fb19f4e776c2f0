"""The run's plot: temperature, energies, pressure and volume against time, from thermo.csv.

matplotlib is optional (``pip install "fastmace[plot]"``). The figure is drawn on its own Agg
canvas, so neither pyplot's global state nor the user's chosen backend is touched.
"""

from __future__ import annotations

import csv
import importlib.util
import math
from pathlib import Path

from fastmace.runtime.atomic import atomic_write

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
    ("total_energy_eV", "total energy (eV)"),
)


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
        for column, _ in PANELS:
            system.setdefault(column, []).append(_number(row.get(column)))
    return series


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
    figure = Figure(figsize=(10, 8), layout="constrained")
    FigureCanvasAgg(figure)  # the figure's own canvas: no pyplot, no global backend
    axes = figure.subplots(3, 2, sharex=True).ravel()
    for ax, (column, title) in zip(axes, PANELS, strict=True):
        for system, values in series.items():
            label = f"system {system}" if len(series) > 1 else None
            ax.plot(values["time_ps"], values[column], label=label, linewidth=1)
        if all(math.isnan(v) for values in series.values() for v in values[column]):
            ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title, fontsize="medium")
    for ax in axes[-2:]:
        ax.set_xlabel("time (ps)")
    if 1 < len(series) <= 10:  # a larger batch's legend would hide the lines
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
