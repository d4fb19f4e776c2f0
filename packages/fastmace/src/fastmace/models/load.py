"""``fm.load``: a model name, path or URL in; a verified, described, converted model out."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

import torch

from fastmace.models import backends, converted_cache
from fastmace.models.checkpoint import (
    ModelDescription,
    describe,
    dtype_name,
    load_checkpoint,
    model_dtype,
)
from fastmace.models.cueq_constants import path_tables_as_constants
from fastmace.models.files import (
    ModelFile,
    check_trust_options,
    locate_label_file,
    locate_url,
    verify,
)
from fastmace.models.label_table import (
    Checkpoint,
    UnknownLabelError,
    find_checkpoint,
    licence_name,
    resolve_label,
)
from fastmace.models.templates import template
from fastmace.vocabulary import CPU_BACKEND, CUDA_BACKEND_ORDER, LONG_RANGE_MODEL_TYPES

_DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass(frozen=True)
class LoadedModel:
    """A MACE model ready to run, and everything known about where it came from."""

    module: torch.nn.Module
    """The model on its backend, device and dtype."""
    reference_loader: Callable[[], torch.nn.Module] = field(repr=False, compare=False)
    """Gives :attr:`reference`; read at first use when the converted model was kept."""
    name: str
    head: str
    head_functional: str | None
    description: ModelDescription
    """Facts of the checkpoint's e3nn model (its dtype, heads, r_max, species, hash)."""
    backend: str
    backend_reason: str
    device: str
    dtype: str
    checkpoint: Checkpoint | None
    file: ModelFile | None
    licence: str
    conversion_check: backends.ConversionCheck | None
    origin: dict = field(default_factory=dict)
    """The arguments of :func:`load` that give these weights again (for a child process)."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds spent in each part of :func:`load`: ``read_s`` (finding, verifying and
    unpickling the checkpoint, or building the template), ``convert_s`` (the backend's copy)
    and ``check_s`` (its comparison with the e3nn model)."""

    @functools.cached_property
    def reference(self) -> torch.nn.Module:
        """mace-torch's e3nn model with the same weights, on the CPU, in the checkpoint's
        dtype. A warm start that read its converted model from the cache root has not
        unpickled the checkpoint: it is read (and its hash checked) here, at first use."""
        return self.reference_loader()

    def summary(self) -> str:
        """One line for logs and reports."""
        source = f", {self.file.path}" if self.file else ""
        return (
            f"{self.name} (head {self.head}{source}): {self.backend} on {self.device}, "
            f"{self.dtype}; licence {self.licence}"
        )


def _parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"dtype={dtype!r} is not supported: use 'float32' or 'float64'")
    return _DTYPES[dtype]


def _check_device(device: str) -> None:
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device={device!r} is not a device: use 'cpu' or 'cuda'") from error
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device={device!r}, but torch sees no CUDA GPU here (torch CUDA "
            f"{torch.version.cuda}); use device='cpu', or see `fastmace doctor`"
        )
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r} is not supported: use 'cpu' or 'cuda'")


def choose_backend(
    backend: str,
    device: str,
    availability: Callable[[str, str], backends.Availability] = backends.availability,
) -> tuple[str, str]:
    """The backend to load and why: ``backend``, or for "auto" the first available one in
    fastmace.vocabulary's order (the order fm.md's planner follows too).

    ``availability(backend, device)`` says what can run (default: this machine).
    """
    if backend != "auto":
        found = availability(backend, device)
        if not found.available:
            raise backends.BackendUnavailableError(
                f"the {backend} backend is unavailable: {found.reason}"
            )
        return backend, f"asked for ({found.reason})"
    if not device.startswith("cuda"):
        return CPU_BACKEND, f"auto on the CPU: {CPU_BACKEND} is the fastest CPU backend"
    skipped = []
    for candidate in CUDA_BACKEND_ORDER:
        found = availability(candidate, device)
        if found.available:
            passed = "; ".join(skipped)
            return candidate, f"auto: the fastest available{f' ({passed})' if passed else ''}"
        skipped.append(f"{candidate} unavailable: {found.reason}")
    raise AssertionError("e3nn is always available")


def _is_url(text: str) -> bool:
    return text.startswith(("https://", "http://"))


def load(
    model: str | os.PathLike[str],
    *,
    head: str | None = None,
    checkpoint: str | os.PathLike[str] | None = None,
    download: bool = False,
    sha256: str | None = None,
    trusted: bool = False,
    backend: str = "auto",
    device: str = "cpu",
    dtype: str | torch.dtype | None = None,
    seed: int = 0,
    progress: TextIO | None = None,
) -> LoadedModel:
    """Find, verify, load and convert a MACE model.

    ``model`` is a label of the table (``"mh-1"``, ``"mh-1:omat_pbe"``, ``"demo-emt-cu"``), a
    template (``"template:mp0-medium"``, random weights from ``seed``), a path, or an https URL.
    A label's file is looked for at ``checkpoint=``, in ``$FASTMACE_MODELS``, in the cache and,
    only with ``download=True``, at its official URL; its SHA-256 must match the table. A
    path or URL needs ``sha256=`` or ``trusted=True``, because loading a checkpoint runs code
    from it. ``backend`` is ``"auto"``, ``"e3nn"``, ``"cueq"``, ``"oeq"`` or ``"hybrid"``;
    every converted model is checked against the e3nn model. ``dtype`` defaults to the
    checkpoint's. Nothing process-wide is changed (default dtype, environment, warnings).
    """
    check_trust_options(sha256, trusted)
    want_dtype = _parse_dtype(dtype)
    _check_device(device)
    chosen, reason = choose_backend(backend, device)
    started = time.perf_counter()
    text = os.fspath(model)
    checkpoint_entry: Checkpoint | None = None
    file: ModelFile | None = None
    if text.startswith("template:"):
        source = f"{text}:{seed}"
        read = functools.partial(template, text.removeprefix("template:"), seed=seed)
        name, licence = f"{text} (seed {seed})", "none (random weights)"
        functional = None
    elif _is_url(text):
        file = locate_url(text, sha256, trusted, progress=progress)
        name, licence, functional = text, "unknown (your file)", None
    elif find_checkpoint(text.partition(":")[0]) is not None:
        checkpoint_entry, table_head = resolve_label(text)
        if head is not None:
            table_head = checkpoint_entry.head(head)
        explicit = Path(checkpoint) if checkpoint is not None else None
        file = locate_label_file(checkpoint_entry, explicit, download, trusted, progress=progress)
        name, licence = checkpoint_entry.id, licence_name(checkpoint_entry.licence)
        head, functional = table_head.name, table_head.functional
    else:
        path = Path(text).expanduser()
        if not path.exists():
            resolve_label(text)  # raises UnknownLabelError with suggestions
        file = verify(path, sha256, "path", trusted)
        name, licence, functional = str(path), "unknown (your file)", None
    if file is not None:
        source, read = f"file-sha256:{file.sha256}", functools.partial(load_checkpoint, file)
    timings = {"read_s": time.perf_counter() - started}
    # A warm start: this source was loaded and converted here before, and the conversion kept.
    kept = _kept_from_source(source, head, chosen, backend, device, want_dtype)
    if kept is not None:
        converted, check, description, head = kept
        timings["reused_s"] = time.perf_counter() - started - timings["read_s"]
        reference_loader = _checkpoint_reader(file) if file is not None else read
        reference = None
    else:
        reference = read()
        description = describe(reference)
        if backend == "auto" and description.model_type in LONG_RANGE_MODEL_TYPES:
            # Its long-range part is checked against mace-torch on e3nn only
            # (docs/validation/polar.md); ask for another backend by name to try it.
            chosen = CPU_BACKEND
            reason = f"auto: a {description.model_type} runs on e3nn (docs/validation/polar.md)"
        asked_head, head = head, _resolve_head(head, description)
        timings["read_s"] = time.perf_counter() - started
        converted, check, entry = _convert_or_reuse(
            reference, chosen, device, want_dtype, head, description.content_hash, timings
        )
        if entry is not None:  # so that a warm start need not read the source
            record = converted_cache.SourceRecord(entry, asdict(description), head)
            key = converted_cache.source_key(
                source, asked_head, chosen, device, _dtype_asked(want_dtype)
            )
            converted_cache.write_source(key, record)
        reference_loader = functools.partial(_given, reference)
    # One constant per cuEquivariance path table rather than one per element: seconds of
    # tracing saved at every compiled start (cueq_constants).
    path_tables_as_constants(converted)
    if file is not None:
        file = file.without_content()  # loaded: keep the record, not the bytes
    origin: dict = {"model": text, "head": head, "seed": seed}
    if file is not None:
        origin.update(checkpoint=str(file.path), sha256=file.sha256, trusted=not file.verified)
        if checkpoint_entry is None:
            origin["model"] = str(file.path)
    loaded = LoadedModel(
        module=converted,
        reference_loader=reference_loader,
        name=name,
        head=head,
        head_functional=functional,
        description=description,
        backend=chosen,
        backend_reason=reason,
        device=device,
        dtype=dtype_name(model_dtype(converted)),
        checkpoint=checkpoint_entry,
        file=file,
        licence=licence,
        conversion_check=check,
        origin=origin,
        timings=timings,
    )
    if reference is not None:
        vars(loaded)["reference"] = reference  # read already: the cached property's value
    return loaded


def _given(module: torch.nn.Module) -> torch.nn.Module:
    return module


def _checkpoint_reader(file: ModelFile) -> Callable[[], torch.nn.Module]:
    """Unpickles ``file`` when called, from its path read again and checked against the hash
    it had (its bytes are not held meanwhile)."""
    return functools.partial(_read_again, file.without_content())


def _read_again(record: ModelFile) -> torch.nn.Module:
    return load_checkpoint(verify(record.path, record.sha256, record.source))


def _dtype_asked(dtype: torch.dtype | None) -> str:
    return "checkpoint's" if dtype is None else dtype_name(dtype)


def _kept_from_source(
    source: str,
    head: str | None,
    backend: str,
    asked_backend: str,
    device: str,
    dtype: torch.dtype | None,
) -> tuple[torch.nn.Module, backends.ConversionCheck, ModelDescription, str] | None:
    """The kept conversion of ``source`` (a checkpoint's bytes, or a template and seed) for
    this head, backend, device and dtype, with the model's description and head as recorded
    when it was made; None when there is none (the checkpoint is read and converted)."""
    if not converted_cache.kept_for(backend, device):
        return None
    key = converted_cache.source_key(source, head, backend, device, _dtype_asked(dtype))
    record = converted_cache.read_source(key)
    if record is None:
        return None
    description = ModelDescription(
        **{k: tuple(v) if isinstance(v, list) else v for k, v in record.description.items()}
    )
    if asked_backend == "auto" and description.model_type in LONG_RANGE_MODEL_TYPES:
        return None  # auto runs such a model on e3nn: read it as a cold start does
    kept = converted_cache.read(record.entry_key, device)
    if kept is None:
        return None
    return kept.module, kept.check, description, record.head


def _resolve_head(head: str | None, description: ModelDescription) -> str:
    if head is None:
        if len(description.heads) == 1:
            return description.heads[0]
        raise UnknownLabelError(
            f"the model has {len(description.heads)} heads ({', '.join(description.heads)}): "
            "choose one with head="
        )
    if head not in description.heads:
        raise UnknownLabelError(
            f"the model has no head {head!r}; its heads are: {', '.join(description.heads)}"
        )
    return head


def _convert_or_reuse(
    reference: torch.nn.Module,
    backend: str,
    device: str,
    dtype: torch.dtype | None,
    head: str,
    content_hash: str,
    timings: dict[str, float],
) -> tuple[torch.nn.Module, backends.ConversionCheck | None, str | None]:
    """``reference`` on ``backend``: from the cache root when this user converted and checked
    the same weights there before (models/converted_cache.py), else converted, checked and kept.
    ``timings`` gains convert_s and check_s, or reused_s when the kept one was read. The last
    item is the kept entry's key (None when nothing is kept)."""
    if not converted_cache.kept_for(backend, device):
        return *_convert(reference, backend, device, dtype, head, timings), None
    started = time.perf_counter()
    dtype_text = dtype_name(dtype if dtype is not None else model_dtype(reference))
    key = converted_cache.entry_key(content_hash, head, backend, device, dtype_text)
    kept = converted_cache.read(key, device)
    if kept is not None:
        timings["reused_s"] = time.perf_counter() - started
        return kept.module, kept.check, key
    converted, check = _convert(reference, backend, device, dtype, head, timings)
    # A conversion that failed its check has raised.
    written = check is not None and converted_cache.write(key, converted, check) is not None
    return converted, check, key if written else None


def _convert(
    reference: torch.nn.Module,
    backend: str,
    device: str,
    dtype: torch.dtype | None,
    head: str,
    timings: dict[str, float],
) -> tuple[torch.nn.Module, backends.ConversionCheck | None]:
    """``reference`` on ``backend``, checked against it; ``timings`` gains convert_s, check_s."""
    started = time.perf_counter()
    heads = list(getattr(reference, "heads", None) or [])
    if len(heads) > 1:
        # One head runs: keep only it, then convert and check against the full model.
        converted = backends.convert(backends.select_head(reference, head), backend, device, dtype)
    else:
        converted = backends.convert(reference, backend, device, dtype)
    timings["convert_s"] = time.perf_counter() - started
    if backend == "e3nn" and len(heads) <= 1:
        return converted, None  # the same kernels as the reference: nothing to compare
    started = time.perf_counter()
    check = backends.check_conversion(reference, converted, backend, head)
    timings["check_s"] = time.perf_counter() - started
    if not check.passed:
        what = (
            f"the single-head {backend} model for head {head!r} disagrees with the multi-head "
            "e3nn model"
            if len(heads) > 1
            else f"the {backend} model disagrees with the e3nn model"
        )
        raise backends.ConversionCheckError(
            f"{what} beyond {check.dtype} rounding: " + check.errors()
        )
    return converted, check
