"""cuEquivariance's symmetric-contraction descriptors, kept on disk from one process to the next.

Converting a model to cuEquivariance builds, for each product block, the descriptor of its
symmetric contraction (cuEquivariance's ``_symmetric_contraction_cached``: Wigner 3nj symbols,
rational rounding, operand symmetrisation). That is pure Python and takes seconds in every new
process: 14 s for MP-0 medium's first block on the 2-core development machine, the largest
share of the model load on the H200 machine (docs/validation/performance.md). The result
depends only on the irreps, the degrees and cuEquivariance's version; it pickles to about
30 kB and unpickles in a millisecond.

Within :func:`descriptors_cached_on_disk` that function answers from
``<cache>/compile/cueq/``, and fills it on a miss. The patch is on the library's module for the
block only, and only for cuEquivariance versions it was checked with; anything unexpected (no
such function, an unreadable or damaged entry) falls back to the library's own computation.
The entries hold the library's own objects, so they are read with pickle: like Inductor's
and Triton's caches, the cache directory is trusted as the user's own.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import pickle
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from fastmace.io.atomic import atomic_write
from fastmace.runtime.cache import cache_dir

MODULE = "cuequivariance.group_theory.experimental.mace.symmetric_contractions"
FUNCTION = "_symmetric_contraction_cached"
CHECKED_VERSIONS = ("0.13.",)  # cuEquivariance versions whose function this replaces


@contextlib.contextmanager
def descriptors_cached_on_disk() -> Iterator[None]:
    """Within the block, cuEquivariance's symmetric-contraction descriptors come from the
    cache root when they were built before (by any process), and are kept there when not."""
    version = _cuequivariance_version()
    module = _library_module() if version and version.startswith(CHECKED_VERSIONS) else None
    original = getattr(module, FUNCTION, None)
    if module is None or original is None:
        yield
        return
    setattr(module, FUNCTION, _kept_on_disk(original, version))
    try:
        yield
    finally:
        setattr(module, FUNCTION, original)


def entry_path(version: str, irreps_in: Any, irreps_out: Any, degrees: tuple[int, ...]) -> Path:
    """Where the descriptor of these arguments is kept (the key covers all of them)."""
    key = repr((version, repr(irreps_in), repr(irreps_out), tuple(degrees)))
    name = hashlib.sha256(key.encode()).hexdigest()[:32]
    return cache_dir("compile", "cueq") / f"symmetric-contraction-{name}.pickle"


def _kept_on_disk(original: Callable[..., Any], version: str) -> Callable[..., Any]:
    def descriptor(irreps_in: Any, irreps_out: Any, degrees: tuple[int, ...]) -> Any:
        path = entry_path(version, irreps_in, irreps_out, degrees)
        kept = _read(path)
        if kept is not None:
            return kept
        built = original(irreps_in, irreps_out, degrees)
        with contextlib.suppress(OSError, pickle.PicklingError):  # a cache that cannot be
            atomic_write(path, lambda stream: pickle.dump(built, stream))  # written costs time
        return built

    return descriptor


def _read(path: Path) -> Any | None:
    """The kept (polynomial, projection) pair, or None when absent or not readable as one."""
    try:
        kept = pickle.loads(path.read_bytes())
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError, ValueError):
        return None
    return kept if isinstance(kept, tuple) and len(kept) == 2 else None


def _library_module() -> Any | None:
    try:
        return importlib.import_module(MODULE)
    except ImportError:
        return None


def _cuequivariance_version() -> str | None:
    try:
        return metadata.version("cuequivariance")
    except metadata.PackageNotFoundError:
        return None
