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


def _is_negative_number(token: str) -> bool:
    """``-1e5``, ``-0.5`` or ``-1e5,2e5``: numbers argparse would take for an option."""
    if not token.startswith("-") or len(token) < 2 or not (token[1].isdigit() or token[1] == "."):
        return False
    try:
        for part in token.split(","):
            float(part)
    except ValueError:
        return False
    return True


def attach_negative_numbers(argv: Sequence[str]) -> list[str]:
    """``--pressure -1e5`` as ``--pressure=-1e5``: argparse recognises plain negative numbers
    (``-5``, ``-0.5``) as values but takes ``-1e5`` for an unknown option."""
    attached: list[str] = []
    for token in argv:
        previous = attached[-1] if attached else ""
        if previous.startswith("--") and "=" not in previous and _is_negative_number(token):
            attached[-1] = f"{previous}={token}"
        else:
            attached.append(token)
    return attached


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(attach_negative_numbers(sys.argv[1:] if argv is None else argv))
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
