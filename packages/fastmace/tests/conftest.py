"""Shared helpers: a clean environment for child processes, a cache root of the test's own, a
snapshot of a directory tree, the example structure, rattled copper, run settings, the demo
model, a smaller copper model for tests that compile, a stand-in that compiles Triton kernels
for Hopper, and the model's mirrored edges."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import ase
import ase.build
import pytest

# The shipped example: 32 atoms of fcc copper (the file users run first).
EXAMPLE = Path(__file__).parents[3] / "examples" / "cu-fcc-32.extxyz"

# Variables of ours (and of the tools we configure) that must not leak from the developer's
# shell into a test's child process.
_SCRUBBED_PREFIXES = ("FASTMACE_", "OEQ_", "TORCHINDUCTOR_", "TRITON_", "CUDA_CACHE_", "CUBLAS_")
_SCRUBBED = {"XDG_CACHE_HOME", "XDG_STATE_HOME", "PYTORCH_CUDA_ALLOC_CONF", "MAX_JOBS"}


@pytest.fixture(autouse=True)
def _private_state(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """The digests of vouched cache entries (runtime/vouched.py) go to a directory of the
    session's own, never to the developer's ~/.local/state."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.getbasetemp() / "state"))


@pytest.fixture
def clean_env(tmp_path: Path) -> dict[str, str]:
    """An environment for a child process with a fresh HOME and no FastMACE variables."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in _SCRUBBED and not key.startswith(_SCRUBBED_PREFIXES)
    }
    # A directory of the test's own: nothing left in the user's torch-extensions directory
    # by earlier work (a stale lock, say) can change what a child process sees.
    env["TORCH_EXTENSIONS_DIR"] = str(tmp_path / "torch_extensions")
    home = tmp_path / "home"
    home.mkdir()
    env["HOME"] = str(home)
    env["TMPDIR"] = str(tmp_path / "tmp")
    (tmp_path / "tmp").mkdir()
    return env


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache root of the test's own (FASTMACE_CACHE), for this process and its children."""
    monkeypatch.setenv("FASTMACE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def run_python(
    code: str, env: dict[str, str], cwd: Path | None = None, python_options: Sequence[str] = ()
) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter of this environment (with ``python_options``)."""
    return subprocess.run(
        [sys.executable, *python_options, "-c", code],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def python_report(code: str, env: dict[str, str]) -> Any:
    """Run ``code`` in a fresh interpreter (``run_python``), which must succeed, and return the
    JSON its last line of output holds."""
    result = run_python(code, env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def run_fastmace(
    args: list[str], env: dict[str, str], cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """Run the ``fastmace`` command line in a child process."""
    return subprocess.run(
        [sys.executable, "-m", "fastmace", *args],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def tree(root: Path) -> set[str]:
    """Every path below ``root``, relative to it."""
    return {str(path.relative_to(root)) for path in root.rglob("*")}


def copper(repeat: tuple[int, int, int] = (2, 1, 1)) -> ase.Atoms:
    """Rattled fcc copper, ``repeat`` cubic cells (the default: 8 atoms)."""
    atoms = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat(repeat)
    atoms.rattle(0.02, seed=3)
    return atoms


def settings(steps: int, **changes):
    """RunSettings of a short Langevin run at 300 K with 2 fs steps; ``changes`` replace any."""
    from fastmace.dynamics.ensembles import ensemble
    from fastmace.io import OutputSchedule
    from fastmace.simulation import RunSettings

    values = dict(
        ensemble=ensemble("nvt", temperature_K=300.0, friction_per_ps=5.0),
        steps=steps,
        timestep_fs=2.0,
        seed=7,
        schedule=OutputSchedule(trajectory_every=5, thermo_every=5, restart_every=10),
        initial_temperature_K=300.0,
    )  # the schedule makes K = 5
    values.update(changes)
    return RunSettings(**values)


@pytest.fixture(scope="module")
def demo():
    """The shipped demo model, loaded once per test module."""
    from fastmace.models.load import load

    return load("demo-emt-cu")


@pytest.fixture
def one_interaction_copper(monkeypatch: pytest.MonkeyPatch) -> str:
    """The ``load`` label of a copper model smaller than the demo, for tests of how a model is
    compiled, whose cost grows with the model's graph. Random weights; the demo's interaction
    block, but one interaction of 8x0e+8x1o features where the demo has two of 16x0e+16x1o, and
    l_max 1 where the demo has 2: a third of the demo's operators on cuEquivariance, under half
    on e3nn (traced evaluations with l_max 2, 2026-12-04); l_max 1 took a quarter off every
    compilation again (test_compile 90 -> 67 s, test_compile_converted 93 -> 72 s on one core,
    2026-12-04). Correlation stays 2: cuEquivariance's symmetric contraction needs 2 or more."""
    from fastmace.models import templates

    shape = dataclasses.replace(
        templates.TEMPLATES["tiny"], num_interactions=1, atomic_numbers=(29,), max_ell=1
    )
    monkeypatch.setitem(templates.TEMPLATES, "tests-one-interaction-cu", shape)
    return "template:tests-one-interaction-cu"


@functools.cache
def cueq_template(name: str):
    """Template ``name`` (seed 0, float64) converted to cuEquivariance on the CPU, once per
    process. cuEquivariance builds its CPU modules as FX graphs in pure Python, and
    test_fused_conv.py and test_edge_chunks.py both use MP-0 medium's, as test_product_basis.py
    and test_species_linear.py use MP-0 small's (SAME_WORKER runs each pair in one process).
    The tests use it read-only.

    The graphs are built as cuEquivariance builds them where opt_einsum_fx is not installed:
    in the order its descriptors give, without opt_einsum_fx's search for a cheaper order of
    each contraction. The search is three quarters of a conversion on one core (MP-0 medium
    40 s of 50; MH-1, under a profiler, 94 of 125). Without it the results differ only in
    rounding, and an evaluation costs about a quarter more (MP-0 medium, three evaluations of
    three structures: 12.3 s with the search, 15.4 s without)."""
    import torch

    from fastmace.models import backends
    from fastmace.models.templates import template

    model = template(name, seed=0, dtype=torch.float64)
    with _contractions_in_given_order():
        return backends.convert(model, "cueq", "cpu")


@contextlib.contextmanager
def _contractions_in_given_order() -> Iterator[None]:
    """cuEquivariance's CPU graph builder with its einsum search off (cueq_template), for the
    calls inside the block only; a cuEquivariance without that builder converts as usual."""
    from cuequivariance_torch.primitives import segmented_polynomial_naive as naive

    build = getattr(naive, "_tensor_product_fx", None)
    if build is None:
        yield
        return

    def in_given_order(*args: Any, **kwargs: Any) -> Any:
        return build(*args, **{**kwargs, "optimize_einsums": False})

    naive._tensor_product_fx = in_given_order
    try:
        yield
    finally:
        naive._tensor_product_fx = build


# --- How CI's two workers share the files (noxfile's tests session: -n auto --dist loadfile) ---

# Files that run in one worker process, as if they were one file, for what they share: the
# first names the second's unit. cueq_template's conversions are made once for both: MP-0
# medium's (45 s; the two files together 128 s on one core, apart 167 s) and MP-0 small's (13 s).
SAME_WORKER = {
    "test_edge_chunks.py": "test_fused_conv.py",
    "test_species_linear.py": "test_product_basis.py",
}

# The slowest files first, each file's tests in their order, then every other file in
# collection order: the worker that finishes first takes the next file, so long files started
# early and short ones at the end leave no worker idle while the other finishes. xdist's own
# order (most tests first, --no-loadscope-reorder in the noxfile turns it off) left one-test
# files of a minute (test_demo.py, test_compile.py) to the end. Seconds on one core, measured
# 2026-12-04; the order matters for time only, never for what passes.
SLOWEST_FIRST = (
    "test_fused_conv.py",  # 128, with test_edge_chunks.py (SAME_WORKER)
    "test_adversarial.py",  # 118
    "test_polar_md.py",  # 86
    "test_compile.py",  # 77
    "test_thermal_start.py",  # 75
    "test_compile_converted.py",  # 65
    "test_docs_run.py",  # 63
    "test_replica_exchange.py",  # 55
    "test_oeq_build_cache.py",  # 50
    "test_demo.py",  # 50
    "test_product_basis.py",  # 67, with test_species_linear.py (SAME_WORKER)
    "test_spread.py",  # 48
    "test_converted_cache.py",  # 45
    "test_resume_settings.py",  # 42
    "test_integrators_sampling.py",  # 42
    "test_md_trust.py",  # 41
    "test_md_physics.py",  # 39
    "test_gate.py",  # 38
    "test_quiet_run.py",  # 37
    "test_doctor.py",  # 35
    "test_polar_capture.py",  # 35
    "test_cueq_descriptors.py",  # 34
    "test_compile_kept_conversion.py",  # 33
    "test_batching.py",  # 32
    "test_plot.py",  # 31
    "test_radial_table.py",  # 31
    "test_cli_md.py",  # 28
    "test_build_order.py",  # 27
    "test_relax.py",  # 27
    "test_request_checks.py",  # 27
    "test_replicas.py",  # 27
    "test_model_load.py",  # 26
    "test_guard.py",  # 24
    "test_runner.py",  # 22
    "test_integrators_ensembles.py",  # 21
    "test_dispersion.py",  # 20
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: index for index, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: files stay whole


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """xdist's loadfile scheduling, with SAME_WORKER's files in one unit."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedFiles(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = super()._split_scope(nodeid)
            path = Path(file)
            shared = SAME_WORKER.get(path.name)
            return str(path.with_name(shared)) if shared else file

    return SharedFiles(config, log)


PYTHON_TAG = f"cp{sys.version_info[0]}{sys.version_info[1]}"


def lay_out_prebuilt(
    site: Path, torches: Sequence[str], *, python_tag: str = PYTHON_TAG, cxx11_abi: bool = True
) -> dict[str, Path]:
    """An installed fastmace-oeq-ext (files and metadata, manifest version 2) under ``site``,
    with one library per torch version in ``torches`` (``2.14.1+cu130``), standing in bytes
    for the compiled ones. Returns each torch minor's library path."""
    package = site / "fastmace_oeq_ext"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
    libraries, entries = {}, []
    for torch_version in torches:
        minor = ".".join(torch_version.split("+")[0].split(".")[:2])
        library = package / f"torch-{minor}" / "libtorch_tp_jit.so"
        library.parent.mkdir()
        library.write_bytes(f"stands in for the library built for torch {minor}".encode())
        libraries[minor] = library
        entries.append({
            "torch": torch_version, "torch_minor": minor, "cuda": "13.0", "cxx11_abi": cxx11_abi,
            "library": f"torch-{minor}/libtorch_tp_jit.so",
            "sha256": hashlib.sha256(library.read_bytes()).hexdigest(),
            "glibc_max": "2.28", "glibcxx_max": "3.4.24",
        })  # fmt: skip
    manifest = {
        "manifest_version": 2, "openequivariance": "0.7.0", "pybind11": "3.1.0",
        "python_tag": python_tag, "platform_tag": "manylinux_2_28_x86_64",
        "compiler": "GNU 12.2.0", "libraries": entries,
    }  # fmt: skip
    (package / "manifest.json").write_text(json.dumps(manifest))
    info = site / "fastmace_oeq_ext-0.7.0.post2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: fastmace-oeq-ext\nVersion: 0.7.0.post2\n"
    )
    return libraries


def same_trajectory_atol_A() -> float:
    """How close two runs that follow one trajectory end up (Å): within 1e-9 on the CPU. On
    a GPU, kernels choose their algorithm by shape and sum with atomics, so a batch and a
    system alone, or a resumed run and an unbroken one, agree to rounding (2e-9 to 6e-9 Å
    after 20-40 steps on the H200), not bit for bit."""
    import torch

    return 1e-7 if torch.cuda.is_available() else 1e-9


class CompileForHopper:
    """Stands in for a kernel's launcher: compiles the real kernel for sm_90 with the argument
    types of the call (Triton's full pipeline down to a cubin, no GPU needed) instead of
    launching it. The interpreter alone misses errors of Triton's compiler front end."""

    def __init__(self, kernel, compiled: list[str]) -> None:
        self.kernel, self.compiled = kernel, compiled

    def __getitem__(self, grid):
        return self.compile

    def compile(self, *args, **constexprs):
        import torch
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource

        kinds = {torch.float64: "*fp64", torch.float32: "*fp32", torch.int64: "*i64",
                 torch.int32: "*i32"}  # fmt: skip
        # Launch options, as a launch takes them; the rest are the kernel's constexprs.
        options = {
            k: constexprs.pop(k) for k in ("num_warps", "num_stages", "maxnreg") if k in constexprs
        }
        names = self.kernel.arg_names
        signature = {
            name: kinds[value.dtype] if isinstance(value, torch.Tensor) else "i64"
            for name, value in zip(names, args, strict=False)
        }
        signature.update(dict.fromkeys(constexprs, "constexpr"))
        source = ASTSource(fn=self.kernel, signature=signature, constexprs=constexprs)
        target = GPUTarget("cuda", 90, 32)
        asm = triton.compile(source, target=target, options=options).asm
        assert "cubin" in asm
        if "maxnreg" in options:  # a register cap reaches ptxas as the kernel's .maxnreg
            assert f".maxnreg {options['maxnreg']}" in asm["ptx"]
        self.compiled.append(self.kernel.__name__)


def model_edges(state, r_max: float):
    """What the engine gives the model: the list's pairs within the cutoff, mirrored."""
    from fastmace.dynamics.neighbours import NeighbourList

    neighbours = NeighbourList(state, r_max, 0.5)
    return neighbours.cutoff_edges(state, neighbours.build(state))


@pytest.fixture
def one_thread():
    """These tensors are small: one thread avoids oversubscribing a busy 2-core machine (a
    module asks for it with ``pytestmark = pytest.mark.usefixtures("one_thread")``)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def header_precompiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The C++ headers Inductor precompiles during the test: watched, not replaced. Each one
    locks a file in Inductor's shared /tmp directory, which FastMACE's compilations avoid."""
    import torch._inductor.codecache as codecache

    headers: list[str] = []
    precompile = codecache._precompile_header

    def watched(header, *args, **kwargs):
        headers.append(header)
        return precompile(header, *args, **kwargs)

    monkeypatch.setattr(codecache, "_precompile_header", watched)
    return headers
