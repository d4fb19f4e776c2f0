"""cuEquivariance's symmetric-contraction descriptors, kept on disk from one process to the next.

Converting a model to cuEquivariance builds, for each product block, the descriptor of its
symmetric contraction (cuEquivariance's ``_symmetric_contraction_cached``: Wigner 3nj symbols,
rational rounding, operand symmetrisation) and mace-torch's projection onto it
(``symmetric_contraction_cached`` of ``mace.tools.cg_cueq_tools``, which despite its name
caches nothing). That is pure Python and takes seconds in every new process: 11.6 s for MP-0
medium's two descriptors on the 2-core development machine, the largest share of the model
load on the H200 machine (docs/validation/performance.md). Each result depends only on the
irreps, the degrees, the library's version and torch's default dtype (mace-torch's coupling
matrices are built in it); it pickles to tens of kB and unpickles in a millisecond.

Within :func:`descriptors_cached_on_disk` these functions answer from
``<cache>/compile/cueq/``, and fill it on a miss. The patch is on the library's module for the
block only, and only for library versions it was checked with; anything unexpected (no such
function, an unreadable or damaged entry) falls back to the library's own computation.
The entries hold the library's own objects, so they are read with pickle, and only when
their bytes are the ones this user recorded on writing them (runtime/vouched.py): an entry
planted in a shared cache root by someone else is ignored and built again.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from fastmace.runtime import vouched
from fastmace.runtime.atomic import atomic_write
from fastmace.runtime.cache import cache_dir


@dataclass(frozen=True)
class Builder:
    """A library function ``(irreps_in, irreps_out, degrees) -> (descriptor, projection)``."""

    module: str
    function: str
    package: str  # whose version keys the entries and is checked
    checked_versions: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.function.strip("_").replace("_", "-")


BUILDERS = (
    Builder(
        "cuequivariance.group_theory.experimental.mace.symmetric_contractions",
        "_symmetric_contraction_cached",
        "cuequivariance",
        ("0.13.",),
    ),
    Builder("mace.tools.cg_cueq_tools", "symmetric_contraction_cached", "mace-torch", ("0.3.",)),
)


# The Clebsch-Gordan coefficients behind every entry (fastmace.models.checkpoint's
# clebsch_gordan_in_float64), part of the key.
_COEFFICIENTS = "clebsch-gordan-float64"


@contextlib.contextmanager
def descriptors_cached_on_disk() -> Iterator[None]:
    """Within the block, the symmetric-contraction descriptors come from the cache root when
    they were built before (by any process), and are kept there when not."""
    with contextlib.ExitStack() as stack:
        for builder in BUILDERS:
            stack.enter_context(_kept_on_disk(builder))
        yield


@contextlib.contextmanager
def _kept_on_disk(builder: Builder) -> Iterator[None]:
    version = _version(builder.package)
    module = _module(builder.module) if version.startswith(builder.checked_versions) else None
    original = getattr(module, builder.function, None)
    if module is None or original is None:
        yield
        return
    setattr(module, builder.function, _answered_from_disk(builder, original, version))
    try:
        yield
    finally:
        setattr(module, builder.function, original)


def entry_path(
    builder: Builder, version: str, irreps_in: Any, irreps_out: Any, degrees: tuple[int, ...]
) -> Path:
    """Where the result of these arguments is kept (the key covers all of them, and torch's
    default dtype: mace-torch builds its coupling matrices in it, so a projection built for a
    float32 model is not precise enough for a float64 one). ``_COEFFICIENTS`` keeps out the
    entries written before the coefficients were float64 in every process: one written by a
    process that had built a float32 model first can be float32-rounded under a float64 key."""
    import torch

    key = repr(
        (builder.module, version, repr(irreps_in), repr(irreps_out), tuple(degrees),
         str(torch.get_default_dtype()), _COEFFICIENTS)
    )  # fmt: skip
    name = hashlib.sha256(key.encode()).hexdigest()[:32]
    return cache_dir("compile", "cueq") / f"{builder.name}-{name}.pickle"


def _answered_from_disk(
    builder: Builder, original: Callable[..., Any], version: str
) -> Callable[..., Any]:
    def descriptor(irreps_in: Any, irreps_out: Any, degrees: tuple[int, ...]) -> Any:
        path = entry_path(builder, version, irreps_in, irreps_out, degrees)
        kept = _read(path)
        if kept is not None:
            return kept
        built = original(irreps_in, irreps_out, degrees)
        with contextlib.suppress(OSError, pickle.PicklingError):  # a cache that cannot be
            data = pickle.dumps(built)  # written costs time
            atomic_write(path, lambda stream: stream.write(data))
            vouched.vouch(path, data)  # read back only by this user (runtime/vouched.py)
        return built

    return descriptor


def _read(path: Path) -> Any | None:
    """The kept (polynomial, projection) pair, or None when absent, not readable as one, or
    not written by this user: a pickle runs code, so only bytes this user vouched for are read
    (a shared cache root's entries from others are built again here)."""
    data = vouched.read_vouched(path)
    if data is None:
        return None
    try:
        kept = pickle.loads(data)
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError, ValueError):
        return None
    return kept if isinstance(kept, tuple) and len(kept) == 2 else None


def _module(name: str) -> Any | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return ""
