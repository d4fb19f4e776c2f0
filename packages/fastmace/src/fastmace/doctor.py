"""``fastmace doctor``: what is installed, what is missing, and how to fix it. Changes nothing.

One check per line, in a fixed order. A failed required check prints ``[FAIL]`` and makes the
exit code 1; a failed optional one prints ``[warn]``. Every failure names its fix. What only a
GPU uses (torch's CUDA build, cuEquivariance's CUDA kernels) is a warning on a machine without
one, since everything runs there on the CPU.

Doctor looks MACE and OpenEquivariance up without importing them (importing OpenEquivariance
builds its host extension), reads the cuEquivariance ops wheels' file lists instead of
importing them (the import creates a Triton cache directory), creates no cache directory and
deletes no lock file. It imports torch, for the GPU check.
"""

from __future__ import annotations

import os
import re
import sys
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from importlib import metadata
from importlib import util as importlib_util
from pathlib import Path
from typing import Any, TextIO

from fastmace import runtime_info
from fastmace.models.files import model_directories, scan_model_files
from fastmace.oeq import toolchain
from fastmace.oeq.choice import PREBUILT, UNAVAILABLE, choose_host_extension
from fastmace.runtime import environment
from fastmace.runtime.cache import (
    AHEAD_OF_TIME_PACKAGES,
    CacheLocationError,
    check_cache_root,
    locate_cache_root,
)
from fastmace.runtime.driver import nvidia_driver_version
from fastmace.runtime.mounts import Mount, nfs_mount_of, read_mount_table
from fastmace.runtime.stale_locks import find_stale_locks, removal_command
from fastmace.runtime.startup import RuntimeInfo, file_lock_problems
from fastmace.vocabulary import GRAPH_LONGRANGE_VERSION

QUALIFIED_MACE = "0.3.16"


class CheckFailed(Exception):
    """Raised by a check to report its failure; the message says what is wrong and the fix.

    ``needs_gpu``: what failed serves only GPU runs, so without a GPU it is a warning.
    """

    def __init__(self, message: str, *, needs_gpu: bool = False) -> None:
        super().__init__(message)
        self.needs_gpu = needs_gpu


@dataclass
class DoctorContext:
    """What the checks look at: the user's environment as it was before doctor touched it."""

    environ: Mapping[str, str]
    runtime: RuntimeInfo
    hash_models: bool = True
    mounts: list[Mount] | None = None
    """The mount table; read from /proc/self/mounts when not given."""

    @cached_property
    def torch(self) -> Any:
        import torch  # the one heavy import doctor makes, for torch.cuda and torch.version

        return torch

    @cached_property
    def driver(self) -> str | None:
        """The NVIDIA driver's version, from nvidia-smi; None where it reports no GPU."""
        return nvidia_driver_version()

    @cached_property
    def has_gpu(self) -> bool:
        """Whether this machine has an NVIDIA GPU, seen by torch or by the driver."""
        if self.driver is not None:
            return True
        return _version("torch") is not None and self.torch.cuda.is_available()

    @cached_property
    def torch_cuda_major(self) -> int | None:
        cuda = self.torch.version.cuda
        return int(cuda.split(".")[0]) if cuda else None

    @cached_property
    def mount_table(self) -> list[Mount]:
        return read_mount_table() if self.mounts is None else self.mounts


Check = Callable[[DoctorContext], str]


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def check_gpu(ctx: DoctorContext) -> str:
    if _version("torch") is None:
        raise CheckFailed("torch is not installed, so no GPU can be used: install torch first")
    torch = ctx.torch
    driver_text = f"driver {ctx.driver}" if ctx.driver else "no driver found by nvidia-smi"
    if not torch.cuda.is_available():
        raise CheckFailed(
            f"no CUDA GPU visible to torch ({driver_text}; torch CUDA {torch.version.cuda}): "
            "any structure and model runs on the CPU, slowly: use a GPU for production"
        )
    names = [torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())]
    return (
        f"{len(names)} GPU(s): {', '.join(names)}; {driver_text}; torch CUDA {torch.version.cuda}"
    )


def check_torch(ctx: DoctorContext) -> str:
    version = _version("torch")
    if version is None:
        raise CheckFailed(
            "torch is not installed: install a CUDA build of torch (pip install torch)"
        )
    cuda = ctx.torch.version.cuda
    if cuda is None:
        raise CheckFailed(
            f"torch {version} is a CPU-only build: install a CUDA build of torch "
            "(e.g. pip install torch, which brings CUDA 13 on Linux x86_64)",
            needs_gpu=True,
        )
    return f"torch {version} (CUDA {cuda})"


def check_mace(ctx: DoctorContext) -> str:
    version = _version("mace-torch")
    if version is None or importlib_util.find_spec("mace") is None:
        raise CheckFailed(f"mace-torch is not installed: pip install mace-torch=={QUALIFIED_MACE}")
    if version != QUALIFIED_MACE:
        return f"mace-torch {version} (note: FastMACE is qualified against {QUALIFIED_MACE})"
    return f"mace-torch {version}"


def _missing_libraries(distribution: str) -> tuple[int, list[str]]:
    """How many shared libraries a wheel's RECORD lists, and which of them are missing."""
    dist = metadata.distribution(distribution)
    libraries = [f for f in dist.files or () if re.search(r"\.so(\.|$)", f.name)]
    missing = [str(f) for f in libraries if not Path(dist.locate_file(f)).exists()]
    return len(libraries), missing


def check_cuequivariance(ctx: DoctorContext) -> str:
    front = {name: _version(name) for name in ("cuequivariance", "cuequivariance-torch")}
    absent = [name for name, version in front.items() if version is None]
    if absent:
        raise CheckFailed(f"{', '.join(absent)} not installed: pip install cuequivariance-torch")
    major = ctx.torch_cuda_major
    wanted = f"cuequivariance-ops-torch-cu{major}" if major else "cuequivariance-ops-torch-cu13"
    installed = {
        f"cu{m}": _version(f"cuequivariance-ops-torch-cu{m}")
        for m in (12, 13)
        if _version(f"cuequivariance-ops-torch-cu{m}")
    }
    torch_cuda = f"torch's CUDA {ctx.torch.version.cuda}" if major else "a CUDA build of torch"
    if not installed:
        raise CheckFailed(
            "cuequivariance_ops_torch is not installed, so MACE would use cuEquivariance's naive "
            f"kernels: install the ops wheel matching {torch_cuda}: pip install {wanted}",
            needs_gpu=True,
        )
    if major is not None and f"cu{major}" not in installed:
        raise CheckFailed(
            f"the ops wheel for {', '.join(installed)} is installed, but torch has CUDA "
            f"{ctx.torch.version.cuda}: pip install {wanted}",
            needs_gpu=True,
        )
    count, missing = 0, []
    for distribution in (wanted, wanted.replace("-torch", "")):
        if _version(distribution) is not None:
            listed, absent_files = _missing_libraries(distribution)
            count += listed
            missing += absent_files
    if missing:
        raise CheckFailed(
            f"{len(missing)} of the ops wheels' {count} shared libraries are missing "
            f"({', '.join(missing[:3])}): reinstall with pip install --force-reinstall {wanted}",
            needs_gpu=True,
        )
    versions = ", ".join(f"{name} {version}" for name, version in front.items())
    return f"{versions}, {wanted} {_version(wanted)} ({count} libraries present)"


def check_openequivariance(ctx: DoctorContext) -> str:
    version = _version("openequivariance")
    if version is None:
        raise CheckFailed(
            "OpenEquivariance is not installed, so the hybrid backend is unavailable (plain "
            "cuEquivariance runs): pip install 'fastmace[oeq]'"
        )
    root = locate_cache_root(environ=ctx.environ).path
    problems = []
    stale = find_stale_locks([environment.torch_extensions_dir(ctx.environ), root / "oeq"])
    if stale:
        problems.append(
            f"{len(stale)} stale build lock(s), older than an hour and held by no process, "
            f"would stall a build; remove them with: {removal_command(stale)}"
        )
    found = choose_host_extension(ctx.environ)
    if found.method == PREBUILT:
        assert found.prebuilt is not None
        line = (
            f"openequivariance {version}; host extension: prebuilt (fastmace-oeq-ext "
            f"{found.prebuilt.version}, built for torch {found.prebuilt.built_for_torch}, "
            f"{found.prebuilt.library}); no compiler needed"
        )
        if problems:
            raise CheckFailed(f"{line}; but " + "; ".join(problems))
        return line
    if found.method == UNAVAILABLE:
        problems.insert(0, f"the hybrid backend is unavailable (plain cuEquivariance runs): "
                           f"{found.reason}")  # fmt: skip
        raise CheckFailed(f"openequivariance {version}: " + "; ".join(problems))
    if problems:
        raise CheckFailed(
            f"openequivariance {version}; prebuilt extension not used "
            f"({found.prebuilt_skipped}): " + "; ".join(problems)
        )
    why_not = found.prebuilt_skipped
    extensions = root / "oeq" / "extensions"
    built = extensions.is_dir() and any(extensions.iterdir())
    state = "built before" if built else "not built yet (built once, at the first hybrid load)"
    return (
        f"openequivariance {version}; host extension: built with the host toolchain, {state}; "
        f"prebuilt not used: {why_not}"
    )


def _optional_package(distribution: str, fix: str, exact: str | None = None) -> Check:
    def check(ctx: DoctorContext) -> str:
        version = _version(distribution)
        if version is None:
            raise CheckFailed(f"{distribution} is not installed: {fix}")
        if exact is not None and version != exact:
            raise CheckFailed(
                f"{distribution} {version} is installed, but {exact} is the version that "
                f"works with mace-torch 0.3.16: pip install '{distribution}=={exact}'"
            )
        return f"{distribution} {version}"

    return check


def check_triton(ctx: DoctorContext) -> str:
    version = _version("triton") or _version("pytorch-triton")
    if version is None:
        raise CheckFailed("Triton is not installed: pip install triton")
    return f"triton {version}"


def check_nvrtc(ctx: DoctorContext) -> str:
    major = ctx.torch_cuda_major or 13
    bindings = _version("cuda-bindings")
    library = toolchain.cuda_wheel_library("libnvrtc", major)
    if bindings is None or int(bindings.split(".")[0]) != major:
        have = f"cuda-bindings {bindings}" if bindings else "cuda-bindings is not installed"
        raise CheckFailed(f"{have}: install cuda-bindings matching torch's CUDA: "
                          f"pip install 'cuda-bindings=={major}.*'")  # fmt: skip
    if library is None:
        raise CheckFailed(
            f"libnvrtc.so.{major} not found in torch's CUDA wheels: "
            f"pip install nvidia-cuda-nvrtc (CUDA {major})"
        )
    return f"cuda-bindings {bindings}; {library}"


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_environment_variables(ctx: DoctorContext) -> str:
    bad = environment.problems(ctx.environ)
    if bad:
        them = "it" if len(bad) == 1 else "them"
        raise CheckFailed(
            "; ".join(str(error) for error in bad)
            + f". Correct or unset {them} (docs/environment.md lists the values); runs refuse "
            "to start until then"
        )
    given = [variable.name for variable in environment.READ if ctx.environ.get(variable.name)]
    if not given:
        return "none of the variables FastMACE reads is set"
    return f"{', '.join(given)} set, with usable values"


def check_cache_root_location(ctx: DoctorContext) -> str:
    fix = "set FASTMACE_CACHE to a writable directory outside the environment"
    try:
        root = locate_cache_root(environ=ctx.environ)
        check_cache_root(root)
    except (CacheLocationError, environment.EnvironmentVariableError) as error:
        raise CheckFailed(f"{error}; {fix}") from error
    if root.path.exists():
        writable = root.path.is_dir() and os.access(root.path, os.W_OK | os.X_OK)
        state = "exists"
    else:
        parent = _nearest_existing(root.path)
        writable = parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)
        state = f"will be created on first use under {parent}"
    if not writable:
        raise CheckFailed(f"{root.path} (from {root.source}) is not writable: {fix}")
    return f"{root.path} (from {root.source}; {state})"


def check_file_locks(ctx: DoctorContext) -> str:
    info = ctx.runtime
    root = locate_cache_root(environ=ctx.environ).path
    cache_nfs = nfs_mount_of(root, ctx.mount_table)
    problems = file_lock_problems(info, cache_nfs is not None, ctx.environ)
    if problems:
        raise CheckFailed(
            "; ".join(problems) + ": import fastmace before torch and leave "
            "FASTMACE_SOFT_FILE_LOCKS unset or 1; or set CUDA_CACHE_DISABLE=1 or CUDA_CACHE_PATH "
            "to a local directory"
        )
    where = f"on NFS ({cache_nfs.mount_point})" if cache_nfs else "not on NFS"
    return (
        f"{info.lock_mode} locks ({info.lock_reason}); cache root {where}; "
        f"CUDA driver cache: {info.cuda_cache} ({info.cuda_cache_reason})"
    )


def inductor_lock_directories(environ: Mapping[str, str]) -> list[Path]:
    """Where Inductor keeps its lock files: ``locks`` and ``precompiled_headers/locks`` of its
    own default directory (shared by every torch of the user) and of the directory FastMACE's
    compilations use (``TORCHINDUCTOR_CACHE_DIR``, or ``<cache root>/inductor``)."""
    default = Path(environment.inductor_default_cache_dir())
    used = environment.compiled_graphs_directory(locate_cache_root(environ=environ).path, environ)
    found: list[Path] = []
    for base in (default, used):
        for directory in (base / "locks", base / "precompiled_headers" / "locks"):
            if directory not in found:
                found.append(directory)
    return found


def check_inductor_locks(ctx: DoctorContext) -> str:
    """Leftover lock files in Inductor's lock directories: with soft locks each one stalls
    the compilation that wants it for ten minutes, then fails it."""
    directories = inductor_lock_directories(ctx.environ)
    stale = find_stale_locks(directories)
    if stale:
        raise CheckFailed(
            f"{len(stale)} stale lock(s) in Inductor's lock directories, older than an hour "
            "and held by no process: with soft locks a torch.compile that needs one waits ten "
            f"minutes and fails (docs/faq.md); remove them with: {removal_command(stale)}"
        )
    return "no stale lock in " + ", ".join(str(directory) for directory in directories)


def check_model_files(ctx: DoctorContext) -> str:
    statuses = scan_model_files(ctx.environ, hash_files=ctx.hash_models)
    bad = [status for status in statuses if status.state == "mismatch"]
    if bad:
        raise CheckFailed(
            "; ".join(
                f"{status.path} does not match its SHA-256: delete it and fetch it again with "
                f"fm.load({status.checkpoint_id!r}, download=True)"
                for status in bad
            )
        )
    if not statuses:
        searched = " and ".join(str(d) for d in model_directories(ctx.environ))
        return f"no checkpoint files in {searched}"
    good = [s.checkpoint_id for s in statuses if s.state in ("verified", "unchecked")]
    if ctx.hash_models:
        parts = [f"{len(good)} checkpoint(s) verified"]
    else:
        parts = [f"{len(good)} checkpoint(s) found, hashes not checked (--no-hash)"]
    if good:
        parts[0] += f": {', '.join(str(label) for label in good)}"
    skipped = [f"{s.path} (empty, skipped)" for s in statuses if s.state == "empty"]
    unknown = [str(s.path) for s in statuses if s.state == "unknown"]
    if skipped:
        parts.append(", ".join(skipped))
    if unknown:
        parts.append(f"not in the label table: {', '.join(unknown)}")
    return "; ".join(parts)


def _directory_size(path: Path) -> tuple[int, int]:
    """Files and bytes under ``path`` (nothing when it does not exist)."""
    files = size = 0
    for directory, _, names in os.walk(path):
        for name in names:
            try:
                size += os.stat(os.path.join(directory, name), follow_symlinks=False).st_size
            except OSError:
                continue
            files += 1
    return files, size


def _megabytes(size: int) -> str:
    return f"{size / 1e6:,.1f} MB"


def check_startup_cache(ctx: DoctorContext) -> str:
    """What a second run can reuse: compiled code, kernels, descriptors, converted models,
    compilation costs."""
    from fastmace.runtime.compile_costs import recorded_costs

    root = locate_cache_root(environ=ctx.environ).path
    places = (
        ("compiled graphs", environment.compiled_graphs_directory(root, ctx.environ)),
        ("Triton kernels", ctx.environ.get("TRITON_CACHE_DIR") or root / "triton"),
        (
            "cuEquivariance kernels",
            ctx.environ.get(environment.CUEQ_KERNEL_CACHE) or root / "cueq-nvrtc",
        ),
        ("cuEquivariance descriptors", root / "compile" / "cueq"),
        ("converted models", root / "compile" / "converted"),
        ("potentials compiled ahead of time", root.joinpath(*AHEAD_OF_TIME_PACKAGES)),
    )
    parts = []
    for name, place in places:
        files, size = _directory_size(Path(place))
        parts.append(f"{name} {_megabytes(size)} ({files} files)" if files else f"no {name}")
    costs = sorted(recorded_costs(ctx.environ), key=lambda item: item[0].n_atoms)
    if costs:
        shown = "; ".join(
            f"{identity.n_atoms:,} atoms {identity.backend} {identity.dtype} on {identity.gpu}: "
            f"{seconds:.1f} s"
            for identity, seconds in costs[:5]
        )
        more = f" and {len(costs) - 5} more" if len(costs) > 5 else ""
        parts.append(f"compilations recorded: {shown}{more}")
    else:
        parts.append("no compilation recorded (a first compilation is planned at 30 s)")
    return f"{root}: " + ", ".join(parts)


@dataclass(frozen=True)
class DoctorCheck:
    name: str
    required: bool
    run: Check


CHECKS = (
    DoctorCheck("GPU and driver", False, check_gpu),
    DoctorCheck("torch", True, check_torch),
    DoctorCheck("MACE", True, check_mace),
    DoctorCheck("cuEquivariance", True, check_cuequivariance),
    DoctorCheck("OpenEquivariance", False, check_openequivariance),
    DoctorCheck("Triton", False, check_triton),
    DoctorCheck("NVRTC", False, check_nvrtc),
    DoctorCheck(
        "graph-longrange",
        False,
        _optional_package(
            "graph-longrange",
            "needed for MACE-POLAR-1: pip install 'fastmace[polar]'",
            exact=GRAPH_LONGRANGE_VERSION,
        ),
    ),
    DoctorCheck(
        "torch-dftd",
        False,
        _optional_package("torch-dftd", "needed for the D3 reference: pip install 'fastmace[d3]'"),
    ),
    DoctorCheck("environment", True, check_environment_variables),
    DoctorCheck("cache root", True, check_cache_root_location),
    DoctorCheck("file locks", True, check_file_locks),
    DoctorCheck("Inductor locks", False, check_inductor_locks),
    DoctorCheck("start-up cache", False, check_startup_cache),
    DoctorCheck("model files", False, check_model_files),
)


@dataclass(frozen=True)
class CheckResult:
    name: str
    required: bool
    ok: bool
    detail: str
    traceback: str | None = None

    @property
    def marker(self) -> str:
        if self.ok:
            return "[ok]"
        return "[FAIL]" if self.required else "[warn]"

    def line(self) -> str:
        return f"{self.marker:<6} {self.name}: {self.detail}"


def run_check(check: DoctorCheck, ctx: DoctorContext) -> CheckResult:
    """Run one check; a crash is reported as a failure of that check, with its traceback kept."""
    try:
        return CheckResult(check.name, check.required, True, check.run(ctx))
    except CheckFailed as failure:
        if check.required and failure.needs_gpu and not ctx.has_gpu:
            detail = f"{failure} (a warning: this machine has no GPU to use it)"
            return CheckResult(check.name, False, False, detail)
        return CheckResult(check.name, check.required, False, str(failure))
    except environment.EnvironmentVariableError as error:
        return CheckResult(check.name, check.required, False, f"{error}; correct or unset it")
    except Exception as error:  # a crash must not hide the remaining checks
        detail = (
            f"the check crashed ({type(error).__name__}: {error}); "
            "run fastmace --debug doctor for the traceback"
        )
        return CheckResult(check.name, check.required, False, detail, traceback.format_exc())


def run_doctor(
    hash_models: bool = True,
    debug: bool = False,
    out: TextIO | None = None,
    checks: tuple[DoctorCheck, ...] = CHECKS,
) -> int:
    """Print every check, one line each; return the exit code (1 if a required check failed)."""
    out = sys.stdout if out is None else out
    user_environ = dict(os.environ)
    # Doctor's own CUDA initialisation must not write the driver's JIT cache (it may be on NFS).
    environment.overwrite("CUDA_CACHE_DISABLE", "1", "fastmace doctor's own process")
    ctx = DoctorContext(user_environ, runtime_info(), hash_models)
    failed_required = False
    for check in checks:
        result = run_check(check, ctx)
        print(result.line(), file=out, flush=True)
        if debug and result.traceback:
            print(result.traceback, file=sys.stderr, flush=True)
        failed_required |= result.required and not result.ok
    return 1 if failed_required else 0
