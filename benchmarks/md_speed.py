"""MD speed, side by side: FastMACE against mace-torch's MACECalculator driving ASE.

What is measured
----------------
Wall-clock milliseconds per MD step (and steps/s, ns/day at 1 fs) of Langevin NVT dynamics at
300 K with a 1 fs timestep and a friction of 10/ps (0.01/fs), in float32, on rock-salt NaCl
supercells (``ase.build.bulk("NaCl", "rocksalt", a=5.64, cubic=True).repeat(n)``, rattled by
0.05 Å: 8 n^3
atoms), for random-weight models with the shapes of released MACE models
(``fastmace.models.templates.template(name, seed=0)``; the cost depends on the shapes, not on
the weights). Both paths get the same template weights (seed 0, cast to float32). All cases
run in this one process, one after the other, on one device.

* FastMACE (``path = fastmace``): ``fastmace.models.load.load("template:NAME", backend=B,
  device, dtype)`` once per model and backend (converted and checked against e3nn; that time is
  reported as ``load_s`` and is not part of the step time), then
  ``fastmace.simulation.Simulation(loaded, [atoms], RunSettings(nvt, steps=N,
  schedule=OutputSchedule(0, 0, 0)), engine=EngineSettings(block_steps=K, graphs=...),
  output=None).run()``. The whole step
  (neighbour-list check and rebuild on the device, model, forces, integrator, thermostat noise)
  stays on the GPU; K steps are one CUDA-graph launch and the host synchronises once per block.
  Each engine block is timed on the host (the engine's own per-block synchronisation ends it).
  Block 1 runs eagerly (warm-up); with CUDA graphs on, block 2 also captures the graph. The
  reported ms/step is the mean over the blocks after those (graph replays only; blocks redone
  after a neighbour-list overflow and the one after them are left out too). ``run()``'s own
  ``timings["steps_per_s"]`` (which counts the capture block as steady) is kept as
  ``run_steps_per_s``. N is a whole number of blocks chosen so that the timed blocks last about
  ``--target-s`` seconds (3 to 40 blocks); K is ``--block-steps`` (20 above 10,000 atoms).
  Variants: backends ``hybrid`` (OpenEquivariance convolution + cuEquivariance) and ``cueq``,
  and ``hybrid`` with ``capture=False`` (same engine, no CUDA graphs: what the graphs bring).
* mace-torch (``path = ase``): ``mace.calculators.MACECalculator(models=[template],
  device, default_dtype)`` with its own options as the variant (``enable_cueq``,
  ``enable_oeq``, both = mace's hybrid, neither = e3nn, ``compile_mode="default"``), attached
  to ``ase.md.langevin.Langevin`` (fixcm=False). A calculator is built once per model and
  variant (compiled ones once per case) and that time is reported as ``build_s``. After a few
  warm-up steps (compilation included) and a short probe, ``dyn.run(n)`` is timed between two
  ``torch.cuda.synchronize()`` calls, with n chosen for about ``--target-s`` seconds (5 to 50
  steps; 3 to 10 above 10,000 atoms). Each step is what an ASE user pays: the neighbour list and
  graph built on the CPU, the model on the GPU (MACECalculator also evaluates the stress, its
  default for MACE models), forces copied back, the integrator in NumPy.

The "vs best MACECalculator" column divides the best (lowest) ms/step among the
MACECalculator variants of the same model and size by the row's ms/step.

Robustness: cases run in priority order (:func:`full_plan`: the main comparison at every
size first, then capture=False, the other variants and torch.compile); every case is wrapped
(CUDA OOM and other errors are recorded with their reason); memory is freed between cases; the
JSON and Markdown results are rewritten after every case. The time budget (``--budget-s``)
counts from process start: a case that would not fit, or any case once the budget is spent, is
reported as skipped; a running case is interrupted at the budget plus ``--grace-s`` (or after
``--case-timeout-s``).

Run on the GPU machine, from the repository root::

    python benchmarks/md_speed.py --budget-s 450    # writes to $OUT, else benchmarks/results

CPU dry run (tiny: mp0-small on 64 atoms, a few steps; OEq and hybrid fail there, recorded)::

    python benchmarks/md_speed.py --device cpu --quick --out /tmp/md_speed
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import importlib.metadata
import io
import json
import math
import os
import platform
import signal
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import fastmace  # before torch: it sets PyTorch's file locks at import (fastmace/__init__.py)

# isort: split
import ase
import ase.build
import numpy as np
import torch
from ase import units
from ase.md.langevin import Langevin
from ase.md.velocitydistribution import Stationary
from torch._dynamo.utils import counters as dynamo_counters

from fastmace.dynamics.ensembles import ensemble
from fastmace.dynamics.fusion import fusion_failures
from fastmace.io import OutputSchedule
from fastmace.models.checkpoint import contained, import_mace
from fastmace.models.load import LoadedModel, load
from fastmace.models.templates import template
from fastmace.planner import EngineConfig, EngineSettings, Plan, Workload, make_plan
from fastmace.runtime import environment
from fastmace.simulation import RunSettings, Simulation

TEMPERATURE_K = 300.0
TIMESTEP_FS = 1.0
FRICTION_PER_PS = 10.0  # = 0.01/fs, the same for both paths
SEED = 0
LATTICE_A = 5.64
RATTLE_A = 0.05  # the performance issue's set-up: rock salt rattled by 0.05 Å
HEADS = {"mh-1": "omat_pbe"}  # multi-head templates: the head to run
LARGE_ATOMS = 10_000  # above this: K = 20, fewer ASE steps
LARGEST_ATOMS = 157_464  # 27^3 rock-salt cells of 8 atoms

# (path, variant) -> label, in the order the table lists them within a row.
LABELS: dict[tuple[str, str], str] = {
    ("fastmace", "hybrid"): "FastMACE hybrid (OEq+cuEq)",
    ("fastmace", "cueq"): "FastMACE cuEq",
    ("fastmace", "default"): "FastMACE, fm.md's plan with no options",
    ("fastmace", "default-unfused"): "FastMACE, fm.md's plan, the step's arithmetic unfused",
    ("fastmace", "hybrid-nograph"): "FastMACE hybrid, capture=False",
    ("fastmace", "hybrid-compile"): "FastMACE hybrid + torch.compile",
    ("fastmace", "cueq-compile"): "FastMACE cuEq + torch.compile",
    ("fastmace", "cueq-tf32-compile"): "FastMACE cuEq, TF32 matmuls + torch.compile",
    ("fastmace", "cueq-table"): "FastMACE cuEq, radial table",
    ("fastmace", "cueq-table-compile"): "FastMACE cuEq, radial table + torch.compile",
    ("fastmace", "cueq-nograph"): "FastMACE cuEq, capture=False",
    ("fastmace", "cueq-tf32"): "FastMACE cuEq, TF32 matmuls",
    ("fastmace", "cueq-bf16"): "FastMACE cuEq, BF16 linear layers",
    ("fastmace", "cueq-bf16-table-compile"): "FastMACE cuEq, BF16 linear layers, table + compile",
    ("fastmace", "cueq-d3"): "FastMACE cuEq + D3(BJ) dispersion",
    ("fastmace", "cueq-conv-table"): "FastMACE cuEq, own convolution, radial table",
    ("fastmace", "cueq-conv-table-compile"): "FastMACE cuEq, own convolution, table + compile",
    ("fastmace", "hybrid-tf32"): "FastMACE hybrid, TF32 matmuls",
    ("fastmace", "e3nn"): "FastMACE e3nn",
    ("fastmace", "e3nn-nograph"): "FastMACE e3nn, capture=False",
    ("ase", "cueq"): "MACECalculator + ASE, cuEq",
    ("ase", "hybrid"): "MACECalculator + ASE, hybrid (cuEq+OEq)",
    ("ase", "oeq"): "MACECalculator + ASE, OEq",
    ("ase", "e3nn"): "MACECalculator + ASE, e3nn",
    ("ase", "cueq-compile"): "MACECalculator + ASE, cuEq + torch.compile",
    ("ase", "e3nn-compile"): "MACECalculator + ASE, e3nn + torch.compile",
}
# FastMACE variant -> (backend, capture, compile, matmul precision); capture None = CUDA graphs
# on CUDA devices. "-table" variants read the radial weights from tables (radial_table=True).
FASTMACE_VARIANTS: dict[str, tuple[str, bool | None, bool, str]] = {
    "hybrid": ("hybrid", None, False, "float32"),
    "cueq": ("cueq", None, False, "float32"),
    # fm.md's own plan with no options for a run of --planned-steps: the backend, compile,
    # radial tables and K are the planner's (the placeholder's fields are not used).
    "default": ("cueq", None, False, "float32"),
    "default-unfused": ("cueq", None, False, "float32"),
    "cueq-tf32": ("cueq", None, False, "tf32"),
    "cueq-bf16": ("cueq", None, False, "bf16"),
    "cueq-bf16-table-compile": ("cueq", None, True, "bf16"),
    "cueq-d3": ("cueq", None, False, "float32"),
    "hybrid-tf32": ("hybrid", None, False, "tf32"),
    "hybrid-nograph": ("hybrid", False, False, "float32"),
    "cueq-nograph": ("cueq", False, False, "float32"),
    "hybrid-compile": ("hybrid", None, True, "float32"),
    "cueq-compile": ("cueq", None, True, "float32"),
    "cueq-tf32-compile": ("cueq", None, True, "tf32"),
    "cueq-table": ("cueq", None, False, "float32"),
    "cueq-table-compile": ("cueq", None, True, "float32"),
    # "-conv" variants run FastMACE's own convolution kernels (fused_convolution=True).
    "cueq-conv-table": ("cueq", None, False, "float32"),
    "cueq-conv-table-compile": ("cueq", None, True, "float32"),
    "e3nn": ("e3nn", None, False, "float32"),
    "e3nn-nograph": ("e3nn", False, False, "float32"),
}
# MACECalculator variant -> its keyword arguments.
ASE_VARIANTS: dict[str, dict[str, Any]] = {
    "cueq": {"enable_cueq": True},
    "hybrid": {"enable_cueq": True, "enable_oeq": True},
    "oeq": {"enable_oeq": True},
    "e3nn": {},
    "cueq-compile": {"enable_cueq": True, "compile_mode": "default"},
    "e3nn-compile": {"compile_mode": "default"},
}
MODEL_ORDER = ("mp0-small", "mp0-medium", "mh-1")
# First guess of FastMACE's ms/step with CUDA graphs on an H200: a + b * atoms (only used to
# choose N before a measurement of the same model exists).
GUESS_MS = {"mp0-small": (0.5, 0.0008), "mp0-medium": (0.8, 0.0015), "mh-1": (2.0, 0.012)}
EAGER_EXTRA_MS = 20.0  # an uncaptured step pays for thousands of kernel launches

_NOISY_WARNINGS = (
    "The TorchScript type system doesn't support",
    "`torch.jit.script` is deprecated",
)


@dataclass(frozen=True)
class Case:
    """One measurement: a model template on a NaCl cell of ``atoms`` atoms, by one path."""

    model: str
    atoms: int
    path: str  # "fastmace" or "ase"
    variant: str

    @property
    def id(self) -> str:
        return f"{self.model}/{self.atoms}/{self.path}-{self.variant}"

    @property
    def label(self) -> str:
        return LABELS[(self.path, self.variant)]


class CaseTimeout(BaseException):
    """A case ran past its time limit (BaseException: library code must not swallow it)."""


# -- the plan ------------------------------------------------------------------------------


def full_plan() -> list[Case]:
    """The GPU plan, most important first.

    1. the main comparison at 1728 and 216 atoms of MP-0 medium: FastMACE hybrid and cuEq,
       MACECalculator cuEq and hybrid;
    2. the same for MH-1 at 216 and 1728 atoms;
    3. the large sizes of MP-0 medium (13824, 32768) in the four main variants, then FastMACE
       cuEq with TF32 matmuls (EngineConfig(matmul_precision="tf32")) at every size;
    4. torch.compile at 1728 and 216 atoms of MP-0 medium: FastMACE hybrid + compile and
       MACECalculator cuEq + compile;
    5. what the graphs bring (capture=False) at 1728 and 216 atoms;
    6. MACECalculator e3nn and OEq, then the other torch.compile cases;
    7. FastMACE cuEq with TF32 and torch.compile, and the largest cell (memory per atom).

    A GPU session splits it with ``--only`` (docs/validation/performance.md has the commands);
    each call compares the paths side by side in one process.
    """
    # 0. fm.md's own plan with no options (the default path) at every MP-0-medium size and
    # at issue 30's MH-1 sizes.
    default = [Case("mp0-medium", n, "fastmace", "default") for n in (216, 1728, 13824, 32768)]
    default += [Case("mh-1", n, "fastmace", "default") for n in (216, 1728, 13824)]
    # The default path with the step's own arithmetic unfused (dynamics/fusion.py).
    default += [Case(m, n, "fastmace", "default-unfused")
                for m, n in (("mp0-medium", 216), ("mp0-medium", 1728), ("mh-1", 216))]  # fmt: skip
    main = (("fastmace", "hybrid"), ("ase", "cueq"), ("fastmace", "cueq"), ("ase", "hybrid"))
    small = [("mp0-medium", 1728), ("mp0-medium", 216), ("mh-1", 216), ("mh-1", 1728)]
    large = [("mp0-medium", 13824), ("mp0-medium", 32768)]
    cases = default + [Case(m, n, p, v) for m, n in small for p, v in main]
    cases += [Case(m, n, p, v) for m, n in large for p, v in main]
    cases += [Case(m, n, "fastmace", "cueq-tf32") for m, n in small + large]
    compiled = (
        ("fastmace", "cueq-compile"),
        ("fastmace", "hybrid-compile"),
        ("ase", "cueq-compile"),
    )
    cases += [Case("mp0-medium", n, p, v) for n in (1728, 216) for p, v in compiled]
    cases += [Case("mp0-medium", n, "fastmace", "hybrid-nograph") for n in (1728, 216)]
    cases += [Case(m, n, "ase", v) for m, n in small + large for v in ("e3nn", "oeq")]
    cases += [Case(m, n, p, v) for m, n in small[2:] + large for p, v in compiled]
    cases.append(Case("mp0-medium", 1728, "ase", "e3nn-compile"))
    cases += [Case("mp0-medium", n, "fastmace", "cueq-tf32-compile") for n in (216, 1728, 13824)]
    cases += [Case("mh-1", n, "fastmace", "cueq-tf32-compile") for n in (216, 1728)]
    # Radial weights from tables (EngineConfig(radial_table=True)), MP-0 medium only: MH-1's
    # blocks feed the elements to their radial MLPs, which a table of the distance cannot.
    sizes = (216, 1728, 13824, 32768)
    cases += [Case("mp0-medium", n, "fastmace", v) for n in sizes
              for v in ("cueq-table-compile", "cueq-table")]  # fmt: skip
    # The largest cell of the targets (at least 150,000 atoms): memory per atom.
    cases.append(Case("mp0-medium", LARGEST_ATOMS, "fastmace", "cueq"))
    # D3(BJ)'s cost against the plain step (issue: at most 1.3x at 13,824 atoms).
    cases += [Case("mp0-medium", n, "fastmace", "cueq-d3") for n in (1728, 13824)]
    # The BF16 tier (matmul_precision="bf16"), plain and on the fast path, beside float32's.
    cases += [Case("mp0-medium", 13824, "fastmace", v)
              for v in ("cueq-bf16", "cueq-bf16-table-compile")]  # fmt: skip
    # FastMACE's own convolution kernels (issue 30) beside cuEquivariance's, with tables.
    cases += [Case("mp0-medium", n, "fastmace", v) for n in (1728, 13824)
              for v in ("cueq-conv-table", "cueq-conv-table-compile")]  # fmt: skip
    # Where it starts to pay (between 1,728 and 13,824 atoms) and how it scales.
    cases += [Case("mp0-medium", n, "fastmace", v) for n in (4096, 8000)
              for v in ("cueq-table-compile", "cueq-conv-table-compile")]  # fmt: skip
    cases.append(Case("mp0-medium", 32768, "fastmace", "cueq-conv-table-compile"))
    # MH-1's tables per pair of elements, apart and read inside FastMACE's convolution.
    cases += [Case("mh-1", n, "fastmace", v) for n in (1728, 13824)
              for v in ("cueq-table-compile", "cueq-conv-table-compile")]  # fmt: skip
    return cases


def quick_plan() -> list[Case]:
    """The CPU dry run on 64 atoms of mp0-small: hybrid and OEq fail on the CPU (which tests
    the error path), FastMACE runs with e3nn (the CPU backend; no graphs on a CPU) and, last
    because its CPU fallback is slow, cuEq; torch.compile only with --quick-compile."""
    variants = [
        ("fastmace", "hybrid"),
        ("ase", "e3nn"),
        ("fastmace", "e3nn"),
        ("fastmace", "e3nn-nograph"),
        ("fastmace", "default"),
        ("ase", "hybrid"),
        ("ase", "oeq"),
        ("ase", "cueq"),
        ("fastmace", "cueq"),
        ("ase", "e3nn-compile"),
    ]
    return [Case("mp0-small", 64, p, v) for p, v in variants]


# -- small helpers -------------------------------------------------------------------------


def process_age_s() -> float:
    """Seconds since this process started (Linux /proc), so the budget includes the imports."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        start_ticks = int(fields[19])  # field 22 of stat(5), counted after "(comm)"
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def _raise_timeout(signum: int, frame: Any) -> None:
    raise CaseTimeout()


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise CaseTimeout in the main thread after ``seconds`` (no limit where SIGALRM is
    missing)."""
    if not hasattr(signal, "setitimer"):
        yield
        return
    previous = signal.signal(signal.SIGALRM, _raise_timeout)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def nacl(atoms: int) -> ase.Atoms:
    """Rock-salt NaCl, the cubic 8-atom cell repeated n times along each axis, rattled."""
    n = round((atoms / 8) ** (1 / 3))
    if 8 * n**3 != atoms:
        raise ValueError(f"{atoms} atoms is not a cubic NaCl supercell (8 n^3)")
    structure = ase.build.bulk("NaCl", "rocksalt", a=LATTICE_A, cubic=True).repeat(n)
    structure.rattle(RATTLE_A, seed=1)  # off the lattice sites, so forces are not all zero
    return structure


def thermalize(atoms: ase.Atoms, temperature_K: float, rng: np.random.Generator) -> None:
    """Maxwell-Boltzmann momenta (ASE 3.29 renamed the function)."""
    try:
        from ase.md.velocitydistribution import thermalize_momenta
    except ImportError:
        from ase.md.velocitydistribution import MaxwellBoltzmannDistribution

        MaxwellBoltzmannDistribution(atoms, temperature_K=temperature_K, rng=rng)
    else:
        thermalize_momenta(atoms, temperature_K, rng=rng)


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def free_memory(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def error_record(error: BaseException) -> dict[str, str]:
    return {
        "type": type(error).__name__,
        "message": str(error)[:2000],
        "traceback": traceback.format_exc()[-4000:],
    }


def atomic_write(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


def fmt(value: float | None, digits: int = 3) -> str:
    """A number with about ``digits`` significant digits, never in exponent form."""
    if value is None or not math.isfinite(value):
        return "—"
    if value == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:,.{decimals}f}"


def ns_per_day(steps_per_s: float) -> float:
    return steps_per_s * TIMESTEP_FS * 86_400 * 1e-6


# -- the environment -----------------------------------------------------------------------


def package_versions() -> dict[str, str]:
    wanted = ("torch", "mace-torch", "ase", "e3nn", "numpy", "matscipy", "openequivariance")
    found: dict[str, str] = {}
    for name in wanted:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[name] = importlib.metadata.version(name)
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name.startswith(("cuequivariance", "openequivariance", "nvidia-cuda-runtime")):
            found[name] = dist.version
    # Modules found on PYTHONPATH without distribution metadata (OEq from source on the GPU
    # machine): their __version__, if mace-torch has imported them already (never import
    # OpenEquivariance here: FastMACE's runtime must be the one to do it).
    for module in ("openequivariance", "cuequivariance", "cuequivariance_torch",
                   "cuequivariance_ops_torch"):  # fmt: skip
        loaded = sys.modules.get(module)
        version = getattr(loaded, "__version__", None) if loaded else None
        if version is not None and not any(k.startswith(module.replace("_", "-")) for k in found):
            found[module.replace("_", "-")] = f"{version} (module)"
    found["fastmace"] = fastmace.__version__
    return dict(sorted(found.items()))


def gpu_info() -> dict[str, Any]:
    if not torch.cuda.is_available():
        return {"available": False}
    props = torch.cuda.get_device_properties(0)
    info: dict[str, Any] = {
        "available": True,
        "name": torch.cuda.get_device_name(0),
        "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
        "memory_GiB": round(props.total_memory / 2**30, 1),
        "count": torch.cuda.device_count(),
        "torch_cuda": torch.version.cuda,
    }
    try:
        query = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version,name", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        )  # fmt: skip
        info["driver"] = query.stdout.strip().splitlines()[0].split(",")[0].strip()
    except (OSError, subprocess.SubprocessError, IndexError) as error:
        info["driver"] = f"unknown (nvidia-smi: {type(error).__name__})"
    return info


def git_commit() -> str | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
            cwd=Path(__file__).resolve().parent, check=True,
        )  # fmt: skip
        return done.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def fastmace_backends(device: str) -> dict[str, str]:
    from fastmace.models import backends

    found = {}
    for name in ("hybrid", "cueq", "oeq"):
        try:
            item = backends.availability(name, device)
            found[name] = f"{'available' if item.available else 'unavailable'}: {item.reason}"
        except Exception as error:  # a report, not a check: never stop the benchmark here
            found[name] = f"unknown ({type(error).__name__}: {error})"
    return found


def oeq_record() -> dict[str, Any] | None:
    from fastmace.oeq import host_extension

    record = host_extension.record()
    return None if record is None else asdict(record)


# -- the benchmark -------------------------------------------------------------------------


class Bench:
    """The plan, the caches of converted models, the records and the output files."""

    def __init__(self, args: argparse.Namespace, cases: list[Case]) -> None:
        self.args = args
        self.device: str = args.device
        self.cuda = self.device.startswith("cuda")
        self.cases = cases
        self.records: list[dict[str, Any]] = [
            {"id": c.id, "model": c.model, "atoms": c.atoms, "path": c.path,
             "variant": c.variant, "label": c.label, "status": "pending"}
            for c in cases
        ]  # fmt: skip
        now = time.monotonic()
        self.started = now - process_age_s()
        self.budget_end = self.started + args.budget_s
        self.hard_end = self.budget_end + args.grace_s
        self.out = Path(args.out)
        self.meta: dict[str, Any] = {}
        self.templates: dict[str, torch.nn.Module] = {}
        self.loaded: dict[tuple[str, str], LoadedModel | str] = {}
        self.calculators: dict[tuple[str, str], Any] = {}

    # -- time --------------------------------------------------------------------------

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def remaining(self) -> float:
        return self.budget_end - time.monotonic()

    def log(self, text: str) -> None:
        print(f"[{self.elapsed():6.1f} s] {text}", flush=True)

    def estimate_s(self, case: Case) -> float:
        """A rough upper guess of a case's wall time, to skip what would not fit."""
        target = self.args.target_s
        large = case.atoms > LARGE_ATOMS
        if case.path == "fastmace":
            backend = FASTMACE_VARIANTS[case.variant][0]
            cost = 3.0 + 2.0 * target + (8.0 if large else 0.0)
            if FASTMACE_VARIANTS[case.variant][2] or case.variant.startswith("default"):
                cost += 90.0  # Inductor, cold cache
            if (case.model, backend) not in self.loaded:
                cost += 20.0 if case.model == "mh-1" else 12.0
            return cost
        cost = 3.0 + 1.5 * target + (10.0 if large else 0.0)
        if "compile" in case.variant:
            cost += 75.0
        elif (case.model, case.variant) not in self.calculators:
            cost += 8.0
        return cost

    # -- models ------------------------------------------------------------------------

    def template(self, name: str) -> torch.nn.Module:
        if name not in self.templates:
            self.templates[name] = template(name, seed=SEED, dtype=torch.float64)
        return self.templates[name]

    def fastmace_model(self, name: str, backend: str) -> tuple[LoadedModel, float | None]:
        """fastmace.load once per model and backend (a failure is remembered, not retried)."""
        key = (name, backend)
        if key in self.loaded:
            cached = self.loaded[key]
            if isinstance(cached, str):
                raise RuntimeError(f"loading failed earlier: {cached}")
            return cached, None
        tick = time.perf_counter()
        try:
            loaded = load(
                f"template:{name}", head=HEADS.get(name), backend=backend,
                device=self.device, dtype=self.args.dtype, seed=SEED,
            )  # fmt: skip
        except Exception as error:
            self.loaded[key] = f"{type(error).__name__}: {error}"
            raise
        synchronize(self.device)
        self.loaded[key] = loaded
        return loaded, time.perf_counter() - tick

    def force_error(self, name: str, simulation: Simulation) -> dict[str, float]:
        """Forces of the run's potential at its first state against mace-torch's float64 e3nn
        model on the same atoms and edges: largest and RMS error, and the RMS force."""
        from fastmace.dynamics.potential import Potential

        key = (name, "e3nn-float64")
        if key not in self.loaded:
            self.loaded[key] = load(
                f"template:{name}", head=HEADS.get(name), backend="e3nn",
                device=self.device, dtype="float64", seed=SEED,
            )  # fmt: skip
        force_field = simulation.engine.force_field
        state = simulation.engine.md.state
        edges = force_field.model_edges(state)
        reference = Potential.from_loaded(self.loaded[key], state.atomic_numbers)
        expected = reference(state, edges).forces
        actual = force_field.potential(state, edges).forces
        error = (actual - expected).norm(dim=-1)
        result = {
            "force_error_max_eV_A": float(error.max()),
            "force_error_rms_eV_A": float(error.pow(2).mean().sqrt()),
            "force_rms_eV_A": float(expected.norm(dim=-1).pow(2).mean().sqrt()),
        }
        del reference, expected, actual
        free_memory(self.device)
        return result

    def calculator(self, name: str, variant: str) -> tuple[Any, float | None]:
        """A MACECalculator (kept per model and variant unless compiled)."""
        key = (name, variant)
        compiled = "compile" in variant
        if key in self.calculators:
            cached = self.calculators[key]
            if isinstance(cached, str):
                raise RuntimeError(f"building the calculator failed earlier: {cached}")
            return cached, None
        from mace.calculators import MACECalculator

        dtype = {"float32": torch.float32, "float64": torch.float64}[self.args.dtype]
        model = copy.deepcopy(self.template(name)).to(dtype)
        extra = {"head": HEADS[name]} if name in HEADS else {}
        tick = time.perf_counter()
        try:
            with contained():  # mace's converters change the default dtype: put it back
                calc = MACECalculator(
                    models=[model], device=self.device, default_dtype=self.args.dtype,
                    **ASE_VARIANTS[variant], **extra,
                )  # fmt: skip
        except Exception as error:
            if not compiled:
                self.calculators[key] = f"{type(error).__name__}: {error}"
            raise
        synchronize(self.device)
        if not compiled:
            self.calculators[key] = calc
        return calc, time.perf_counter() - tick

    # -- FastMACE ----------------------------------------------------------------------

    def predict_ms(self, case: Case, capture: bool) -> float:
        """ms/step to expect: from the nearest measured size of the same model and capture
        mode when there is one, else the first guess."""
        measured = [
            (r["atoms"], r["ms_per_step"]) for r in self.records
            if r["status"] == "ok" and r["path"] == "fastmace" and r["model"] == case.model
            and r.get("captured") == capture
        ]  # fmt: skip
        if measured:
            atoms, ms = min(measured, key=lambda m: abs(math.log(m[0] / case.atoms)))
            ratio = case.atoms / atoms
            return ms * (ratio if ratio >= 1 else math.sqrt(ratio))  # smaller: sublinear
        if not self.cuda:
            return 100.0 + 2.0 * case.atoms
        a, b = GUESS_MS.get(case.model, (2.0, 0.01))
        return a + b * case.atoms + (0.0 if capture else EAGER_EXTRA_MS)

    def default_plan(self, case: Case) -> tuple[Plan, LoadedModel, float | None]:
        """The plan fm.md makes with no options for --planned-steps of this case's Langevin
        run, made again with the loaded model's facts (radial tables, the cache's compile
        record) as fm.md does; the model loaded on the plan's backend."""
        from fastmace.api import _model_facts  # the function fm.md itself uses
        from fastmace.machine import probe_availabilities

        workload = Workload.from_structures(
            [nacl(case.atoms)], ensemble="nvt", temperature_K=TEMPERATURE_K,
            steps=self.args.planned_steps, timestep_fs=TIMESTEP_FS,
            device=self.device, precision=self.args.dtype,
        )  # fmt: skip
        first = make_plan(workload, EngineConfig(), probe_availabilities())
        loaded, load_s = self.fastmace_model(case.model, first.backend)
        plan = make_plan(_model_facts(loaded, first), first.config, first.availabilities)
        if (plan.backend, plan.dtype) != (loaded.backend, loaded.dtype):
            raise RuntimeError(f"fm.md's plan runs {plan.backend} {plan.dtype}, not as loaded")
        return plan, loaded, load_s

    def run_fastmace(self, case: Case) -> dict[str, Any]:
        backend, capture_setting, compile_model, matmul = FASTMACE_VARIANTS[case.variant]
        plan = None
        if case.variant.startswith("default"):
            plan, loaded, load_s = self.default_plan(case)
            compile_model, matmul = plan.compile, plan.matmul_precision
        else:
            loaded, load_s = self.fastmace_model(case.model, backend)
        capture = self.cuda if capture_setting is None else capture_setting
        block = self.args.block_steps
        if case.atoms > LARGE_ATOMS:
            block = min(block, 20)
        if plan is not None:
            block = plan.block_steps
        untimed = 2 if capture else 1  # warm-up block (+ the capture block)
        predicted = None if self.args.quick else self.predict_ms(case, capture)
        if predicted is None:
            timed = 2
        else:
            block_s = predicted * block / 1000
            budget = min(self.args.target_s, max(self.remaining() * 0.3, 1.0))
            timed = min(max(math.ceil(budget / block_s), 3), 40)
        # "-d3" variants add D3(BJ) with PBE's parameters (the functional MP-0 was fitted to).
        dispersion = {"dispersion": "d3bj", "dispersion_functional": "pbe"}
        settings = RunSettings(
            ensemble=ensemble("nvt", temperature_K=TEMPERATURE_K, friction_per_ps=FRICTION_PER_PS),
            **(dispersion if case.variant.endswith("-d3") else {}),
            steps=block * (untimed + timed),
            timestep_fs=TIMESTEP_FS,
            seed=SEED,
            schedule=OutputSchedule(0, 0, 0),
            initial_temperature_K=TEMPERATURE_K,
        )
        engine = EngineSettings(
            device=loaded.device, backend=loaded.backend, block_steps=block,
            graphs=capture_setting, compile=compile_model, matmul_precision=matmul,
            radial_table="-table" in case.variant, fused_convolution="-conv" in case.variant,
        )  # fmt: skip
        if compile_model:
            # Each case compiles afresh: Dynamo's recompile limit counts every earlier case's
            # shapes of mace's forward, and past it the model silently runs eagerly.
            torch._dynamo.reset()
            dynamo_counters.clear()
        simulation = Simulation(
            loaded, [nacl(case.atoms)], settings, output=None,
            engine=engine if plan is None else None, plan=plan, progress=io.StringIO(),
        )  # fmt: skip
        if case.variant == "default-unfused":  # as before dynamics/fusion.py, for comparison
            simulation.engine.fuse = False
        # steps, seconds, and what the block did: "redone" (an overflow or a stale list),
        # "launch" (eager or captured: with D3 a second block pattern is captured later on)
        # or "steady"
        blocks: list[tuple[int, float, str]] = []
        run_block = simulation.engine.run_block

        def timed_block(steps: int | None = None) -> Any:
            tick = time.perf_counter()
            report = run_block(steps)  # ends with the engine's one host synchronisation
            kind = "steady"
            if report.rebuilt_capacity or report.searched_more_often:
                kind = "redone"
            elif capture and simulation.engine.last_launch != "replay":
                kind = "launch"
            blocks.append((steps or block, time.perf_counter() - tick, kind))
            return report

        errors = self.force_error(case.model, simulation) if self.args.force_errors else {}
        simulation.engine.run_block = timed_block  # type: ignore[method-assign]
        result = simulation.run()
        excluded = set(range(untimed))
        for index, (_, _, kind) in enumerate(blocks):
            if kind == "redone":  # an overflow or a stale list: redone, recaptured
                excluded.update((index, index + 1))
            elif kind == "launch":
                excluded.add(index)
        steady = [b for i, b in enumerate(blocks) if i not in excluded]
        if not steady:
            failure = simulation.engine.capture_failure
            if failure:  # every block then launches eagerly, and none counts as steady
                raise RuntimeError(f"no captured block to time: {failure}")
            raise RuntimeError("no steady block left to time (neighbour-list regrowths)")
        steady_steps = sum(s for s, _, _ in steady)
        steady_s = sum(t for _, t, _ in steady)
        per_block = sorted(1000 * t / s for s, t, _ in steady)
        ms = 1000 * steady_s / steady_steps
        thermo = result.thermo[0] if result.thermo else {}
        simulation.engine.run_block = run_block  # type: ignore[method-assign]
        profile = self.kernel_profile(case, simulation) if self.args.profile else {}
        return {
            "ms_per_step": ms,
            "steps_per_s": 1000 / ms,
            "ns_per_day": ns_per_day(1000 / ms),
            "captured": capture,
            "backend": loaded.backend,
            "block_steps": block,
            "steps": result.steps,
            "timed_steps": steady_steps,
            "timed_s": steady_s,
            "ms_per_step_best_block": per_block[0],
            "ms_per_step_median_block": per_block[len(per_block) // 2],
            "warmup_block_s": blocks[0][1],
            "capture_block_s": blocks[1][1] if capture and len(blocks) > 1 else None,
            "setup_s": result.timings.get("setup_s"),
            "run_first_block_s": result.timings.get("first_block_s"),
            "run_steps_per_s": result.timings.get("steps_per_s"),
            "regrowths": simulation.engine.regrowths,
            "search_every": simulation.engine.force_field.search_every,
            "search_halvings": simulation.engine.search_halvings,
            "compiled": simulation.potential.compiled,
            "compile_failure": simulation.potential.compile_failure,
            # Dynamo graphs compiled in this case: one when a regrowth compiled nothing new.
            "dynamo_graphs": dynamo_counters["stats"]["unique_graphs"] if compile_model else None,
            "first_blocks_s": [round(t, 3) for _, t, _ in blocks[:8]],
            "dispersion_kernel": (
                term.kernel_choice if (term := simulation.engine.force_field.dispersion) else None
            ),
            "matmul_precision": matmul,
            "radial_table": (
                asdict(report) if (report := simulation.potential.table_report) else None
            ),
            # Whether FastMACE's own convolution ran (asked for, or chosen by the default plan).
            "fused_convolution": simulation.potential.fused_convolution_used,
            "fused_step": simulation.engine.fuse,
            "fused_step_failures": fusion_failures(),
            "fused_convolution_failure": simulation.potential.fused_convolution_failure,
            "capture_failure": simulation.engine.capture_failure,
            # cuEquivariance linear layers run as batched GEMMs (dynamics/stacked_linear.py).
            "stacked_layers": len(getattr(simulation.potential, "stacked_layers", ())),
            "edge_capacity": simulation.neighbours.capacity,
            "model_edge_capacity": simulation.neighbours.cutoff_capacity,
            "final_temperature_K": thermo.get("temperature_K"),
            "load_s": load_s,
            "conversion_check": (
                asdict(loaded.conversion_check) if loaded.conversion_check else None
            ),
            "predicted_ms_per_step": predicted,
            **({} if plan is None else self.plan_record(plan)),
            **errors,
            **profile,
        }

    @staticmethod
    def plan_record(plan: Plan) -> dict[str, Any]:
        """What the default plan chose, with its reasons."""
        chosen = ("backend", "compile", "radial_table", "fused_convolution", "block_steps",
                  "matmul_precision")  # fmt: skip
        return {
            "planned_steps": plan.workload.steps,
            "compile_cost_s": plan.workload.compile_cost_s,
            "plan": {name: [plan.value(name), plan.decision(name).reason] for name in chosen},
        }

    def kernel_profile(self, case: Case, simulation: Simulation) -> dict[str, Any]:
        """--profile: the kernels of two more replayed blocks by family and the ten largest
        (benchmarks/profile_step.py's table), printed and kept in the case."""
        if not (self.cuda and simulation.engine.capture):
            return {"kernel_profile": "not profiled: CUDA graphs only"}
        from profile_step import kernel_table  # benchmarks/ is on sys.path: the script's own

        rows = kernel_table(simulation, 2)
        families: dict[str, list[float]] = {}
        for row in rows:
            total = families.setdefault(row["family"], [0.0, 0.0])
            total[0] += row["ms_per_step"]
            total[1] += row["calls_per_step"]
        lines = [f"kernels of {case.id}, ms and launches per step:"]
        for name, (ms, calls) in sorted(families.items(), key=lambda item: -item[1][0]):
            lines.append(f"  {ms:9.3f} ms {calls:7.1f}  {name}")
        print("\n".join(lines), flush=True)
        return {
            "kernel_families": {name: {"ms_per_step": ms, "launches_per_step": calls}
                                for name, (ms, calls) in families.items()},
            "largest_kernels": rows[:10],
        }  # fmt: skip

    # -- MACECalculator + ASE ----------------------------------------------------------

    def run_ase(self, case: Case) -> dict[str, Any]:
        calc, build_s = self.calculator(case.model, case.variant)
        atoms = nacl(case.atoms)
        rng = np.random.default_rng(SEED)
        thermalize(atoms, TEMPERATURE_K, rng)
        Stationary(atoms)
        atoms.calc = calc
        dynamics = Langevin(
            atoms, TIMESTEP_FS * units.fs, temperature_K=TEMPERATURE_K,
            friction=FRICTION_PER_PS * 1e-3 / units.fs, fixcm=False, rng=rng,
        )  # fmt: skip
        large = case.atoms > LARGE_ATOMS
        quick = self.args.quick
        warmup = 1 if quick else (2 if large else 3)
        try:
            synchronize(self.device)
            tick = time.perf_counter()
            dynamics.run(warmup)  # the first force call, kernel set-up, compilation
            synchronize(self.device)
            warmup_s = time.perf_counter() - tick
            if quick:
                steps = 3
                probe_ms = None
            else:
                probe = 1 if large else 2
                tick = time.perf_counter()
                dynamics.run(probe)
                synchronize(self.device)
                probe_ms = 1000 * (time.perf_counter() - tick) / probe
                budget = min(self.args.target_s, max(self.remaining() * 0.3, 1.0))
                least, most = (3, 10) if large else (5, 50)
                steps = min(max(math.ceil(1000 * budget / probe_ms), least), most)
            synchronize(self.device)
            tick = time.perf_counter()
            dynamics.run(steps)
            synchronize(self.device)
            elapsed = time.perf_counter() - tick
        finally:
            atoms.calc = None
            calc.reset()
        ms = 1000 * elapsed / steps
        return {
            "ms_per_step": ms,
            "steps_per_s": 1000 / ms,
            "ns_per_day": ns_per_day(1000 / ms),
            "timed_steps": steps,
            "timed_s": elapsed,
            "warmup_steps": warmup,
            "warmup_s": warmup_s,
            "probe_ms_per_step": probe_ms,
            "build_s": build_s,
            "final_temperature_K": float(atoms.get_temperature()),
        }

    # -- running -----------------------------------------------------------------------

    def run_case(self, index: int) -> bool:
        """Run case ``index``; False when the whole run must stop (hard time limit)."""
        case, record = self.cases[index], self.records[index]
        head = f"({index + 1}/{len(self.cases)}) {case.id}"
        if self.args.quick and "compile" in case.variant and not self.args.quick_compile:
            record.update(status="skipped", reason="torch.compile is left out of --quick")
            self.log(f"{head}: skipped ({record['reason']})")
            return True
        need, left = self.estimate_s(case), self.remaining()
        if left <= 0 or need > left:
            why = "budget spent" if left <= 0 else f"needs ~{need:.0f} s, {left:.0f} s left"
            record.update(status="skipped", reason=why)
            self.log(f"{head}: skipped ({why})")
            return True
        self.log(f"{head}: running ({case.label}) ...")
        free_memory(self.device)
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        limit = min(self.args.case_timeout_s, self.hard_end - time.monotonic())
        tick = time.monotonic()
        keep_going = True
        try:
            with time_limit(limit):
                details = self.run_fastmace(case) if case.path == "fastmace" else self.run_ase(case)
            record.update(status="ok", **details)
        except CaseTimeout:
            keep_going = time.monotonic() < self.hard_end - 1.0
            record.update(
                status="timeout",
                error={"type": "CaseTimeout", "message": f"interrupted after {limit:.0f} s"},
            )
        except torch.cuda.OutOfMemoryError as error:
            record.update(status="oom", error=error_record(error))
        except Exception as error:
            record.update(status="failed", error=error_record(error))
        record["wall_s"] = time.monotonic() - tick
        if self.cuda:
            record["peak_memory_GiB"] = torch.cuda.max_memory_allocated() / 2**30
        free_memory(self.device)
        if record["status"] == "ok":
            self.log(
                f"{head}: {fmt(record['ms_per_step'])} ms/step, "
                f"{fmt(record['steps_per_s'])} steps/s ({record['timed_steps']} steps timed, "
                f"case {record['wall_s']:.1f} s)"
            )
        else:
            message = record["error"]["message"].splitlines()[0] if record["error"] else ""
            self.log(f"{head}: {record['status'].upper()}: {record['error']['type']}: {message}")
        return keep_going

    def run(self) -> None:
        for index in range(len(self.cases)):
            if not self.run_case(index):
                for record in self.records[index + 1 :]:
                    record.update(status="skipped", reason="hard time limit reached")
                self.write()
                break
            self.write()

    # -- results -----------------------------------------------------------------------

    def payload(self, complete: bool) -> dict[str, Any]:
        return {
            "benchmark": "md_speed",
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "settings": vars(self.args),
            "conditions": {
                "structure": f"rock-salt NaCl, a = {LATTICE_A} Å, cubic 8-atom cell repeated",
                "ensemble": "Langevin NVT",
                "temperature_K": TEMPERATURE_K,
                "timestep_fs": TIMESTEP_FS,
                "friction_per_ps": FRICTION_PER_PS,
                "weights": f"fastmace.models.templates.template(name, seed={SEED})",
                "heads": HEADS,
            },
            "environment": self.meta,
            "elapsed_s": self.elapsed(),
            "complete": complete,
            "cases": self.records,
        }

    def table(self) -> str:
        """The Markdown table: one block of lines per model and size, FastMACE first."""
        rows: dict[tuple[str, int], list[dict[str, Any]]] = {}
        order = {key: i for i, key in enumerate(LABELS)}
        ranked = sorted(
            self.records,
            key=lambda r: (
                MODEL_ORDER.index(r["model"]) if r["model"] in MODEL_ORDER else 99,
                r["atoms"],
                order[(r["path"], r["variant"])],
            ),
        )
        for record in ranked:
            rows.setdefault((record["model"], record["atoms"]), []).append(record)
        lines = [
            "| model | atoms | path / variant | ms/step | steps/s | ns/day (1 fs) "
            "| vs best MACECalculator | notes |",
            "|---|---:|---|---:|---:|---:|---:|---|",
        ]
        for (model, atoms), records in rows.items():
            ase_ms = [
                r["ms_per_step"] for r in records if r["path"] == "ase" and r["status"] == "ok"
            ]
            best = min(ase_ms) if ase_ms else None
            name = f"{model} ({HEADS[model]})" if model in HEADS else model
            for r in records:
                ok = r["status"] == "ok"
                ms = r.get("ms_per_step") if ok else None
                speedup = f"{best / ms:.2f}x" if ok and best and ms else "—"
                cells = [
                    name,
                    f"{atoms:,}",
                    r["label"],
                    fmt(ms),
                    fmt(r.get("steps_per_s") if ok else None),
                    fmt(r.get("ns_per_day") if ok else None),
                    speedup,
                    self._note(r),
                ]
                lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)

    @staticmethod
    def _note(record: dict[str, Any]) -> str:
        status = record["status"]
        if status == "ok" and record["path"] == "fastmace":
            graphs = "CUDA graphs" if record.get("captured") else "no graphs"
            note = f"{graphs}, K={record['block_steps']}, {record['timed_steps']} steps timed"
            if record.get("run_steps_per_s"):
                note += f"; run(): {fmt(record['run_steps_per_s'])} steps/s"
            if record.get("regrowths"):
                note += f"; {record['regrowths']} neighbour-list regrowth(s)"
            if record.get("force_error_max_eV_A") is not None:
                largest, rms = record["force_error_max_eV_A"], record["force_rms_eV_A"]
                note += f"; vs float64 e3nn: max ΔF {largest:.2e} eV/Å, RMS F {rms:.2e}"
            return note
        if status == "ok":
            return f"{record['timed_steps']} steps timed"
        if status in ("skipped", "pending"):
            return f"{status}" + (f": {record['reason']}" if record.get("reason") else "")
        error = record.get("error") or {}
        first = (error.get("message") or "").splitlines()[0:1]
        text = f"{status.upper()}: {error.get('type', '')}: {first[0] if first else ''}"
        text = text if len(text) <= 110 else text[:107] + "..."
        return text.replace("|", "\\|")

    def markdown(self, complete: bool) -> str:
        env = self.meta
        gpu = env.get("gpu", {})
        device = (
            f"{gpu.get('name')} (driver {gpu.get('driver')}, CUDA {gpu.get('torch_cuda')})"
            if gpu.get("available") and self.cuda
            else self.device
        )
        versions = ", ".join(f"{k} {v}" for k, v in env.get("packages", {}).items())
        header = [
            "# MD speed: FastMACE vs MACECalculator + ASE",
            "",
            f"Device: {device}. {versions}.",
            f"Langevin NVT, {TEMPERATURE_K:g} K, {TIMESTEP_FS:g} fs, friction "
            f"{FRICTION_PER_PS:g}/ps, {self.args.dtype}, NaCl rock salt; template weights "
            f"(seed {SEED}). Command: `{' '.join(sys.argv)}`. Elapsed {self.elapsed():.0f} s"
            + ("" if complete else " (incomplete)")
            + ".",
            "",
        ]
        return "\n".join(header) + self.table() + "\n"

    def write(self, complete: bool = False) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        atomic_write(
            self.out / "md_speed.json",
            json.dumps(_finite(self.payload(complete)), indent=2, default=str) + "\n",
        )
        atomic_write(self.out / "md_speed.md", self.markdown(complete))


def _finite(value: Any) -> Any:
    """NaN and infinities become None, so that the file is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


# -- main ----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="MD speed, side by side: FastMACE vs mace-torch's MACECalculator + ASE.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--out",
        default=os.environ.get("OUT") or str(Path(__file__).resolve().parent / "results"),
        help="directory for md_speed.json and md_speed.md (default: $OUT, else benchmarks/results)",
    )
    options: list[tuple[str, type, Any, str]] = [
        ("--budget-s", float, 450.0, "wall-clock budget from process start; then skip cases"),
        ("--grace-s", float, 20.0, "a case still running at budget + grace is interrupted"),
        ("--case-timeout-s", float, 180.0, "interrupt any single case after this long"),
        ("--target-s", float, 3.0, "seconds of timed steady-state steps per case"),
        ("--block-steps", int, None, "FastMACE's K (default 50; 5 with --quick)"),
        ("--only", str, "", "comma-separated substrings: run only cases whose id has one"),
        ("--planned-steps", int, 100_000, "the run length the 'default' variant is planned for"),
    ]
    for flag, kind, default, text in options:
        parser.add_argument(flag, type=kind, default=default, help=text)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    parser.add_argument(
        "--quick", action="store_true", help="tiny dry run (mp0-small on 64 atoms, a few steps)"
    )
    parser.add_argument(
        "--quick-compile",
        action="store_true",
        help="with --quick, also try torch.compile (slow on a CPU)",
    )
    parser.add_argument(
        "--force-errors",
        action="store_true",
        help="for each FastMACE case, the forces at the first state against float64 e3nn",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="for each captured FastMACE case, its kernel time by family (two more blocks)",
    )
    parser.add_argument("--list", action="store_true", help="print the plan and exit")
    args = parser.parse_args(argv)
    if not args.out:  # --out "" (an unset $OUT): the default, not the current directory
        args.out = os.environ.get("OUT") or str(Path(__file__).resolve().parent / "results")
    if args.block_steps is None:
        args.block_steps = 5 if args.quick else 50
    return args


def select(cases: list[Case], only: str) -> list[Case]:
    """The cases ``--only`` names: a filter equal to a case's id selects that case alone (not
    the variants whose ids extend it), any other filter every case whose id contains it."""
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    ids = {c.id for c in cases}

    def named(case: Case, filter_text: str) -> bool:
        return case.id == filter_text if filter_text in ids else filter_text in case.id

    return [c for c in cases if not wanted or any(named(c, w) for w in wanted)]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for message in _NOISY_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    cases = select(quick_plan() if args.quick else full_plan(), args.only)
    if args.list:
        for index, case in enumerate(cases, 1):
            print(f"{index:2d}. {case.id:40s} {case.label}")
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here: use --device cpu (with --quick for a dry run)", flush=True)
        return 2
    bench = Bench(args, cases)
    bench.log(f"md_speed: {len(cases)} cases on {args.device}, budget {args.budget_s:.0f} s")
    if args.device == "cuda":
        # The cuEquivariance kernel choice the planner makes for every CUDA run (fm.md sets
        # it; these cases bypass the planner): without it, kernel planning at each new size
        # costs seconds to minutes of set-up (docs/validation/performance.md).
        environment.configure_cueq_kernel_choice(environment.CUEQ_KERNEL_CHOICE_VALUE)
    tick = time.perf_counter()
    import_mace()  # through FastMACE's runtime, which prepares OpenEquivariance's extension
    from mace.calculators import MACECalculator  # noqa: F401  (import time kept out of cases)

    bench.meta = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "gpu": gpu_info(),
        "packages": package_versions(),
        "git_commit": git_commit(),
        "cueq_kernel_choice": os.environ.get(environment.CUEQ_KERNEL_CHOICE),
        "fastmace_backends": fastmace_backends(args.device),
        "oeq_extension": oeq_record(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "import_mace_s": time.perf_counter() - tick,
    }
    gpu = bench.meta["gpu"]
    if gpu.get("available") and bench.cuda:
        bench.log(f"GPU: {gpu['name']}, driver {gpu['driver']}, CUDA {gpu['torch_cuda']}")
    bench.log("versions: " + ", ".join(f"{k} {v}" for k, v in bench.meta["packages"].items()))
    bench.log("FastMACE backends: " + "; ".join(
        f"{k}: {v}" for k, v in bench.meta["fastmace_backends"].items()))  # fmt: skip
    bench.write()
    complete = False
    try:
        bench.run()
        complete = True
    finally:
        bench.meta["float32_matmul_precision_after"] = torch.get_float32_matmul_precision()
        bench.write(complete=complete)
        print("\n" + bench.markdown(complete), flush=True)
        bench.log(f"results in {bench.out / 'md_speed.json'} and {bench.out / 'md_speed.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
