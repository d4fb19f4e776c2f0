"""Checks of the model a run asks for, made from names and file-system lookups alone.

What can be known before loading: the model is a label, ``template:NAME`` or a path; a label
is in the table and its file is present (fm.md never downloads); a path exists and the user
vouched for it (``sha256`` or ``trusted``). The file's hash, its contents and the model's
elements are checked when it is loaded.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fastmace.models.files import (
    ModelFileError,
    check_trust_options,
    find_label_file,
    unvouched_file_error,
)
from fastmace.models.label_table import find_checkpoint, resolve_label
from fastmace.preflight.values import RequestTypeError, optional_path, optional_text

CHECKPOINT_SUFFIXES = (".model", ".pt", ".pth", ".ckpt")


def check_model(
    model: Any,
    *,
    head: Any = None,
    checkpoint: Any = None,
    sha256: Any = None,
    trusted: Any = False,
    environ: Mapping[str, str] | None = None,
    look: bool = True,
) -> None:
    """Raise for a model that cannot be loaded as asked; ``look=False`` checks kinds only."""
    if not isinstance(model, str | os.PathLike) or not os.fspath(model):
        raise RequestTypeError(
            f"model={model!r:.80} is not allowed: give a label (`fastmace models` lists them), "
            "template:NAME, or the path of a checkpoint file",
            "model",
        )
    check_trust_options(sha256, trusted)
    optional_text("head", head, "the name of one of the model's heads")
    optional_path("checkpoint", checkpoint, "the label's checkpoint file")
    if look:
        _look_up(os.fspath(model), head, checkpoint, sha256, trusted, environ)


def _look_up(
    text: str,
    head: str | None,
    checkpoint: str | os.PathLike[str] | None,
    sha256: str | None,
    trusted: bool,
    environ: Mapping[str, str] | None,
) -> None:
    if text.startswith(("template:", "https://", "http://")):
        return  # a template is built, a URL fetched: both when the model is loaded
    entry = find_checkpoint(text.partition(":")[0])
    if entry is not None:
        resolve_label(text)  # a head after the colon must exist
        if head is not None:
            entry.head(head)
        explicit = Path(checkpoint).expanduser() if checkpoint is not None else None
        _, path = find_label_file(entry, explicit, environ)
        if not path.is_file():
            raise ModelFileError(f"the checkpoint {path} (checkpoint=) is not a readable file")
        return
    path = Path(text).expanduser()
    if not path.exists():
        if os.sep in text or path.suffix in CHECKPOINT_SUFFIXES:
            # Meant as a path (no label has a slash or a suffix): "unknown label" would mislead.
            raise ModelFileError(
                f"the model file {path} does not exist; give the path of a checkpoint file, or "
                "a label (`fastmace models list` shows them)"
            )
        resolve_label(text)  # UnknownLabelError, with the labels that come close
    if not path.is_file():
        raise ModelFileError(f"the model path {path} is not a file; give a checkpoint file")
    if sha256 is None and not trusted:
        raise unvouched_file_error(path)
