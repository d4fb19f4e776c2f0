"""``fastmace plot RUN_DIR [-o FILE]``: an MD run's thermo.csv, or a relaxation's relax.csv,
drawn as a PNG (docs/output.md, docs/relax.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from fastmace.io.plot import PLOT_FILE, RELAX_PLOT_FILE


def add_parser(commands: argparse._SubParsersAction) -> None:
    plot = commands.add_parser(
        "plot",
        help="draw a run's temperature, energies, pressure and volume against time (a PNG)",
    )
    plot.add_argument(
        "run_dir", metavar="RUN_DIR",
        help="a run directory (with thermo.csv) or a relaxation's (with relax.csv)",
    )  # fmt: skip
    plot.add_argument(
        "--output", "-o", metavar="FILE",
        help=f"the PNG to write (default: RUN_DIR/{PLOT_FILE}, or {RELAX_PLOT_FILE} for a "
        "relaxation)",
    )  # fmt: skip
    plot.set_defaults(handler=_plot)


def _plot(args: argparse.Namespace) -> int:
    from fastmace.io.plot import plot_relaxation, plot_thermo

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir} is not a directory: give a run directory")
    relaxation = run_dir / "relax.csv"
    if relaxation.is_file() and not (run_dir / "thermo.csv").exists():
        png = plot_relaxation(relaxation, Path(args.output or run_dir / RELAX_PLOT_FILE))
    else:
        png = plot_thermo(run_dir / "thermo.csv", Path(args.output or run_dir / PLOT_FILE))
    print(f"wrote {png}")
    return 0
