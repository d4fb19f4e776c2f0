"""``fastmace relax STRUCTURE``: FIRE relaxation of a structure file, written to a directory."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

# The same --repeat and --dispersion options as fastmace md.
from fastmace.cli.md import _repeat as parse_repeat
from fastmace.cli.md import add_charge_options, add_dispersion_options


def add_parser(commands: argparse._SubParsersAction) -> None:
    relax = commands.add_parser(
        "relax",
        help="relax a structure file with FIRE (positions, optionally the cell)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    relax.add_argument("structure", help="any file ASE reads (the last frame is used)")
    relax.add_argument("--model", default="demo-emt-cu", help="label, template:NAME or path")
    relax.add_argument("--sha256", metavar="HEX", help="a model path: its file's SHA-256")
    relax.add_argument(
        "--trusted", action="store_true",
        help="a model path: load it without a SHA-256 (loading runs code from the file)",
    )  # fmt: skip
    relax.add_argument("--head", help="model head (multi-head models)")
    relax.add_argument("--fmax", type=float, default=0.05, help="convergence: largest force, eV/Å")
    relax.add_argument("--steps", type=int, default=1000, help="at most this many iterations")
    relax.add_argument("--cell", action="store_true", help="relax the cell too (periodic only)")
    relax.add_argument(
        "--pressure", type=float, default=0.0, dest="pressure_GPa",
        help="with --cell: the target pressure, GPa",
    )  # fmt: skip
    relax.add_argument(
        "--max-step", type=float, default=0.2, dest="max_step_A",
        help="largest move of a system per iteration, Å",
    )  # fmt: skip
    relax.add_argument("--repeat", type=parse_repeat, help="supercell, e.g. 3 or 4,4,2")
    relax.add_argument(
        "--output", "-o", help="a new directory (default: relax-<name>-<date>-<time>)"
    )
    relax.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    relax.add_argument("--dtype", help="float32 or float64 (default: the planner's)")
    relax.add_argument("--backend", default="auto", help="auto, e3nn, cueq, oeq, hybrid")
    add_dispersion_options(relax)
    add_charge_options(relax, default=argparse.SUPPRESS)
    relax.set_defaults(handler=_relax)


def _relax(args: argparse.Namespace) -> int:
    import fastmace

    output = args.output or f"relax-{Path(args.structure).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    result = fastmace.relax(
        args.structure, model=args.model, head=args.head, sha256=args.sha256,
        trusted=args.trusted, fmax=args.fmax, steps=args.steps, cell=args.cell,
        pressure_GPa=args.pressure_GPa, max_step_A=args.max_step_A, repeat=args.repeat,
        output=output, device=args.device, dtype=args.dtype, backend=args.backend,
        dispersion=args.dispersion, dispersion_functional=args.dispersion_functional,
        charge=getattr(args, "charge", None), spin=getattr(args, "spin", None),
        progress=sys.stderr,
    )  # fmt: skip
    print(result.report, end="")
    return 0 if all(result.converged) else 2
