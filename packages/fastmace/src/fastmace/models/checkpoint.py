"""Loading a MACE checkpoint without side effects on the process, and describing it.

mace-torch sets ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` when it is imported, its converters call
``torch.set_default_dtype``, and the libraries below it write variables such as
``TORCHINDUCTOR_CACHE_DIR``; all of that would change how the user's own code behaves. Every
call into mace-torch from FastMACE runs inside :func:`contained`, which puts the default
dtype, the environment and the warning filters back as they were.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from fastmace.runtime.quiet import library_noise_silenced

if TYPE_CHECKING:
    from fastmace.models.files import ModelFile


class NotAMaceModelError(ValueError):
    """A file that loads but does not hold a MACE model."""


@contextlib.contextmanager
def contained() -> Iterator[None]:
    """Undo what mace-torch and its libraries do to the process: default dtype, environment
    variables (``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` above all), warning filters; the libraries'
    warnings about their own code are not shown (:mod:`fastmace.runtime.quiet`), and the
    models built in the block share no rounded constants (:func:`clebsch_gordan_in_float64`)."""
    dtype = torch.get_default_dtype()
    environ = dict(os.environ)
    try:
        # a catch_warnings(): the user's filters come back
        with library_noise_silenced(), clebsch_gordan_in_float64():
            yield
    finally:
        torch.set_default_dtype(dtype)
        for name in set(os.environ) - set(environ):
            del os.environ[name]
        for name, value in environ.items():
            if os.environ.get(name) != value:
                os.environ[name] = value


_CG_LOCK = threading.Lock()
_CG_USERS = 0  # blocks inside clebsch_gordan_in_float64, in all threads


@contextlib.contextmanager
def clebsch_gordan_in_float64() -> Iterator[None]:
    """mace-torch's Clebsch-Gordan coefficients for cuEquivariance in float64, whatever torch's
    default dtype, for the block.

    mace-torch's ``O3_e3nn.clebsch_gordan`` (``mace.tools.cg``) calls e3nn's ``wigner_3j`` in
    torch's default dtype, and cuEquivariance keeps what it builds from them (the coupling
    matrices of the symmetric contractions, their descriptors) in in-process caches keyed by
    the irreps alone. A float32 model built first left float32-rounded coefficients there, and
    every float64 model built later in the process was off by up to 3e-8 in its coupling
    matrices. In float64 the cached values are the same whichever model comes first (float32
    models get them rounded once, at the end). The library's own method does the work; only
    the default dtype around it changes. Reentrant and thread-safe: the first block in
    replaces the method, the last one out puts it back.
    """
    global _CG_USERS
    with _CG_LOCK:
        if _CG_USERS == 0:
            _install_float64_clebsch_gordan()
        _CG_USERS += 1
    try:
        yield
    finally:
        with _CG_LOCK:
            _CG_USERS -= 1
            if _CG_USERS == 0:
                _restore_clebsch_gordan()


_CG_ORIGINALS: dict[type, classmethod] = {}  # mace-torch's own methods, while replaced


def _install_float64_clebsch_gordan() -> None:
    """Nothing to do before mace-torch is imported (no model is built before then) or without
    cuEquivariance (mace-torch then defines no such method)."""
    cls = getattr(sys.modules.get("mace.tools.cg"), "O3_e3nn", None)
    original = vars(cls).get("clebsch_gordan") if cls is not None else None
    if isinstance(original, classmethod):
        _CG_ORIGINALS[cls] = original
        cls.clebsch_gordan = classmethod(_in_float64(original.__func__))


def _restore_clebsch_gordan() -> None:
    for cls, original in _CG_ORIGINALS.items():
        cls.clebsch_gordan = original
    _CG_ORIGINALS.clear()


def _in_float64(method: Any) -> Any:
    def clebsch_gordan(cls: type, *irreps: Any) -> Any:
        with default_dtype(torch.float64):
            return method(cls, *irreps)

    return clebsch_gordan


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Torch's default dtype set to ``dtype`` for the block, and put back after.

    Some of mace-torch's arithmetic takes its dtype from the default (the ZBL pair term
    multiplies integer atomic numbers by a Python float), and mace-torch's own callers set
    the default to the model's dtype; outside the block the process keeps its own default.
    Cheap enough for every model call, unlike :func:`contained`.
    """
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def import_mace() -> Any:
    """``import mace`` with its import-time side effects contained.

    mace-torch imports OpenEquivariance, which loads or builds its host extension at import:
    FastMACE's OEq runtime prepares the process first (prebuilt library, build-once cache,
    no stale-lock waits). Its variables are set before ``contained`` and so survive it.
    """
    from fastmace.models.lean_import import mace_tools_without_trainer
    from fastmace.oeq.host_extension import importing_openequivariance

    with importing_openequivariance(), contained():
        mace_tools_without_trainer()  # its model code, not its trainer (lean_import)
        import mace.modules

        return mace.modules


def content_hash(model: torch.nn.Module) -> str:
    """SHA-256 over the model's class, parameter and buffer names, dtypes, shapes and values.

    Unlike the file's hash it identifies the weights whatever the pickle around them, so a
    template built from a seed and a model moved between devices keep their identity.
    """
    digest = hashlib.sha256(type(model).__qualname__.encode())
    for name, tensor in sorted(model.state_dict().items()):
        values = tensor.detach().to("cpu").contiguous().reshape(-1)
        digest.update(f"{name}|{values.dtype}|{tuple(values.shape)}|".encode())
        digest.update(values.view(torch.uint8).numpy().tobytes() if values.numel() else b"")
    return digest.hexdigest()


@dataclass(frozen=True)
class ModelDescription:
    """What a loaded model is: enough to plan a run and to record it."""

    model_type: str
    dtype: str
    heads: tuple[str, ...]
    r_max: float
    atomic_numbers: tuple[int, ...]
    num_interactions: int
    content_hash: str


def model_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype of a model's parameters."""
    return next(model.parameters()).dtype


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of a model's parameters."""
    return next(model.parameters()).device


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``, as reports and metadata write it."""
    return str(dtype).removeprefix("torch.")


def check_is_mace(model: object) -> None:
    """Raise NotAMaceModelError unless ``model`` has what a mace-torch model has."""
    needed = ("r_max", "atomic_numbers", "interactions")
    missing = [name for name in needed if not hasattr(model, name)]
    if not isinstance(model, torch.nn.Module) or missing:
        lacks = f" (it lacks {', '.join(missing)})" if missing else ""
        raise NotAMaceModelError(f"a {type(model).__name__} is not a MACE model{lacks}")


def describe(model: torch.nn.Module) -> ModelDescription:
    """Read the facts FastMACE needs from a mace-torch model; NotAMaceModelError otherwise."""
    check_is_mace(model)
    parameter = next(model.parameters(), None)
    dtype = dtype_name(parameter.dtype) if parameter is not None else "unknown"
    heads = tuple(getattr(model, "heads", None) or ("Default",))
    return ModelDescription(
        model_type=type(model).__name__,
        dtype=dtype,
        heads=heads,
        r_max=float(model.r_max),
        atomic_numbers=tuple(int(z) for z in model.atomic_numbers),
        num_interactions=len(model.interactions),
        content_hash=content_hash(model),
    )


def load_checkpoint(file: ModelFile) -> torch.nn.Module:
    """Unpickle, on the CPU, the bytes that :func:`fastmace.models.files.verify` read and
    hashed (never the path again: the file may have changed since).

    Raises NotAMaceModelError when the file holds something else.
    """
    path = file.path
    import_mace()  # the pickle refers to mace-torch's classes
    with contained():
        try:
            loaded = torch.load(io.BytesIO(file.content), map_location="cpu", weights_only=False)
        except Exception as error:  # pickle, zip and torch errors alike mean "not a checkpoint"
            raise NotAMaceModelError(
                f"{path} is not a loadable PyTorch checkpoint ({type(error).__name__}: {error})"
            ) from error
    if not isinstance(loaded, torch.nn.Module):
        raise NotAMaceModelError(
            f"{path} holds a {type(loaded).__name__}, not a MACE model; MACE checkpoints are "
            "whole models saved with torch.save(model, path)"
        )
    try:
        check_is_mace(loaded)
    except NotAMaceModelError as error:
        raise NotAMaceModelError(f"{path}: {error}") from error
    return loaded.eval()
