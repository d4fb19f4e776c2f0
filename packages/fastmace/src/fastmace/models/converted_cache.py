"""Converted models kept in the cache root, so that a warm start neither converts nor checks.

Converting a model to cuEquivariance takes seconds and imports mace-torch's converters, which
import its training tools (``mace.tools.scripts_utils`` imports the trainer, torchmetrics and
what that pulls in: about 5-7 s of a warm start on the GPU machine,
docs/validation/performance.md). The converted module, and the check it passed against the
e3nn model when it was made, are kept under ``<cache root>/compile/converted/``; a later process
that loads the same weights for the same backend, device kind, dtype, head and library versions
unpickles them instead.

A pickle runs code when read, so an entry is read only when its bytes are the ones this user
wrote (runtime/vouched.py; the threat model is in docs/environment.md). An entry that is
missing, not vouched for, or cannot be unpickled counts as absent: the model is converted and
checked again, and the entry written anew.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import pickle
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

import torch

from fastmace.models.backends import ConversionCheck
from fastmace.runtime import vouched
from fastmace.runtime.atomic import atomic_write
from fastmace.runtime.cache import cache_dir

FORMAT = 1
# Backends whose modules are kept: OpenEquivariance's hold handles to its host extension.
KEPT_BACKENDS = frozenset({"cueq"})
# Devices whose kept modules are read back.
KEPT_DEVICES = ("cpu", "cuda")


def kept_for(backend: str, device: str) -> bool:
    """Whether conversions to ``backend`` on ``device`` are kept and read back."""
    return backend in KEPT_BACKENDS and device.startswith(KEPT_DEVICES)


# Whatever changes what a conversion makes, or how its module unpickles.
_PACKAGES = (
    "fastmace",
    "mace-torch",
    "cuequivariance",
    "cuequivariance-torch",
    "cuequivariance-ops-torch-cu12",
    "cuequivariance-ops-torch-cu13",
    "e3nn",
)


@dataclass(frozen=True)
class KeptConversion:
    """A converted module read from the cache root, with the check it passed when made."""

    module: torch.nn.Module
    check: ConversionCheck
    path: Path


def entry_key(content_hash: str, head: str, backend: str, device: str, dtype: str) -> str:
    """The entry's name: the weights (their content hash), the head, the backend, the device
    (the GPU's name for CUDA), the dtype and every version that shapes the converted module."""
    identity = {
        "format": FORMAT,
        "weights": content_hash,
        "head": head,
        "backend": backend,
        "device": _device_identity(device),
        "dtype": dtype,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "packages": {name: _version(name) for name in _PACKAGES},
        "conversion_code": _conversion_code_digest(),
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:40]


def entry_path(key: str) -> Path:
    return cache_dir("compile", "converted") / f"{key}.pt"


def read(key: str, device: str) -> KeptConversion | None:
    """The kept conversion under ``key``, on ``device``; None when absent, not written by this
    user, or unreadable (the caller converts again)."""
    path = entry_path(key)
    data = vouched.read_vouched(path)
    if data is None:
        return None
    try:
        kept = torch.load(io.BytesIO(data), map_location=device, weights_only=False)
        module, check = kept["module"], ConversionCheck(**kept["check"])
    except Exception:  # an entry another version wrote, or damaged: convert again
        return None
    if not (isinstance(module, torch.nn.Module) and check.passed):
        return None
    # cuEquivariance's SegmentedPolynomial pickles as its constructor's arguments, so its
    # coefficient buffers are made anew on the CPU whatever map_location says: move them.
    # (Without this, the first evaluation on CUDA failed: "mat2 is on cpu", 2026-12-04.)
    return KeptConversion(module.to(device).eval(), check, path)


def write(key: str, module: torch.nn.Module, check: ConversionCheck) -> Path | None:
    """Keep ``module`` and its passed ``check`` under ``key``; None when the module cannot be
    pickled or the cache root cannot be written (the next process converts again)."""
    buffer = io.BytesIO()
    try:
        torch.save({"module": module, "check": asdict(check)}, buffer)
    except (pickle.PicklingError, TypeError, AttributeError, RuntimeError):
        return None
    data = buffer.getvalue()
    with contextlib.suppress(OSError):
        path = entry_path(key)
        atomic_write(path, lambda stream: stream.write(data))
        if vouched.vouch(path, data):  # read back only by this user
            return path
    return None


@functools.cache  # the sources do not change while a process runs
def _conversion_code_digest() -> str:
    """FastMACE's part of a conversion: the converter's driver and the descriptors' cache."""
    folder = Path(__file__).parent
    digest = hashlib.sha256()
    for name in ("backends.py", "cueq_descriptors.py", "converted_cache.py"):
        digest.update((folder / name).read_bytes())
    return digest.hexdigest()


def _device_identity(device: str) -> str:
    if not device.startswith("cuda"):
        return device
    return f"cuda:{torch.cuda.get_device_name(torch.device(device))}"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return ""
