"""The potential compiled ahead of time: built once per model and machine, loaded in a second.

``torch.compile`` traces the model again in every process (18 s of a 41 s warm start at
13,824 atoms on the H200, docs/validation/performance.md) even when Inductor's caches hold
every kernel. Here the whole evaluation, from (State, Edges) to energies, forces and virials
(graph assembly, the model, and the backward pass that gives the forces), is traced once into
one graph of ATen and kernel operators (``make_fx``), exported with the numbers of atoms and
edges left symbolic, and compiled by AOTInductor into a package kept in the cache root. A later
process loads the package and calls it: no tracing, no compilation, the same code for every
cell size and for a regrown neighbour list.

Keyed by everything the package depends on (:func:`artefact_identity`: the weights, the
elements, the tables, dtype, the kinds of edges and outputs, torch, CUDA, the GPU, the versions
of the kernel libraries and of FastMACE's own evaluation code); a package holds code, so it is
loaded only when its bytes are the ones this user recorded (runtime/vouched.py), and checked
against the eager evaluation when it is built, at the capacity it was built for and at a larger
one (a size fixed by mistake while tracing shows up there).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from fastmace.dynamics.edges import Edges
from fastmace.dynamics.padding import padding_nodes
from fastmace.dynamics.state import PotentialOutput, State
from fastmace.runtime import cache, environment, vouched

# The functions below take a fastmace.dynamics.potential.Potential, typed as the module it is:
# this file is part of Potential's implementation (its compile=True path on the CPU), and
# imports nothing of it, so that the two files do not import each other.

# Changed whenever the traced function's inputs or outputs change: old packages no longer match.
FORMAT = 2
MIN_PADDING_NODES = 2  # see _inputs
# The libraries whose kernels or modules end up inside a package.
_LIBRARIES = (
    "mace-torch",
    "e3nn",
    "cuequivariance",
    "cuequivariance-torch",
    "cuequivariance-ops-torch-cu12",
    "cuequivariance-ops-torch-cu13",
    "openequivariance",
)
# FastMACE's code that the traced graph is made of.
_TRACED_SOURCES = ("dynamics",)


class AotBuildError(RuntimeError):
    """The potential could not be compiled ahead of time (the message says why)."""


@dataclasses.dataclass(frozen=True)
class AotReport:
    """How the compiled potential was obtained: "loaded" or "built", in how many seconds, and
    (when built) how far it was from the eager evaluation."""

    how: str
    seconds: float
    key: str
    force_error_ev_per_a: float | None = None


def artefact_identity(
    potential: torch.nn.Module, *, compute_stress: bool, mirrored: bool, n_systems: int
) -> dict[str, object]:
    """Everything a package depends on; a package is used only for the identity it was built
    for (its key is a digest of this)."""
    device = potential.node_attr_table.device
    return {
        "format": FORMAT,
        "weights": _tensors_digest(potential),
        "modules": _structure_digest(potential),
        "species": list(potential.species),
        "head": potential.head,
        "dtype": str(potential.node_attr_table.dtype),
        "matmul_precision": potential.matmul_precision,
        "compute_stress": compute_stress,
        "mirrored": mirrored,
        "n_systems": n_systems,
        "device": _device_description(device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "libraries": _library_versions(),
        "fastmace_code": _source_digest(),
    }


def artefact_key(identity: dict[str, object]) -> str:
    """The file name of the package for ``identity``."""
    text = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def package_path(key: str) -> Path:
    """``<cache root>/compile/aot/<key>.pt2``."""
    return cache.cache_dir(*cache.AHEAD_OF_TIME_PACKAGES) / f"{key}.pt2"


class AotEvaluation:
    """A loaded package as a function of (State, Edges), like ``Potential.forward``.

    The call reads only tensor sizes on the host, so it can be captured in a CUDA graph.
    """

    def __init__(self, runner: Callable[..., object], n_systems: int, compute_stress: bool):
        self._runner = runner
        self.n_systems = n_systems
        self.compute_stress = compute_stress

    def __call__(self, state: State, edges: Edges) -> PotentialOutput:
        if state.n_systems != self.n_systems:
            raise ValueError(
                f"this compiled potential was built for {self.n_systems} systems, not "
                f"{state.n_systems}"
            )
        outputs = self._runner(*_inputs(state, edges))
        if not self.compute_stress:
            energy, forces = outputs
            return PotentialOutput(energy=energy, forces=forces)
        energy, forces, virial, stress = outputs
        return PotentialOutput(energy=energy, forces=forces, virial=virial, stress=stress)


def aot_evaluation(
    potential: torch.nn.Module, state: State, edges: Edges, compute_stress: bool
) -> tuple[AotEvaluation, AotReport]:
    """The compiled potential for these kinds of inputs: loaded from the cache root when this
    user built it before, otherwise built now (minutes on a GPU), checked and kept.

    Raises AotBuildError when tracing, export, compilation or the check fails.
    """
    started = time.perf_counter()
    identity = artefact_identity(
        potential,
        compute_stress=compute_stress,
        mirrored=edges.mirrored,
        n_systems=state.n_systems,
    )
    key = artefact_key(identity)
    path = package_path(key)
    data = vouched.read_vouched(path)
    if data is not None:
        with contextlib.suppress(RuntimeError):  # a package this torch cannot load: rebuild
            runner = _load(data)
            evaluation = AotEvaluation(runner, state.n_systems, compute_stress)
            return evaluation, AotReport("loaded", time.perf_counter() - started, key)
    evaluation, error = _build(potential, state, edges, compute_stress, path)
    return evaluation, AotReport("built", time.perf_counter() - started, key, error)


def _build(
    potential: torch.nn.Module, state: State, edges: Edges, compute_stress: bool, path: Path
) -> tuple[AotEvaluation, float]:
    environment.configure_compile_caches(cache.cache_root().path)
    try:
        graph = trace(potential, state, edges, compute_stress)
        exported = torch.export.export(
            graph,
            tuple(_inputs(state, edges)),
            dynamic_shapes=_dynamic_shapes(edges.mirrored),
            strict=False,
        )
    except Exception as error:  # tracing and export raise many kinds; all mean "cannot"
        raise AotBuildError(f"tracing the potential failed: {_first_line(error)}") from error
    scratch = Path(tempfile.mkdtemp(prefix="aot-", dir=path.parent))
    try:
        built = scratch / path.name
        try:
            with _inductor_settings(state.device), _cuda_home_for(state.device):
                torch._inductor.aoti_compile_and_package(exported, package_path=str(built))
        except Exception as error:
            raise AotBuildError(
                f"AOTInductor could not compile the potential: {_first_line(error)}"
            ) from error
        data = built.read_bytes()
        evaluation = AotEvaluation(_load(data), state.n_systems, compute_stress)
        error = check_against_eager(evaluation, potential, state, edges, compute_stress)
        built.replace(path)  # same directory: atomic
        vouched.vouch(path, data)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return evaluation, error


def check_against_eager(
    evaluation: AotEvaluation,
    potential: torch.nn.Module,
    state: State,
    edges: Edges,
    compute_stress: bool,
) -> float:
    """The largest force difference (eV/Å) from the eager evaluation, at these edges and at a
    capacity one pair larger; AotBuildError beyond float rounding."""
    from fastmace.models.backends import precision_loosening, rounding_tolerances

    dtype = potential.node_attr_table.dtype
    loosening = precision_loosening(dtype, potential.matmul_precision)
    worst = 0.0
    for trial in (edges, _one_slot_more(edges)):
        expected = potential.evaluate_eagerly(state, trial, compute_stress)
        actual = evaluation(state, trial)
        forces = expected.forces.detach().cpu().numpy()
        energy = float(expected.energy.detach().sum())
        energy_tolerance, force_tolerance = (
            tolerance * loosening
            for tolerance in rounding_tolerances(dtype, energy, forces, state.n_atoms)
        )
        force_error = float((actual.forces - expected.forces).abs().max())
        energy_error = float((actual.energy - expected.energy).abs().max())
        if not (force_error <= force_tolerance and energy_error <= energy_tolerance):
            raise AotBuildError(
                f"the compiled potential differs from the eager one at {trial.capacity} edge "
                f"slots: forces by {force_error:.3g} eV/Å (tolerance {force_tolerance:.3g}), "
                f"energy by {energy_error:.3g} eV (tolerance {energy_tolerance:.3g})"
            )
        worst = max(worst, force_error)
    return worst


def trace(
    potential: torch.nn.Module, state: State, edges: Edges, compute_stress: bool
) -> torch.fx.GraphModule:
    """The evaluation as one graph of operators, sizes of atoms and edges symbolic."""
    from torch.fx.experimental.proxy_tensor import make_fx

    call = traceable_model(potential, edges.mirrored)
    mirrored = edges.mirrored

    def evaluate(
        positions: torch.Tensor,
        atomic_numbers: torch.Tensor,
        cell: torch.Tensor,
        pbc: torch.Tensor,
        system: torch.Tensor,
        edge_index: torch.Tensor,
        unit_shifts: torch.Tensor,
        mask: torch.Tensor,
        padding_marker: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        # Velocities and masses do not enter the potential; the count and overflow flags are
        # the neighbour list's business.
        traced_state = State(
            positions, positions, positions[:, 0], atomic_numbers, cell, pbc, system
        )
        flag = torch.zeros((), dtype=torch.bool, device=positions.device)
        traced_edges = Edges(edge_index, unit_shifts, mask, flag.long(), flag, mirrored=mirrored)
        output = potential.evaluate_eagerly(
            traced_state, traced_edges, compute_stress, call, padding=padding_marker.shape[0]
        )
        if not compute_stress:
            return output.energy, output.forces
        return output.energy, output.forces, output.virial, output.stress

    with _python_spherical_harmonics():
        # The weights are constants of the graph; only the inputs are fake while tracing.
        return make_fx(evaluate, tracing_mode="symbolic", _allow_non_fake_inputs=True)(
            *_inputs(state, edges)
        )


def traceable_model(potential: torch.nn.Module, mirrored: bool) -> torch.nn.Module:
    """A copy of the potential's model (sharing its weights, which it does not train) whose
    blocks are plain Python modules: e3nn's TorchScript code would fix every size."""
    from mace.tools.compile import disable_e3nn_codegen, simplify

    from fastmace.dynamics.module_copy import weight_sharing_copy
    from fastmace.dynamics.pair_radials import pair_shared_model

    with disable_e3nn_codegen():
        copy = weight_sharing_copy(potential.model)
        if mirrored and potential.pair_model is not None:
            copy = pair_shared_model(copy)
        copy = simplify(copy)
    copy.requires_grad_(False)
    return copy


@contextlib.contextmanager
def _python_spherical_harmonics() -> Iterator[None]:
    """e3nn's spherical harmonics run as the Python function its TorchScript was made from.

    e3nn calls a module-level ``torch.jit.script`` function, which runs with concrete sizes
    and would fix the number of edges in the traced graph. torch keeps the original function
    on the scripted one (``_torchdynamo_inline``, for Dynamo); it is put in place for the
    tracing only and the scripted one restored after, in this thread's single trace.
    """
    from e3nn.o3 import _spherical_harmonics as module

    scripted = module._spherical_harmonics
    python = getattr(scripted, "_torchdynamo_inline", None)
    if python is None:
        yield
        return
    module._spherical_harmonics = python
    try:
        yield
    finally:
        module._spherical_harmonics = scripted


def _inputs(state: State, edges: Edges) -> list[torch.Tensor]:
    """The traced function's inputs. The number of padding nodes travels as the size of an
    empty-valued tensor of its own: computed inside the graph from the number of atoms, it
    put conditions on that number (more than 128 atoms, ...) that export refuses for a free
    size ("Constraints violated (atoms)"). At least two: a size of one would be traced as the
    constant 1, and a package built on a small cell could not serve a larger one (any number
    of padding nodes gives the same energies and forces)."""
    count = max(MIN_PADDING_NODES, padding_nodes(state.n_atoms))
    padding = torch.empty(count, dtype=torch.uint8, device=state.device)
    return [
        state.positions,
        state.atomic_numbers,
        state.cell,
        state.pbc,
        state.system,
        edges.edge_index,
        edges.unit_shifts,
        edges.mask,
        padding,
    ]


def _dynamic_shapes(mirrored: bool) -> tuple[dict[int, object] | None, ...]:
    atoms = torch.export.Dim("atoms", min=2)
    # Mirrored edges come in pairs, one direction in each half: the capacity is even.
    edges = 2 * torch.export.Dim("pairs", min=2) if mirrored else torch.export.Dim("edges", min=4)
    per_atom, per_edge = {0: atoms}, {0: edges}
    padding = {0: torch.export.Dim("padding", min=MIN_PADDING_NODES)}
    return (per_atom, per_atom, None, None, per_atom, {1: edges}, per_edge, per_edge, padding)


def _one_slot_more(edges: Edges) -> Edges:
    """The same edges in a buffer one padding slot (one pair, when mirrored) larger."""

    def grow(tensor: torch.Tensor, dim: int) -> torch.Tensor:
        halves = torch.chunk(tensor, 2, dim=dim) if edges.mirrored else (tensor,)
        shape = list(tensor.shape)
        shape[dim] = 1
        pad = torch.zeros(shape, dtype=tensor.dtype, device=tensor.device)
        return torch.cat([part for half in halves for part in (half, pad)], dim=dim)

    return Edges(
        grow(edges.edge_index, 1),
        grow(edges.unit_shifts, 0),
        grow(edges.mask, 0),
        edges.count,
        edges.overflow,
        mirrored=edges.mirrored,
    )


def _load(data: bytes) -> Callable[..., object]:
    """The package's runner, from the bytes that were checked (never again from the path,
    which could be swapped since).

    Made as ``torch._inductor.package.load_package`` makes it for a package without an archive
    index: ``aoti_load_package`` would then ask which vector instructions the CPU has, only to
    warn if they differ from the build's, and torch finds out by compiling a probe per
    instruction set and loading each in a fresh Python: 33 of a 34 s load on the H200's host
    (stage 64 of tools/validation/startup_gpu.sh). The cache key names the CPU's capability
    instead (``_device_description``), so a package is never served to another kind of CPU.
    """
    from torch._inductor.package.package import AOTICompiledModel

    with tempfile.TemporaryDirectory(prefix="fastmace-aot-") as scratch:
        path = Path(scratch) / "model.pt2"
        path.write_bytes(data)
        # The loader unpacks the archive into a directory of its own: the file can go.
        # Arguments: the model's name in the package, run single-threaded, one runner, and
        # device index -1 (the device the package was built for).
        loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", True, 1, -1)
    return AOTICompiledModel(loader)


@contextlib.contextmanager
def _inductor_settings(device: torch.device) -> Iterator[None]:
    from torch._inductor import config as inductor_config

    # Small constants (a table's spacing, a head index) stay tensors: inlined as numbers,
    # they reach custom operators' fallback kernels in a form Inductor cannot lower.
    settings: dict[str, object] = {"always_keep_tensor_constants": True}
    # Precompiled headers off, the ahead-of-time build's flag as well as the JIT's: Inductor
    # keeps them under its own /tmp directory, behind a lock that a killed compilation can
    # leave held, so that the next build waited ten minutes and failed (a CI run of bee0311;
    # see potential._compile_settings).
    if hasattr(inductor_config, "cpp_cache_precompile_headers"):
        settings["cpp_cache_precompile_headers"] = False
    if hasattr(inductor_config.aot_inductor, "precompile_headers"):
        settings["aot_inductor.precompile_headers"] = False
    if device.type == "cuda" and sys.platform == "linux":
        # As torch 2.11 links it for CUDA, the package's library carries a static copy of
        # libstdc++ whose locale is never set up: its loader crashed compiling a std::regex.
        # Linked to the process's shared libstdc++ first, it loads and runs (stage 62 of
        # tools/validation/startup_gpu.sh, docs/validation/performance.md).
        settings["aot_inductor.custom_op_libs"] = [":libstdc++.so.6"]
    with inductor_config.patch(settings):
        yield


@contextlib.contextmanager
def _cuda_home_for(device: torch.device) -> Iterator[None]:
    """A CUDA home for the package's C++ wrapper (CUDA headers, ``-lcuda``), for the build only.

    A machine with a CUDA toolkit uses it. Without one (a cluster's compute node, the GPU test
    machine), the stand-in of the CUDA wheels torch installed and the driver found the way the
    loader finds it (oeq/cuda_home.py) serves, and torch's builder sees it during the build
    only: its module-level CUDA_HOME and the variable are put back afterwards.
    """
    from torch.utils import cpp_extension

    if device.type != "cuda" or cpp_extension.CUDA_HOME is not None:
        yield
        return
    from fastmace.oeq import toolchain
    from fastmace.oeq.cuda_home import prepare_cuda_home

    driver, where = toolchain.find_driver_library()
    lib_dir = toolchain.nvidia_wheel_lib_dir()
    if driver is None or lib_dir is None:
        raise AotBuildError(
            "compiling the potential for CUDA needs CUDA's headers and the driver library: "
            f"no CUDA toolkit (CUDA_HOME), and the driver library is {where}"
            if driver is None
            else "no CUDA toolkit (CUDA_HOME) and no CUDA runtime wheel (nvidia/cu13) found"
        )
    home = prepare_cuda_home(
        cache.cache_root().path / "oeq", toolchain.cuda_wheel_include_dirs(), lib_dir, driver
    )
    with environment.restored(["CUDA_HOME"]):
        cpp_extension.CUDA_HOME = os.environ["CUDA_HOME"] = str(home.root)
        try:
            yield
        finally:
            cpp_extension.CUDA_HOME = None  # it was None: no CUDA toolkit was found


def _tensors_digest(module: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict(keep_vars=False).items()):
        host = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{host.dtype}:{tuple(host.shape)}".encode())
        digest.update(host.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _structure_digest(module: torch.nn.Module) -> str:
    names = [f"{name}:{type(child).__module__}.{type(child).__qualname__}"
             for name, child in module.named_modules()]  # fmt: skip
    return hashlib.sha256("\n".join(names).encode()).hexdigest()


def _device_description(device: torch.device) -> str:
    # The host code of every package is built for this CPU's vector instructions (ATen's
    # capability, as Inductor reads it): a cache root shared by different nodes keeps apart.
    cpu = f"{platform.machine()}:{torch.backends.cpu.get_cpu_capability()}"
    if device.type != "cuda":
        return f"{device.type}:{cpu}"
    properties = torch.cuda.get_device_properties(device)
    return f"cuda:{properties.name}:sm_{properties.major}{properties.minor}:{cpu}"


def _library_versions() -> dict[str, str]:
    versions = {}
    for name in _LIBRARIES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[name] = importlib.metadata.version(name)
    return versions


@functools.cache  # the sources do not change while a process runs
def _source_digest() -> str:
    import fastmace

    root = Path(fastmace.__file__).parent
    digest = hashlib.sha256(fastmace.__version__.encode())
    for folder in _TRACED_SOURCES:
        for source in sorted((root / folder).rglob("*.py")):
            digest.update(source.relative_to(root).as_posix().encode())
            digest.update(source.read_bytes())
    return digest.hexdigest()


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(error).__name__}: {first}"[:300]


__all__ = [
    "AotBuildError",
    "AotEvaluation",
    "AotReport",
    "aot_evaluation",
    "artefact_identity",
    "artefact_key",
    "check_against_eager",
]
