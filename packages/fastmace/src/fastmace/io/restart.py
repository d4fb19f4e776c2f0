"""Restart files: the engine's payload stored losslessly, without pickle, replaced atomically.

Format (version 1): an uncompressed NumPy ``.npz`` archive (a zip of ``.npy`` files). The member
``manifest`` is a UTF-8 JSON document, stored as a uint8 array::

    {"format": "fastmace-restart", "version": 1, "step": 1000, "payload": <node>}

where a ``<node>`` describes one value of the payload:

- ``{"dict": {key: <node>, ...}}`` for a mapping with string keys (order kept),
- ``{"list": [<node>, ...]}`` or ``{"tuple": [<node>, ...]}``,
- ``{"array": "a0"}``: a NumPy array, stored as member ``a0`` with its dtype, shape and bytes,
- ``{"scalar": "a1"}``: a NumPy scalar (``np.float64(...)``), stored as a 0-d array,
- ``{"bytes": "a2"}``: ``bytes`` (an RNG state, say), stored as a uint8 array,
- ``{"json": value}``: ``None``, ``bool``, ``int``, ``float`` or ``str``; Python writes floats
  with the shortest repr that reads back to the same double, and integers of any size exactly.

Loading uses ``np.load(..., allow_pickle=False)``: opening a restart never runs code, and
arrays come back bit for bit. Object arrays are refused when saving for that reason.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from fastmace.runtime.atomic import atomic_write

RESTART_FORMAT = "fastmace-restart"
RESTART_VERSION = 1
_MANIFEST = "manifest"


class RestartFormatError(ValueError):
    """A restart file cannot be read: not ours, a newer version, or damaged."""


@dataclass(frozen=True)
class Restart:
    """The step a restart was written at and the engine's payload, as it was given."""

    step: int
    payload: dict[str, Any]


def save_restart(path: Path, step: int, payload: Mapping[str, Any]) -> None:
    """Write ``payload`` at ``step`` to ``path``, atomically (the old file stays until done)."""
    if isinstance(step, bool) or not isinstance(step, int | np.integer) or step < 0:
        raise ValueError(f"restart step must be a non-negative integer, got {step!r}")
    if not isinstance(payload, Mapping):
        raise TypeError(f"restart payload must be a mapping, got {type(payload).__name__}")
    arrays: dict[str, np.ndarray] = {}
    tree = _encode(payload, "payload", arrays)
    manifest = {"format": RESTART_FORMAT, "version": RESTART_VERSION, "step": int(step)}
    manifest["payload"] = tree
    document = json.dumps(manifest, allow_nan=True).encode("utf-8")
    members = {_MANIFEST: np.frombuffer(document, dtype=np.uint8), **arrays}

    def write(stream: BinaryIO) -> None:
        np.savez(stream, **members)

    atomic_write(Path(path), write)


def load_restart(path: Path) -> Restart:
    """Read a restart file written by :func:`save_restart`."""
    return _read(Path(path), payload=True)


def restart_step(path: Path) -> int:
    """The step restart file ``path`` was written at, from its manifest alone: a preflight
    check reads this without loading the arrays (hundreds of MB for a large system)."""
    return _read(Path(path), payload=False).step


def _read(path: Path, payload: bool) -> Restart:
    try:
        with np.load(path, allow_pickle=False) as archive:
            manifest = json.loads(archive[_MANIFEST].tobytes().decode("utf-8"))
            _check_manifest(manifest, path)
            tree = _decode(manifest["payload"], archive) if payload else {}
    except RestartFormatError:
        raise
    except FileNotFoundError:
        raise
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as error:
        # A truncated file (a full disk, a copy cut short) is a bad zip to NumPy.
        raise RestartFormatError(
            f"{path} is not a readable FastMACE restart file ({error or type(error).__name__}): "
            "it is damaged (cut short by a full disk or an interrupted copy?) or was written by "
            "another program. A run cannot resume from it: start the run again in a new "
            "directory; what this one holds stays as it is"
        ) from error
    return Restart(step=int(manifest["step"]), payload=tree)


def _check_manifest(manifest: Any, path: Path) -> None:
    if not isinstance(manifest, dict) or manifest.get("format") != RESTART_FORMAT:
        raise RestartFormatError(f"{path} is not a FastMACE restart file")
    if manifest.get("version") != RESTART_VERSION:
        raise RestartFormatError(
            f"{path} has restart format version {manifest.get('version')!r}; this FastMACE "
            f"reads version {RESTART_VERSION}: resume it with the FastMACE that wrote it"
        )


def _encode(value: Any, where: str, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """The manifest node for ``value``; arrays it holds are added to ``arrays``."""

    def store(array: np.ndarray) -> str:
        name = f"a{len(arrays)}"
        arrays[name] = array
        return name

    if isinstance(value, np.generic):  # before float: np.float64 is a float subclass
        return {"scalar": store(np.asarray(value))}
    if value is None or isinstance(value, bool | int | float | str):
        return {"json": value}
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise TypeError(
                f"restart payload {where} is an object array, which only pickle could store; "
                "give a numeric array instead"
            )
        return {"array": store(value)}
    if isinstance(value, bytes | bytearray):
        return {"bytes": store(np.frombuffer(bytes(value), dtype=np.uint8))}
    if isinstance(value, Mapping):
        items = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"restart payload {where} has a non-string key {key!r}")
            items[key] = _encode(item, f"{where}[{key!r}]", arrays)
        return {"dict": items}
    if isinstance(value, list | tuple):
        kind = "list" if isinstance(value, list) else "tuple"
        return {kind: [_encode(item, f"{where}[{i}]", arrays) for i, item in enumerate(value)]}
    hint = " (convert tensors with .cpu().numpy())" if "torch" in type(value).__module__ else ""
    raise TypeError(
        f"restart payload {where} is a {type(value).__module__}.{type(value).__qualname__}, "
        f"which a restart cannot store; use NumPy arrays, bytes or plain values{hint}"
    )


def _decode(node: dict[str, Any], archive: Any) -> Any:
    ((kind, content),) = node.items()
    if kind == "json":
        return content
    if kind == "array":
        return archive[content]
    if kind == "scalar":
        return archive[content][()]
    if kind == "bytes":
        return archive[content].tobytes()
    if kind == "dict":
        return {key: _decode(item, archive) for key, item in content.items()}
    if kind == "list":
        return [_decode(item, archive) for item in content]
    if kind == "tuple":
        return tuple(_decode(item, archive) for item in content)
    raise RestartFormatError(f"unknown restart node kind {kind!r}")
