"""``fastmace [--debug] COMMAND``: the entry point of the command line.

Each sub-command imports what it needs when it runs, so ``fastmace --help`` stays fast and
imports neither torch nor MACE.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import fastmace


def _doctor(args: argparse.Namespace) -> int:
    from fastmace.doctor import run_doctor

    return run_doctor(hash_models=not args.no_hash, debug=args.debug)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fastmace",
        description="Molecular dynamics with pretrained MACE potentials on NVIDIA GPUs.",
    )
    parser.add_argument("--version", action="version", version=f"fastmace {fastmace.__version__}")
    parser.add_argument(
        "--debug", action="store_true", help="show full tracebacks instead of one-line errors"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    doctor = commands.add_parser(
        "doctor", help="check the installation, one line per check; changes nothing"
    )
    doctor.add_argument(
        "--no-hash", action="store_true", help="skip the SHA-256 of the model files"
    )
    doctor.set_defaults(handler=_doctor)

    from fastmace.cli import md, models, plot, relax

    md.add_parsers(commands)
    relax.add_parser(commands)
    models.add_parser(commands)
    plot.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        print("fastmace: interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        if args.debug:
            raise
        print(f"fastmace: error: {error}", file=sys.stderr)
        print("run fastmace --debug ... for the traceback", file=sys.stderr)
        return 1
