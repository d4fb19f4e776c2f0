"""``fastmace models list | fetch LABEL | verify``: the label table and the local files."""

from __future__ import annotations

import argparse
import sys

from fastmace.models.files import locate_label_file, model_directories, scan_model_files
from fastmace.models.label_table import checkpoints, licence_name, resolve_label


def list_models(args: argparse.Namespace) -> int:
    present = {s.checkpoint_id for s in scan_model_files(hash_files=False) if s.checkpoint_id}
    rows = [("label", "model", "heads (default first)", "licence", "here")]
    for checkpoint in checkpoints():
        heads = [checkpoint.default_head] + [
            h.name for h in checkpoint.heads if h.name != checkpoint.default_head
        ]
        here = "shipped" if checkpoint.packaged else ("yes" if checkpoint.id in present else "")
        rows.append((checkpoint.id, checkpoint.name, ", ".join(heads), checkpoint.licence, here))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
    licences = sorted({c.licence for c in checkpoints()})
    print("\nlicences: " + "; ".join(f"{short} = {licence_name(short)}" for short in licences))
    print("a head is chosen as LABEL:HEAD, e.g. mh-1:matpes_r2scan")
    return 0


def fetch_model(args: argparse.Namespace) -> int:
    checkpoint, _ = resolve_label(args.label)
    found = locate_label_file(checkpoint, download=True, progress=sys.stderr)
    print(f"{checkpoint.id}: {found.path} ({found.source}; SHA-256 {found.sha256})")
    return 0


def verify_models(args: argparse.Namespace) -> int:
    statuses = scan_model_files(hash_files=True)
    if not statuses:
        print("no checkpoint files in " + " and ".join(map(str, model_directories())))
    words = {
        "verified": "ok",
        "mismatch": "SHA-256 MISMATCH: delete it and fetch it again",
        "empty": "empty, skipped",
        "unknown": "not in the label table",
    }
    for status in statuses:
        label = f" ({status.checkpoint_id})" if status.checkpoint_id else ""
        print(f"{status.path}{label}: {words[status.state]}")
    return 1 if any(status.state == "mismatch" for status in statuses) else 0


def add_parser(commands: argparse._SubParsersAction) -> None:
    models = commands.add_parser("models", help="the model label table and the local files")
    actions = models.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    actions.add_parser("list", help="labels, heads and licences").set_defaults(handler=list_models)
    fetch = actions.add_parser("fetch", help="download a model's file into the cache")
    fetch.add_argument("label", help="a label of `fastmace models list`, e.g. mh-1")
    fetch.set_defaults(handler=fetch_model)
    actions.add_parser(
        "verify", help="check the SHA-256 of the files in FASTMACE_MODELS and the cache"
    ).set_defaults(handler=verify_models)
