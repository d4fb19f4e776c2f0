"""Converted models kept in the cache root, so that a warm start neither converts nor checks.

Converting a model to cuEquivariance takes seconds and imports mace-torch's converters, which
import its training tools (``mace.tools.scripts_utils`` imports the trainer, torchmetrics and
what that pulls in: about 5-7 s of a warm start on the GPU machine,
docs/validation/performance.md). The converted module, and the check it passed against the
e3nn model when it was made, are kept under ``<cache root>/compile/converted/``; a later process
that loads the same weights for the same backend, device kind, dtype, head and library versions
unpickles them instead.

cuEquivariance's ``SegmentedPolynomial`` pickles as its constructor's arguments: its buffers
are made anew on the CPU in float64, and what mace-torch set on the instance after
construction (the convolution's ``forward``, replaced by ``with_cueq_conv_fusion`` on CUDA) is
not kept. So a read module is moved to its device and dtype, the wrappers named when it was
kept are applied again, and an entry is written only when a round trip gives back the same
modules, attributes, parameters and buffers.

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
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

import torch

from fastmace.models.backends import ConversionCheck, keep_cueq_kernels
from fastmace.models.checkpoint import import_mace
from fastmace.runtime import vouched
from fastmace.runtime.atomic import atomic_write
from fastmace.runtime.cache import cache_dir

FORMAT = 2
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


@dataclass(frozen=True)
class SourceRecord:
    """What a model's source (a checkpoint file's bytes, or a template and its seed) gave the
    last time it was loaded and converted: the kept entry's key, the model's description and
    the head chosen. A warm start reads it instead of unpickling the checkpoint."""

    entry_key: str
    description: dict
    head: str


def source_key(source: str, head: str | None, backend: str, device: str, dtype: str) -> str:
    """The name of the source record for ``source`` (``file-sha256:...`` or
    ``template:NAME:SEED``) loaded with the head asked for (None: the model's only one)."""
    return entry_key(f"source {source}", str(head), backend, device, dtype)


def read_source(key: str) -> SourceRecord | None:
    """The source record under ``key`` when this user wrote it, else None."""
    data = vouched.read_vouched(_source_path(key))
    if data is None:
        return None
    try:
        record = SourceRecord(**json.loads(data))
    except (ValueError, TypeError):
        return None
    return record if entry_path(record.entry_key).exists() else None


def write_source(key: str, record: SourceRecord) -> None:
    """Keep ``record`` under ``key`` (nothing when the cache root cannot be written)."""
    data = json.dumps(asdict(record), sort_keys=True).encode()
    with contextlib.suppress(OSError):
        path = _source_path(key)
        atomic_write(path, lambda stream: stream.write(data))
        vouched.vouch(path, data)


def _source_path(key: str) -> Path:
    return cache_dir("compile", "converted") / f"{key}.source.json"


def read(key: str, device: str) -> KeptConversion | None:
    """The kept conversion under ``key``, on ``device``; None when absent, not written by this
    user, or unreadable (the caller converts again)."""
    path = entry_path(key)
    data = vouched.read_vouched(path)
    if data is None:
        return None
    if device.startswith("cuda"):  # the module's first call compiles kernels, as a new one's
        keep_cueq_kernels()
    try:
        kept = _unpickled(data, device)
        module, check = kept["module"], ConversionCheck(**kept["check"])
    except Exception:  # an entry another version wrote, or damaged: convert again
        return None
    if not (isinstance(module, torch.nn.Module) and check.passed):
        return None
    return KeptConversion(module.eval(), check, path)


def write(key: str, module: torch.nn.Module, check: ConversionCheck) -> Path | None:
    """Keep ``module`` and its passed ``check`` under ``key``; None when the module cannot be
    pickled faithfully or the cache root cannot be written (the next process converts again)."""
    wrapped = instance_forwards(module)
    if not set(wrapped.values()) <= set(_wrappers()):
        return None  # a forward replaced by code we cannot apply again
    buffer = io.BytesIO()
    try:
        parameter = next(module.parameters())
        entry = {"module": module, "check": asdict(check), "wrapped": wrapped}
        torch.save(entry | {"dtype": parameter.dtype}, buffer)
        data = buffer.getvalue()
        device = str(parameter.device)
        if _outline(_unpickled(data, device)["module"]) != _outline(module):
            return None
    except (pickle.PicklingError, TypeError, AttributeError, RuntimeError, StopIteration):
        return None
    with contextlib.suppress(OSError):
        path = entry_path(key)
        atomic_write(path, lambda stream: stream.write(data))
        if vouched.vouch(path, data):  # read back only by this user
            return path
    return None


def instance_forwards(module: torch.nn.Module) -> dict[str, str]:
    """The submodules whose ``forward`` was replaced on the instance, by the qualified name of
    the replacement (mace-torch's wrappers define it locally)."""
    return {
        name: getattr(vars(sub)["forward"], "__qualname__", "?")
        for name, sub in module.named_modules()
        if "forward" in vars(sub)
    }


def _wrappers() -> dict[str, Callable[[torch.nn.Module], torch.nn.Module]]:
    """mace-torch's wrappers that replace a module's ``forward``, by the name of the forward
    each one sets."""
    from mace.modules import wrapper_ops

    known = (wrapper_ops.with_cueq_conv_fusion, wrapper_ops.with_scatter_sum)
    return {f"{wrapper.__name__}.<locals>.forward": wrapper for wrapper in known}


def _unpickled(data: bytes, device: str) -> dict:
    """An entry's contents, its module on ``device`` with its wrappers applied again."""
    import_mace()  # as a checkpoint is read: mace-torch's model code, not its trainer
    kept = torch.load(io.BytesIO(data), map_location=device, weights_only=False)
    module = kept["module"]
    wrappers = _wrappers() if kept.get("wrapped") else {}
    for name, forward in kept.get("wrapped", {}).items():
        sub = module.get_submodule(name)
        if "forward" not in vars(sub):  # lost in the pickle: cuEquivariance's __reduce__
            wrappers[forward](sub)
    # Buffers made by a constructor while unpickling are on the CPU in float64, whatever
    # map_location says: put them where the conversion put them (its last step is this same
    # call). Without it the first evaluation on CUDA failed: "mat2 is on cpu" (2026-12-04).
    kept["module"] = module.to(device=device, dtype=kept.get("dtype"))
    return kept


def _outline(module: torch.nn.Module) -> dict[str, tuple]:
    """Each submodule's class, public attribute names (torch's own, and caches a library
    fills on first use, begin with an underscore), and parameters' and buffers' shapes and
    dtypes: what a faithful round trip through pickle must give back."""

    def tensors(named: dict[str, torch.Tensor | None]) -> tuple:
        return tuple(
            (name, None if t is None else (tuple(t.shape), t.dtype)) for name, t in named.items()
        )

    return {
        name: (
            type(sub).__qualname__,
            tuple(sorted(name for name in vars(sub) if not name.startswith("_"))),
            tensors(sub._parameters),
            tensors(sub._buffers),
        )
        for name, sub in module.named_modules()
    }


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
