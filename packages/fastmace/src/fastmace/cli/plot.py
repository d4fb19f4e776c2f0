"""``fastmace plot RUN_DIR [-o FILE]``: the run's thermo.csv drawn as a PNG (docs/output.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from fastmace.io.plot import PLOT_FILE


def add_parser(commands: argparse._SubParsersAction) -> None:
    plot = commands.add_parser(
        "plot",
        help="draw a run's temperature, energies, pressure and volume against time (a PNG)",
    )
    plot.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (with thermo.csv)")
    plot.add_argument(
        "--output", "-o", metavar="FILE", help=f"the PNG to write (default: RUN_DIR/{PLOT_FILE})"
    )
    plot.set_defaults(handler=_plot)


def _plot(args: argparse.Namespace) -> int:
    from fastmace.io.plot import plot_thermo

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir} is not a directory: give a run directory")
    png = plot_thermo(run_dir / "thermo.csv", Path(args.output or run_dir / PLOT_FILE))
    print(f"wrote {png}")
    return 0
