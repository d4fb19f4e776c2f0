"""Plot a benchmark run: milliseconds per MD step against atoms, one line per engine.

Reads a ``md_speed.py`` result (the ``cases`` list: model, atoms, label, status, ms_per_step)
and writes one PNG with a panel per model, log-log, the cases that ran. Needs matplotlib
(``pip install "fastmace[plot]"``); draws with matplotlib's Agg canvas directly, so no
backend or global setting of the user's matplotlib is touched.

    python benchmarks/plot_speed.py benchmarks/results/2026-11-30-h200/run4-final.json \\
        docs/validation/img/ms-per-step-2026-11-30.png
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any


def series(cases: list[dict[str, Any]]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """model -> engine label -> sorted (atoms, ms per step), for the cases that ran."""
    found: dict[str, dict[str, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    for case in cases:
        if case.get("status") == "ok" and case.get("ms_per_step"):
            found[case["model"]][case["label"]].append((case["atoms"], case["ms_per_step"]))
    return {model: {label: sorted(points) for label, points in lines.items()}
            for model, lines in found.items()}  # fmt: skip


def plot(result: dict[str, Any], destination: Path) -> Path:
    """Write the plot of ``result`` (a benchmark JSON document) to ``destination``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    models = series(result["cases"])
    if not models:
        raise ValueError("the result has no case that ran (status 'ok' with ms_per_step)")
    figure = Figure(figsize=(5.5 * len(models), 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    for index, (model, lines) in enumerate(sorted(models.items())):
        axes = figure.add_subplot(1, len(models), index + 1)
        for label, points in sorted(lines.items()):
            atoms, ms = zip(*points, strict=True)
            style = "--" if label.startswith("MACECalculator") else "-"
            axes.plot(atoms, ms, style, marker="o", label=label)
        axes.set_xscale("log")
        axes.set_yscale("log")
        axes.set_xlabel("atoms")
        axes.set_ylabel("ms per MD step")
        axes.set_title(model)
        axes.grid(True, which="both", alpha=0.3)
        axes.legend(fontsize="small")
    destination.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(destination, dpi=120)
    return destination


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", type=Path, help="a benchmark JSON with a 'cases' list")
    parser.add_argument("png", type=Path, help="where to write the plot")
    args = parser.parse_args()
    print(plot(json.loads(args.result.read_text()), args.png))


if __name__ == "__main__":
    main()
