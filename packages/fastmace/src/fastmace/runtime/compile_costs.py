"""What compiling a model cost here last time: the planner's estimate for the next run.

torch.compile's own caches (Inductor's, in ``<cache root>/inductor``) make a second compilation
of the same model at the same size cheaper; whether it pays back within a run depends on how
much cheaper. Each run that compiles records the seconds its first compiled call took, keyed
by what the compilation depends on (the model's weights hash, backend, dtype, atoms, GPU and
torch), and the next plan for the same key reads that figure instead of the cold estimate.

The records are data only: one small JSON file per key under ``<cache root>/compile/costs``,
written atomically and never unpickled. A damaged, foreign or unreadable record counts as no
record (the cold estimate), so the worst a planted file can do is change one plan decision,
which the report states with its reason.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from fastmace.runtime.cache import (
    AHEAD_OF_TIME_PACKAGES,
    CacheLocationError,
    cache_dir,
    cache_root,
)
from fastmace.runtime.environment import compiled_graphs_directory

COSTS = ("compile", "costs")
FORMAT = 1


@dataclass(frozen=True)
class CompileIdentity:
    """What a compilation depends on: a different value of any field compiles anew."""

    model_hash: str
    backend: str
    dtype: str
    n_atoms: int
    gpu: str
    torch: str

    def key(self) -> str:
        """A file name for this identity: a digest of its fields."""
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:32]


def _path(identity: CompileIdentity, environ: Mapping[str, str] | None) -> Path:
    return cache_root(environ).path.joinpath(*COSTS, f"{identity.key()}.json")


def recorded_cost_s(
    identity: CompileIdentity, environ: Mapping[str, str] | None = None
) -> float | None:
    """The seconds the last compilation of ``identity`` took here, or None when there is no
    usable record (never compiled, unreadable, damaged, or written for another identity)."""
    try:
        data = json.loads(_path(identity, environ).read_text())
    except (OSError, ValueError, CacheLocationError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    if data.get("identity") != asdict(identity):
        return None
    seconds = data.get("seconds")
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        return None
    return float(seconds) if math.isfinite(seconds) and seconds >= 0 else None


def warm_cost_s(
    identity: CompileIdentity, environ: Mapping[str, str] | None = None
) -> float | None:
    """:func:`recorded_cost_s`, but only while the cache root still holds compiled code
    (Inductor's graphs, or a package compiled ahead of time): a record describes a compilation
    that found those files, so with them gone (the cache emptied by hand, or Inductor pointed
    elsewhere) the next compilation is a cold one and the record says nothing about it."""
    return recorded_cost_s(identity, environ) if compiled_code_kept(environ) else None


def compiled_code_kept(environ: Mapping[str, str] | None = None) -> bool:
    """Whether Inductor's graph cache or the packages compiled ahead of time hold any file."""
    env = os.environ if environ is None else environ
    try:
        root = cache_root(environ).path
    except CacheLocationError:
        return False
    graphs = compiled_graphs_directory(root, env) / "fxgraph"
    for directory in (graphs, root.joinpath(*AHEAD_OF_TIME_PACKAGES)):
        try:
            if any(path.is_file() for path in directory.rglob("*")):
                return True
        except OSError:
            continue
    return False


def record_cost_s(
    identity: CompileIdentity, seconds: float, environ: Mapping[str, str] | None = None
) -> bool:
    """Keep ``seconds`` as the cost of compiling ``identity``; False when the cache root cannot
    be written (the run goes on; the next plan uses the cold estimate)."""
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"a compilation's cost must be finite seconds >= 0, got {seconds!r}")
    record = {"format": FORMAT, "identity": asdict(identity), "seconds": round(seconds, 3)}
    try:
        directory = cache_dir(*COSTS, environ=environ)
        handle, temporary = tempfile.mkstemp(prefix=".cost-", dir=directory)
    except (OSError, CacheLocationError):
        return False
    try:
        with os.fdopen(handle, "w") as file:
            json.dump(record, file)
        os.replace(temporary, directory / f"{identity.key()}.json")
    except OSError:
        Path(temporary).unlink(missing_ok=True)
        return False
    return True


def recorded_costs(
    environ: Mapping[str, str] | None = None,
) -> Iterator[tuple[CompileIdentity, float]]:
    """Every usable record in the cache root, for ``fastmace doctor`` (damaged ones skipped)."""
    try:
        directory = cache_root(environ).path.joinpath(*COSTS)
        paths = sorted(directory.glob("*.json"))
    except (OSError, CacheLocationError):
        return
    for path in paths:
        try:
            data = json.loads(path.read_text())
            identity = CompileIdentity(**data["identity"])
        except (OSError, ValueError, TypeError, KeyError):
            continue
        seconds = recorded_cost_s(identity, environ)
        if seconds is not None and path.stem == identity.key():
            yield identity, seconds
