"""Prepare a process for OpenEquivariance's host extension, once, before mace-torch imports it.

mace-torch imports OpenEquivariance, and OpenEquivariance loads (or JIT-builds) its host
extension at import. :func:`importing_openequivariance` wraps that import:

1. decide how the extension is obtained (:mod:`fastmace.oeq.choice`);
2. point ``TORCH_EXTENSIONS_DIR`` at a fresh per-process directory, so a stale ``lock`` left
   by a killed build elsewhere never stalls the import (OEq waits 300 s for one);
3. with a driver and a usable method: the stand-in CUDA home (:mod:`fastmace.oeq.cuda_home`)
   and the build variables of docs/environment.md. All these variables are set only while
   mace-torch is imported (when OEq reads them) and restored afterwards, so loading a model
   leaves the process environment as it was; they are kept in the record;
4. answer OEq's ``cpp_extension.load("libtorch_tp_jit", ...)`` with the prebuilt library, the
   build-once cache (:mod:`fastmace.oeq.build_cache`), or a clear error (OEq catches it and
   the hybrid backend is reported unavailable with that reason).

What happened is kept in :func:`record` (``software.oeq_extension`` in metadata.json): how the
extension was obtained (``prebuilt``, ``built``, ``reused``, ``raced``, ``in-process``,
``unavailable``, ``failed``), its path, why the wheel was skipped, the variables set.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import shutil
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from importlib import util as importlib_util
from pathlib import Path
from types import ModuleType
from typing import Any

from fastmace.oeq import build_cache, choice, toolchain
from fastmace.oeq.cuda_home import CudaHome, prepare_cuda_home
from fastmace.oeq.extension_loader import (
    EXTENSION_NAME,
    LOADER_MODULE,
    intercepting_extension_load,
)
from fastmace.oeq.stderr_filter import stderr_lines_dropped
from fastmace.runtime import environment
from fastmace.runtime.cache import cache_dir, cache_root
from fastmace.runtime.quiet import Noise, warnings_silenced

PREBUILT, IN_PROCESS, UNAVAILABLE, FAILED = "prebuilt", "in-process", "unavailable", "failed"
# OpenEquivariance 0.7.0's import notice, which lists its reasons first ("Environment variable
# OEQ_JIT_EXTENSION=1 is set.", set by FastMACE on a GPU; "Precompiled extension shared object
# not found.") and then says it falls back to a JIT build: matched wherever that sentence is.
_OEQ_FALLBACK_NOTICE = r"(?s).*falling back to JIT compilation of OpenEquivariance extension"
_OEQ_FALLBACK = Noise(
    UserWarning,
    _OEQ_FALLBACK_NOTICE,
    "FastMACE answers OpenEquivariance's extension load itself: no JIT build, no lock wait.",
)
# What OpenEquivariance prints (not warns) at import when it has no package metadata (a source
# tree on PYTHONPATH); metadata.json records the version as unknown instead (provenance.py).
_OEQ_VERSION_NOTICE = "Warning: Could not determine oeq version"


@dataclass
class OeqExtensionRecord:
    """How this process obtained OpenEquivariance's host extension."""

    how: str = "not loaded yet"
    path: str | None = None
    reason: str = ""
    method: str | None = None
    prebuilt_skipped: str | None = None
    built_for_torch: str | None = None
    """For the prebuilt library chosen: the torch it was compiled against (its manifest)."""
    key: str | None = None
    cuda_home: str | None = None
    variables: dict[str, str] = field(default_factory=dict)

    @property
    def loaded(self) -> bool:
        return self.how in (PREBUILT, build_cache.BUILT, build_cache.REUSED,
                            build_cache.RACED, IN_PROCESS)  # fmt: skip

    def summary(self) -> str:
        """``host extension: prebuilt (<path>, built for torch 2.11.0+cu130)``, or
        ``host extension: built (<path>)``..."""
        built_for = f", built for torch {self.built_for_torch}" if self.built_for_torch else ""
        where = f" ({self.path}{built_for})" if self.path else ""
        why = f": {self.reason}" if self.reason and not self.loaded else ""
        return f"host extension: {self.how}{where}{why}"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "summary": self.summary()}


_record: OeqExtensionRecord | None = None
_choice: choice.HostExtensionChoice | None = None  # decided once, by prepare_in_process
_private_dir: Path | None = None


def record() -> OeqExtensionRecord | None:
    """What this process did about the host extension; None if OEq was never prepared."""
    return _record


def _private_extensions_dir(oeq_cache: Path) -> Path:
    global _private_dir
    if _private_dir is None:
        _private_dir = oeq_cache / f"torch-extensions-{os.getpid()}-{secrets.token_hex(4)}"
    return _private_dir


def _remove_private_dir() -> None:
    if _private_dir is not None:
        shutil.rmtree(_private_dir, ignore_errors=True)


def _build_variables(home: CudaHome, found: choice.HostExtensionChoice) -> dict[str, str]:
    """The variables of docs/environment.md that make OEq build or load without nvcc."""
    variables = {"CUDA_HOME": str(home.root), "CUDA_PATH": str(home.root)}
    for name in ("CUDACXX", "CMAKE_CUDA_COMPILER", "PYTORCH_NVCC"):
        variables[name] = str(home.nvcc)
    variables["PATH"] = os.pathsep.join(
        filter(None, [str(home.nvcc.parent), os.environ.get("PATH")])
    )
    variables["CPATH"] = os.pathsep.join(filter(None, [str(home.include), os.environ.get("CPATH")]))
    variables["OEQ_JIT_EXTENSION"] = "1"  # OEq's loader goes through libtorch_tp_jit
    variables["OEQ_NVCC_ATTEMPTS"] = str(home.attempts_log)
    if found.compiler and not os.environ.get("CXX"):
        variables["CXX"] = found.compiler
    if not os.environ.get("MAX_JOBS"):
        variables["MAX_JOBS"] = str(environment.max_jobs())
    return variables


@contextlib.contextmanager
def _variables_set(variables: dict[str, str]) -> Iterator[None]:
    """Set ``variables`` for the block only: OEq reads them while it is imported, and after
    that nothing of the user's process should see our stand-in (fm.load changes nothing)."""
    before = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def prepare_in_process() -> OeqExtensionRecord | None:
    """Steps 1-3 above, once per process; None when OpenEquivariance is not installed."""
    global _record, _choice
    if _record is not None:
        return _record
    if importlib_util.find_spec("openequivariance") is None:
        return None
    if LOADER_MODULE in sys.modules:
        _record = OeqExtensionRecord(
            IN_PROCESS, reason="OpenEquivariance was imported before FastMACE prepared it"
        )
        return _record
    found = _choice = choice.choose_host_extension()
    oeq_cache = cache_root().path / "oeq"  # created only when something is written there
    # OEq creates its build directory under it even to look for a lock: removed at exit.
    atexit.register(_remove_private_dir)
    _record = OeqExtensionRecord(
        method=found.method, prebuilt_skipped=found.prebuilt_skipped, reason=found.reason,
        built_for_torch=found.prebuilt.built_for_torch if found.prebuilt else None,
    )  # fmt: skip
    # A fresh per-process directory: a stale build lock elsewhere cannot stall the import.
    _record.variables = {"TORCH_EXTENSIONS_DIR": str(_private_extensions_dir(oeq_cache))}
    if found.usable and found.driver is not None:
        lib_dir = toolchain.nvidia_wheel_lib_dir()
        if lib_dir is not None:
            includes = toolchain.cuda_wheel_include_dirs()
            home = prepare_cuda_home(oeq_cache, includes, lib_dir, found.driver)
            _record.variables.update(_build_variables(home, found))
            _record.cuda_home = str(home.root)
    return _record


def _with_stand_in(options: dict[str, Any], home: Path | None) -> dict[str, Any]:
    """OEq's load options plus the stand-in's headers and libraries.

    torch reads CUDA_HOME when ``torch.utils.cpp_extension`` is first imported; if that was
    before we set it, OEq's include and library paths miss the stand-in: add them explicitly.
    """
    if home is None:
        return options
    options = dict(options)
    options["extra_include_paths"] = [*options.get("extra_include_paths", []), f"{home}/include"]
    options["extra_ldflags"] = [*options.get("extra_ldflags", []), f"-L{home}/lib64"]
    return options


def _provide(real_load: Any, sources: list, options: dict[str, Any]) -> ModuleType:
    """Step 4: answer OEq's load call, recording the outcome; raise to report unavailability."""
    assert _record is not None and _choice is not None
    found = _choice  # the same decision prepare_in_process recorded (no second library hash)
    if not found.usable:
        _record.how, _record.reason = UNAVAILABLE, found.reason
        raise RuntimeError(f"FastMACE: OpenEquivariance's host extension: {found.reason}")
    if found.driver is None:
        _record.how = UNAVAILABLE
        _record.reason = f"no CUDA driver library (libcuda.so.1): {found.driver_source}"
        raise RuntimeError(f"FastMACE: OpenEquivariance needs a GPU driver: {_record.reason}")
    try:
        if found.method == choice.PREBUILT:
            assert found.prebuilt is not None
            module = build_cache.import_library(EXTENSION_NAME, found.prebuilt.library)
            _record.how, _record.path = PREBUILT, str(found.prebuilt.library)
            return module
        assert found.compiler is not None
        oeq_cache = cache_dir("oeq")
        private = _private_extensions_dir(oeq_cache)
        private.mkdir(parents=True, exist_ok=True)
        home = Path(_record.cuda_home) if _record.cuda_home else None
        result = build_cache.build_once(
            real_load, EXTENSION_NAME, sources, _with_stand_in(options, home),
            extensions_dir=oeq_cache / "extensions", private_dir=private,
            compiler=found.compiler,
        )  # fmt: skip
    except Exception as error:
        _record.how, _record.reason = FAILED, f"{type(error).__name__}: {error}"
        raise
    _record.how, _record.path, _record.key = result.outcome, str(result.library), result.key
    return result.module


@contextlib.contextmanager
def importing_openequivariance() -> Iterator[None]:
    """Wrap the first import of mace-torch (and so of OpenEquivariance) in this process."""
    prepared = prepare_in_process()
    if prepared is None or prepared.how != "not loaded yet" or LOADER_MODULE in sys.modules:
        yield
        return
    # OEq warns that it falls back to a JIT build that may wait 5 minutes for a build lock,
    # whatever backend is asked for (mace-torch imports it): FastMACE answers that load itself
    # (_provide: prebuilt, build-once cache in a private directory, or "unavailable"), so no
    # such wait happens. How the extension was obtained is kept in record() (metadata.json).
    with (
        _variables_set(prepared.variables),
        intercepting_extension_load(_provide),
        stderr_lines_dropped(_OEQ_VERSION_NOTICE),
        warnings_silenced((_OEQ_FALLBACK,)),
    ):
        yield
