"""Triton kernels written out as Python source at run time, imported from a private directory.

Triton compiles a kernel from its function's source file, so code generated for one model
(product_codegen.py, conv_codegen.py) is written to a file before it is imported. The files
go to a directory of this process's own (``mkdtemp``: mode 0700, so no other user can put
code there), each module is imported once per process, and Triton's own cache keeps the
compiled kernels by their source.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

_DIRECTORY: Path | None = None  # this process's generated sources
_LOADED: dict[str, ModuleType] = {}


def _directory() -> Path:
    global _DIRECTORY
    if _DIRECTORY is None:
        _DIRECTORY = Path(tempfile.mkdtemp(prefix="fastmace-kernels-"))
    return _DIRECTORY


def load(name: str, source: Callable[[], str]) -> ModuleType:
    """The module under ``name`` (a Python identifier naming what it was generated for): on
    the first call for that name, ``source()`` is written out and imported."""
    if name not in _LOADED:
        path = _directory() / f"{name}.py"
        path.write_text(source())
        spec = importlib.util.spec_from_file_location(f"fastmace_generated_{name}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _LOADED[name] = module
    return _LOADED[name]


def forget(name: str) -> None:
    """Drop the module loaded under ``name`` (tests that replace its kernels put it back so)."""
    _LOADED.pop(name, None)


def kernels_run(tensor: torch.Tensor) -> bool:
    """Whether generated kernels run for ``tensor``: on CUDA, and on the CPU under Triton's
    interpreter (which Triton itself switches on from the environment: the tests run whole
    potentials that way); elsewhere the torch formulas do."""
    return tensor.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


def float32_literal(value: float) -> str:
    """``value`` rounded to float32, written so that it reads back exactly (Triton takes a
    literal in a kernel as float32)."""
    import struct

    return repr(struct.unpack("f", struct.pack("f", value))[0])


def joined_sum(parts: list[str], indent: str) -> str:
    """``parts`` added, a few per line (one long line of source is slow for Python's parser
    and for Triton's); "" for no parts."""
    lines = [" + ".join(parts[k : k + 4]) for k in range(0, len(parts), 4)]
    joined = (" +\n" + indent).join(lines)
    return f"({joined})" if len(parts) > 1 else joined


def loaded() -> list[str]:
    """The names of the modules this process has generated and imported."""
    return sorted(_LOADED)
