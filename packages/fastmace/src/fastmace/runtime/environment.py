"""Every environment variable FastMACE reads or sets, with its parsing and its error message.

This module is the only place that touches ``os.environ`` on FastMACE's behalf. Readers parse
at the point of use and raise :class:`EnvironmentVariableError` naming the variable, the value
and what is allowed. Writers set a variable only as docs/environment.md says (mostly: only
where the user has not set it) and keep a record of what they did, for ``metadata.json``.
"""

from __future__ import annotations

import getpass
import os
import re
import tempfile
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


class EnvironmentVariableError(ValueError):
    """An environment variable holds a value FastMACE cannot use."""

    def __init__(self, name: str, value: str, allowed: str) -> None:
        super().__init__(f"{name}={value!r} is not allowed: {allowed}")
        self.name = name
        self.value = value
        self.allowed = allowed


@dataclass(frozen=True)
class Variable:
    """A variable of the tables in docs/environment.md."""

    name: str
    values: str
    default: str


# Variables FastMACE reads.
FASTMACE_CACHE = Variable("FASTMACE_CACHE", "a directory", "the user cache directory")
FASTMACE_MODELS = Variable("FASTMACE_MODELS", "a directory", "unset")
FASTMACE_SOFT_FILE_LOCKS = Variable("FASTMACE_SOFT_FILE_LOCKS", "unset, 1 or 0", "unset")
FASTMACE_OEQ_PREBUILT = Variable("FASTMACE_OEQ_PREBUILT", "unset, 0 or 1", "unset")
OEQ_CUDA_DRIVER_LIBRARY = Variable(
    "OEQ_CUDA_DRIVER_LIBRARY", "the path of libcuda.so.1", "the loader's search"
)
MAX_JOBS = Variable("MAX_JOBS", "a positive integer", "4")
TORCH_EXTENSIONS_DIR = Variable(
    "TORCH_EXTENSIONS_DIR", "a directory", "$XDG_CACHE_HOME/torch_extensions"
)
CUDA_CACHE_PATH = Variable("CUDA_CACHE_PATH", "a directory", "~/.nv/ComputeCache")
CUDA_CACHE_DISABLE = Variable("CUDA_CACHE_DISABLE", "0 or 1", "unset")
XDG_CACHE_HOME = Variable("XDG_CACHE_HOME", "a directory", "~/.cache")
HOME = Variable("HOME", "a directory", "the user's home")
LOCALAPPDATA = Variable("LOCALAPPDATA", "a directory", "set by Windows")
PYTORCH_CUDA_ALLOC_CONF = Variable("PYTORCH_CUDA_ALLOC_CONF", "PyTorch's syntax", "unset")
TORCHINDUCTOR_CACHE_DIR = Variable("TORCHINDUCTOR_CACHE_DIR", "a directory", "<cache>/inductor")
TRITON_CACHE_DIR = Variable("TRITON_CACHE_DIR", "a directory", "<cache>/triton")

READ = (
    FASTMACE_CACHE, FASTMACE_MODELS, FASTMACE_SOFT_FILE_LOCKS, FASTMACE_OEQ_PREBUILT,
    OEQ_CUDA_DRIVER_LIBRARY, MAX_JOBS, TORCH_EXTENSIONS_DIR, CUDA_CACHE_PATH,
    CUDA_CACHE_DISABLE, XDG_CACHE_HOME, HOME, LOCALAPPDATA, PYTORCH_CUDA_ALLOC_CONF,
    TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR,
)  # fmt: skip

# Variables FastMACE sets, grouped by the occasion (see docs/environment.md).
COMPILE_CACHE_FLAGS = (
    "TORCHINDUCTOR_FX_GRAPH_CACHE",
    "ENABLE_AOT_AUTOGRAD_CACHE",
    "TORCHINDUCTOR_AUTOGRAD_CACHE",
)
# What a plan sets: written once here, read by the planner to report and by configure_* to set.
EXPANDABLE_SEGMENTS = "expandable_segments:True"
FP64_EMULATION_VALUES = {
    "CUBLAS_EMULATE_DOUBLE_PRECISION": "1",
    "CUBLAS_EMULATION_STRATEGY": "eager",
}
FP64_EMULATION = tuple(FP64_EMULATION_VALUES)
FP64_EMULATION_BITS = "CUBLAS_FIXEDPOINT_EMULATION_MANTISSA_BIT_COUNT"
# cuEquivariance-ops picks each uniform_1d kernel by timing candidates on the first call at a
# new size, which at 13,824 atoms costs seconds before every first step and every regrowth;
# this value fixes the choice. Measured on an H200 with cuequivariance-ops 0.13 (docs/planner.md):
# set-up 20.2 s -> 5.5 s at 13,824 atoms, steps/s within 1 % at 216, 1,728 and 13,824 atoms.
CUEQ_KERNEL_CHOICE = "CUEQUIVARIANCE_OPS_U1D_ALGOS"
CUEQ_KERNEL_CHOICE_VALUE = "2"
CUEQ_KERNEL_CHOICE_MEASURED = ("0.13.",)  # versions the value was measured with
# Where cuEquivariance-ops keeps the kernels it compiles with NVRTC at their first call; unset,
# it keeps none, and every process compiles them again.
CUEQ_KERNEL_CACHE = "CUEQUIVARIANCE_OPS_NVRTC_CACHE_DIR"
# Variables read when they are used, not when CUDA starts: setting them in a process where
# CUDA already runs still works. cuEquivariance-ops reads its kernel choice when it plans an
# operation: set in-process after CUDA had started, set-up at 13,824 atoms took 5.7 s, as
# with the variable set before the process (5.5 s), against 20.2 s without (H200, 2026-12-01).
READ_WHEN_USED = frozenset({CUEQ_KERNEL_CHOICE})
REPRODUCIBLE = {
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    "TORCHINDUCTOR_DETERMINISTIC": "1",
    CUEQ_KERNEL_CHOICE: "1,1",
}
OEQ_BUILD = (
    "CUDA_HOME", "CUDA_PATH", "CUDACXX", "CMAKE_CUDA_COMPILER", "PYTORCH_NVCC", "PATH", "CPATH",
    "CXX", "OEQ_JIT_EXTENSION", "OEQ_NVCC_ATTEMPTS", "MAX_JOBS", "TORCH_EXTENSIONS_DIR",
)  # fmt: skip
CHILD_PROCESS = ("PYTHONPATH",)

SET = (
    CUDA_CACHE_DISABLE.name,
    TORCHINDUCTOR_CACHE_DIR.name,
    TRITON_CACHE_DIR.name,
    *COMPILE_CACHE_FLAGS,
    PYTORCH_CUDA_ALLOC_CONF.name,
    *FP64_EMULATION,
    FP64_EMULATION_BITS,
    *REPRODUCIBLE,
    CUEQ_KERNEL_CACHE,
    *OEQ_BUILD,
    *CHILD_PROCESS,
)


@dataclass(frozen=True)
class Change:
    """One variable FastMACE set or deliberately left alone, and why."""

    name: str
    before: str | None
    after: str | None
    reason: str


# What this process's FastMACE did to its environment, oldest first (metadata.json lists it).
_changes: list[Change] = []


def changes() -> tuple[Change, ...]:
    """Every variable FastMACE set (or kept) in this process, oldest first."""
    return tuple(_changes)


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def _value(name: str, environ: Mapping[str, str] | None) -> str | None:
    # An empty value means "unset" for every variable we read, as in most shells' conventions.
    value = _env(environ).get(name)
    return value if value else None


def _switch(variable: Variable, environ: Mapping[str, str] | None) -> bool | None:
    value = _value(variable.name, environ)
    if value is None:
        return None
    if value in ("0", "1"):
        return value == "1"
    raise EnvironmentVariableError(variable.name, value, "leave it unset, or set it to 1 or 0")


def soft_file_locks(environ: Mapping[str, str] | None = None) -> bool | None:
    """FASTMACE_SOFT_FILE_LOCKS: None when unset, else whether soft locks are demanded."""
    return _switch(FASTMACE_SOFT_FILE_LOCKS, environ)


def oeq_prebuilt(environ: Mapping[str, str] | None = None) -> bool | None:
    """FASTMACE_OEQ_PREBUILT: None (use the wheel when it matches), False (never), True (only)."""
    return _switch(FASTMACE_OEQ_PREBUILT, environ)


def _absolute_path(variable: Variable, environ: Mapping[str, str] | None) -> Path | None:
    value = _value(variable.name, environ)
    if value is None:
        return None
    expanded = expand_user(value, environ)
    if not os.path.isabs(expanded):
        raise EnvironmentVariableError(variable.name, value, "give an absolute path")
    return Path(expanded)


def cache_override(environ: Mapping[str, str] | None = None) -> Path | None:
    """FASTMACE_CACHE with ``~`` expanded, or None."""
    return _absolute_path(FASTMACE_CACHE, environ)


def models_directory(environ: Mapping[str, str] | None = None) -> Path | None:
    """FASTMACE_MODELS with ``~`` expanded, or None."""
    return _absolute_path(FASTMACE_MODELS, environ)


def cuda_driver_library(environ: Mapping[str, str] | None = None) -> Path | None:
    """OEQ_CUDA_DRIVER_LIBRARY, or None to search the way the loader does."""
    return _absolute_path(OEQ_CUDA_DRIVER_LIBRARY, environ)


def expand_user(value: str, environ: Mapping[str, str] | None = None) -> str:
    """Expand a leading ``~`` with the given environment's HOME (``~name`` as the OS does)."""
    if value == "~" or value.startswith("~/"):
        return str(home(environ)) + value[1:]
    return os.path.expanduser(value)


def max_jobs(environ: Mapping[str, str] | None = None) -> int:
    """MAX_JOBS, the parallel compile jobs of the OpenEquivariance host build (default 4)."""
    value = _value(MAX_JOBS.name, environ)
    if value is None:
        return 4
    if value.isdigit() and int(value) > 0:
        return int(value)
    raise EnvironmentVariableError(MAX_JOBS.name, value, "set it to a positive integer, e.g. 4")


def xdg_cache_home(environ: Mapping[str, str] | None = None) -> Path:
    """$XDG_CACHE_HOME, or ~/.cache where it is unset or not absolute (as the XDG spec says)."""
    value = _value(XDG_CACHE_HOME.name, environ)
    if value is not None and os.path.isabs(value):
        return Path(value)
    return home(environ) / ".cache"


def home(environ: Mapping[str, str] | None = None) -> Path:
    """$HOME, or the password database's home directory where it is unset."""
    value = _value(HOME.name, environ)
    return Path(value) if value is not None else Path(os.path.expanduser("~"))


def torch_extensions_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where PyTorch builds C++ extensions: TORCH_EXTENSIONS_DIR or its default."""
    explicit = _absolute_path(TORCH_EXTENSIONS_DIR, environ)
    return explicit if explicit is not None else xdg_cache_home(environ) / "torch_extensions"


def cuda_cache_path(environ: Mapping[str, str] | None = None) -> Path:
    """Where the CUDA driver keeps its JIT cache: CUDA_CACHE_PATH or ~/.nv/ComputeCache."""
    explicit = _absolute_path(CUDA_CACHE_PATH, environ)
    return explicit if explicit is not None else home(environ) / ".nv" / "ComputeCache"


def problems(environ: Mapping[str, str] | None = None) -> list[EnvironmentVariableError]:
    """Every variable FastMACE reads that holds a value it cannot use; empty when all are fine.

    A run checks this before it starts (and ``fastmace doctor`` reports it): ``import
    fastmace`` itself never raises for a bad value, so that the message reaches the user.
    """
    found = []
    for parse in _PARSERS:
        try:
            parse(environ)
        except EnvironmentVariableError as error:
            found.append(error)
    return found


def cuda_cache_disable(environ: Mapping[str, str] | None = None) -> str | None:
    """CUDA_CACHE_DISABLE as the user set it; any value counts as the user's decision."""
    return _env(environ).get(CUDA_CACHE_DISABLE.name)


# The parsers of the variables of READ whose values can be wrong (the others take any value).
_PARSERS = (
    soft_file_locks, oeq_prebuilt, cache_override, models_directory, cuda_driver_library,
    max_jobs, torch_extensions_dir, cuda_cache_path,
)  # fmt: skip


def inductor_default_cache_dir() -> str:
    """Inductor's own default cache directory, ``$TMPDIR/torchinductor_$USER``.

    Inductor replaces the characters of a user name that are not allowed in a path with ``_``.
    """
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return os.path.join(
        tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user)
    )


def set_if_unset(
    name: str, value: str, reason: str, environ: MutableMapping[str, str] | None = None
) -> bool:
    """Set ``name`` unless the user already did; record either outcome. True when it was set."""
    env = os.environ if environ is None else environ
    before = env.get(name)
    if before:
        _changes.append(Change(name, before, before, f"kept the user's value ({reason})"))
        return False
    env[name] = value
    _changes.append(Change(name, before, value, reason))
    return True


def overwrite(
    name: str, value: str, reason: str, environ: MutableMapping[str, str] | None = None
) -> None:
    """Set ``name`` whatever it held; only where docs/environment.md says FastMACE overwrites."""
    env = os.environ if environ is None else environ
    before = env.get(name)
    env[name] = value
    _changes.append(Change(name, before, value, reason))


@contextmanager
def restored(
    names: Iterable[str], environ: MutableMapping[str, str] | None = None
) -> Iterator[None]:
    """Put the variables ``names`` back as they were (set or unset) when the block ends."""
    env = os.environ if environ is None else environ
    saved = {name: env.get(name) for name in names}
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value


def child_environment(
    extra: Mapping[str, str] | None = None, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment of a child process FastMACE starts: a copy, never the parent's own.

    ``extra`` (``RunnerConfig.environment``) is applied over this process's environment; then
    the directory holding this FastMACE goes first on PYTHONPATH (before any entry of
    ``extra``'s or the user's), so the child imports the same FastMACE.
    """
    env = dict(_env(environ))
    env.update(extra or {})
    package_parent = str(Path(__file__).resolve().parents[2])  # .../fastmace/runtime/ -> ...
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, env.get("PYTHONPATH")]))
    return env


def compiled_graphs_directory(cache_root: Path, environ: Mapping[str, str]) -> Path:
    """Where FastMACE's compilations keep Inductor's files, as :func:`configure_compile_caches`
    sets it: ``TORCHINDUCTOR_CACHE_DIR``, unless unset or Inductor's own default (which lies
    in /tmp, wiped and not shared between the nodes of a cluster), else ``<cache root>/inductor``.
    """
    value = environ.get(TORCHINDUCTOR_CACHE_DIR.name)
    if not value or value == inductor_default_cache_dir():
        return cache_root / "inductor"
    return Path(value)


def configure_compile_caches(
    cache_root: Path, environ: MutableMapping[str, str] | None = None
) -> dict[str, str]:
    """Point Inductor and Triton at the cache root, before a plan's first compilation.

    A TORCHINDUCTOR_CACHE_DIR equal to Inductor's own default counts as unset: that default
    lies in /tmp, which is wiped and not shared between the nodes of a cluster.
    Returns the values in force afterwards.
    """
    env = os.environ if environ is None else environ
    directory = str(compiled_graphs_directory(cache_root, env))
    if env.get(TORCHINDUCTOR_CACHE_DIR.name) == inductor_default_cache_dir():
        overwrite(
            TORCHINDUCTOR_CACHE_DIR.name,
            directory,
            "the value was Inductor's own default, which counts as unset",
            env,
        )
    else:
        set_if_unset(
            TORCHINDUCTOR_CACHE_DIR.name, directory, "compiled graphs live in the cache root", env
        )
    set_if_unset(
        TRITON_CACHE_DIR.name,
        str(cache_root / "triton"),
        "Triton kernels live in the cache root",
        env,
    )
    for flag in COMPILE_CACHE_FLAGS:
        set_if_unset(flag, "1", "cache compiled graphs and the compiled force derivative", env)
    names = (TORCHINDUCTOR_CACHE_DIR.name, TRITON_CACHE_DIR.name, *COMPILE_CACHE_FLAGS)
    return {name: env[name] for name in names}


def configure_allocator(
    expandable_segments: bool, environ: MutableMapping[str, str] | None = None
) -> str | None:
    """Ask PyTorch's CUDA allocator for expandable segments, before the first allocation.

    The caller decides whether the plan wants them (torch 2.14 or newer); a value the user
    set is never changed. Returns the value in force.
    """
    env = os.environ if environ is None else environ
    if expandable_segments:
        set_if_unset(
            PYTORCH_CUDA_ALLOC_CONF.name,
            EXPANDABLE_SEGMENTS,
            "EngineConfig.expandable_segments is on",
            env,
        )
    return env.get(PYTORCH_CUDA_ALLOC_CONF.name)


def configure_fp64_emulation(
    mantissa_bits: int | None, environ: MutableMapping[str, str] | None = None
) -> dict[str, str]:
    """Let cuBLAS emulate float64 matrix products, for float64 plans with emulation on."""
    env = os.environ if environ is None else environ
    for name, value in FP64_EMULATION_VALUES.items():
        set_if_unset(name, value, "float64 plan with fp64 emulation", env)
    names = list(FP64_EMULATION)
    if mantissa_bits is not None:
        if not 1 <= mantissa_bits <= 79:
            raise ValueError(
                f"fp64_emulation_mantissa_bits={mantissa_bits} is out of range: use 1 to 79"
            )
        set_if_unset(FP64_EMULATION_BITS, str(mantissa_bits), "the plan's mantissa bits", env)
        names.append(FP64_EMULATION_BITS)
    return {name: env[name] for name in names}


def configure_cueq_kernel_choice(
    value: str, environ: MutableMapping[str, str] | None = None
) -> str | None:
    """Fix cuEquivariance-ops' uniform_1d kernel choice (the plan's measured value), unless the
    user chose one; it must be set before the first cuEquivariance call. Returns the value in force.
    """
    env = os.environ if environ is None else environ
    set_if_unset(CUEQ_KERNEL_CHOICE, value, "the plan's measured cuEquivariance kernel choice", env)
    return env.get(CUEQ_KERNEL_CHOICE)


def configure_cueq_kernel_cache(
    cache_root: Path, environ: MutableMapping[str, str] | None = None
) -> str:
    """Keep the kernels cuEquivariance-ops compiles in the cache root, unless the user chose a
    directory; set before its first CUDA call. Returns the value in force."""
    env = os.environ if environ is None else environ
    set_if_unset(
        CUEQ_KERNEL_CACHE,
        str(cache_root / "cueq-nvrtc"),
        "cuEquivariance's compiled kernels live in the cache root",
        env,
    )
    return env[CUEQ_KERNEL_CACHE]


def configure_reproducible(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Deterministic cuBLAS, Inductor and cuEquivariance algorithms; must run before CUDA starts.

    These overwrite the user's values: a run asked to be reproducible must be.
    """
    env = os.environ if environ is None else environ
    for name, value in REPRODUCIBLE.items():
        overwrite(name, value, "reproducible plan", env)
    return dict(REPRODUCIBLE)
