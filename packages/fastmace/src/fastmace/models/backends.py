"""Backend conversion: an e3nn MACE model in, the same model on faster kernels out, checked.

The conversions are mace-torch 0.3.16's own (``mace.cli.convert_e3nn_*``), applied to a copy of
the model; nothing in mace-torch is patched. Every converted model is compared with the e3nn
model on a small structure right after conversion (:func:`check_conversion`).

Backends: ``e3nn`` (mace-torch's reference kernels), ``cueq`` (cuEquivariance; on the CPU its
PyTorch fallback), ``oeq`` (OpenEquivariance; CUDA only) and ``hybrid`` (OpenEquivariance's
fused convolution with cuEquivariance for the rest; CUDA only).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from importlib import util as importlib_util

import numpy as np
import torch

from fastmace.models.checkpoint import (
    contained,
    dtype_name,
    import_mace,
    model_device,
    model_dtype,
)
from fastmace.models.cueq_descriptors import descriptors_cached_on_disk
from fastmace.models.reference import check_structure, evaluate
from fastmace.runtime.quiet import library_noise_silenced
from fastmace.vocabulary import BACKENDS, REDUCED_PRECISION_TOLERANCE


class BackendUnavailableError(RuntimeError):
    """The asked-for backend cannot run here; the message says why and what to install."""


class ConversionCheckError(RuntimeError):
    """A converted model disagrees with the e3nn model beyond rounding."""


@dataclass(frozen=True)
class Availability:
    backend: str
    available: bool
    reason: str


def _installed(module: str) -> bool:
    return importlib_util.find_spec(module) is not None


def availability(backend: str, device: str) -> Availability:
    """Whether ``backend`` can run on ``device`` ("cpu" or "cuda"), and why, without trying."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; the backends are: {', '.join(BACKENDS)}")
    cuda = device.startswith("cuda")
    if backend == "e3nn":
        return Availability(backend, True, "mace-torch's reference kernels run everywhere")
    if not _installed("cuequivariance_torch") and backend in ("cueq", "hybrid"):
        return Availability(backend, False, "cuequivariance-torch is not installed")
    if backend == "cueq":
        if not cuda:
            return Availability(backend, True, "cuEquivariance's PyTorch fallback (CPU)")
        if not _installed("cuequivariance_ops_torch"):
            return Availability(
                backend, False, "cuequivariance-ops-torch (the CUDA kernels) is not installed"
            )
        return Availability(backend, True, "cuEquivariance with its CUDA kernels")
    # oeq and hybrid
    if not cuda:
        return Availability(backend, False, "OpenEquivariance's kernels run on CUDA GPUs only")
    if not _installed("openequivariance"):
        return Availability(
            backend, False, "openequivariance is not installed (pip install 'fastmace[oeq]')"
        )
    if backend == "hybrid" and not _installed("cuequivariance_ops_torch"):
        return Availability(
            backend, False, "cuequivariance-ops-torch (the CUDA kernels) is not installed"
        )
    extension = _oeq_host_extension()
    if extension is not None:
        return Availability(backend, False, f"OpenEquivariance's host extension: {extension}")
    return Availability(backend, True, "OpenEquivariance installed and a CUDA device")


def _oeq_host_extension() -> str | None:
    """Why OpenEquivariance's host extension is not available here, or None if it is."""
    from fastmace.oeq import choice, host_extension

    done = host_extension.record()
    if done is not None and done.how in (host_extension.UNAVAILABLE, host_extension.FAILED):
        return done.reason
    if done is not None and done.loaded:
        return None
    found = choice.choose_host_extension()
    if not found.usable:
        return found.reason
    if found.driver is None:
        return f"no CUDA driver library (libcuda.so.1): {found.driver_source}"
    return None


def convert(
    model: torch.nn.Module, backend: str, device: str = "cpu", dtype: torch.dtype | None = None
) -> torch.nn.Module:
    """A copy of the e3nn ``model`` on ``backend``, ``device`` and ``dtype`` (default: the model's).

    The input model is not changed. Raises BackendUnavailableError with the reason.
    """
    found = availability(backend, device)
    if not found.available:
        raise BackendUnavailableError(f"the {backend} backend is unavailable: {found.reason}")
    dtype = model_dtype(model) if dtype is None else dtype
    with library_noise_silenced():  # deepcopy of scripted modules: torch.jit.save/load
        source = copy.deepcopy(model).to(device=device, dtype=dtype)
    if backend == "e3nn":
        return source.eval()
    import_mace()
    if backend in ("cueq", "hybrid") and device.startswith("cuda"):
        keep_cueq_kernels()
    # Descriptors from the cache root: seconds of set-up saved per process (cueq_descriptors).
    with contained(), descriptors_cached_on_disk():
        if backend == "cueq":
            from mace.cli.convert_e3nn_cueq import run
        elif backend == "oeq":
            from mace.cli.convert_e3nn_oeq import run
        elif backend == "hybrid":
            from mace.cli.convert_e3nn_hybrid import run
        else:  # a name in vocabulary.BACKENDS without its conversion here
            raise BackendUnavailableError(f"no conversion to the {backend} backend is written")
        converted = run(source, device=device, return_model=True)
    return converted.to(device=device, dtype=dtype).eval()


def keep_cueq_kernels() -> None:
    """cuEquivariance-ops' NVRTC-compiled kernels kept in the cache root for later processes
    (docs/environment.md), before the converted model's first call compiles them."""
    from fastmace.runtime import cache, environment

    environment.configure_cueq_kernel_cache(cache.cache_root().path)


@dataclass(frozen=True)
class ConversionCheck:
    """How far a converted model is from the e3nn model on the check structure."""

    backend: str
    dtype: str
    energy_error_ev: float
    energy_tolerance_ev: float
    force_error_ev_per_a: float
    force_tolerance_ev_per_a: float

    @property
    def passed(self) -> bool:
        return (
            self.energy_error_ev <= self.energy_tolerance_ev
            and self.force_error_ev_per_a <= self.force_tolerance_ev_per_a
        )

    def errors(self) -> str:
        """The errors against their tolerances, for messages."""
        return (
            f"energy off by {self.energy_error_ev:.3g} eV (tolerance "
            f"{self.energy_tolerance_ev:.3g}), forces by {self.force_error_ev_per_a:.3g} eV/Å "
            f"(tolerance {self.force_tolerance_ev_per_a:.3g})"
        )


def rounding_tolerances(
    dtype: torch.dtype, energy: float, forces: np.ndarray, num_atoms: int
) -> tuple[float, float]:
    """The energy and force tolerance for two implementations of one model in ``dtype``.

    Two correct kernels sum the same terms in different orders, so their results differ by
    rounding: machine epsilon times the size of the terms, growing with the square root of
    their number. A MACE force gathers neighbours times channels (10^4 to 10^5) terms, each
    up to about the force scale, so a few hundred epsilon of that scale is ordinary. We allow
    1000 epsilon of the result's size, with a floor of 1 eV per atom (energy) or 1 eV/Å
    (forces) so that results near zero are not held to an impossible bound: about 1.2e-4
    eV/Å in float32 and 2.2e-13 eV/Å in float64 for ordinary forces. Measured on an H200
    (docs/validation/backends.md): float32 differences of 1e-9 to 1.5e-8 eV/Å, float64 up
    to 4e-14 eV/Å.
    """
    eps = torch.finfo(dtype).eps
    energy_tolerance = 1000 * eps * max(abs(energy), float(num_atoms))
    force_tolerance = 1000 * eps * max(float(np.abs(forces).max()), 1.0)
    return energy_tolerance, force_tolerance


def precision_loosening(dtype: torch.dtype, matmul_precision: str) -> float:
    """The factor by which ``rounding_tolerances`` widen for a reduced-precision tier.

    With TF32 or BF16 matrix products two correct evaluations (eager and compiled, one kernel
    or another, batched or alone) round the products' inputs at different points, and differ
    by that precision's rounding, not float32's: the tolerances become the tier's own
    (``REDUCED_PRECISION_TOLERANCE``, vocabulary.py; the gate's too). 1 otherwise.
    """
    fraction = REDUCED_PRECISION_TOLERANCE.get(matmul_precision)
    return 1.0 if fraction is None else fraction / (1000 * torch.finfo(dtype).eps)


def check_conversion(
    reference: torch.nn.Module,
    converted: torch.nn.Module,
    backend: str,
    head: str | None = None,
) -> ConversionCheck:
    """Compare ``converted`` with the e3nn ``reference`` (same dtype) on a small structure."""
    dtype = model_dtype(converted)
    device = model_device(converted)
    atoms = check_structure(tuple(int(z) for z in reference.atomic_numbers))
    with library_noise_silenced():  # deepcopy of scripted modules: torch.jit.save/load
        reference = copy.deepcopy(reference).to(device=device, dtype=dtype)
    expected = evaluate(reference, atoms, head)
    actual = evaluate(converted, atoms, head)
    energy_tol, force_tol = rounding_tolerances(dtype, expected.energy, expected.forces, len(atoms))
    return ConversionCheck(
        backend=backend,
        dtype=dtype_name(dtype),
        energy_error_ev=abs(actual.energy - expected.energy),
        energy_tolerance_ev=energy_tol,
        force_error_ev_per_a=float(np.abs(actual.forces - expected.forces).max()),
        force_tolerance_ev_per_a=force_tol,
    )


def select_head(model: torch.nn.Module, head: str) -> torch.nn.Module:
    """A single-head copy of a multi-head ``model`` keeping ``head`` (mace-torch's own
    ``remove_pt_head``, as ``mace_select_head`` does). The copy computes the same energies
    with less work, and avoids mace's per-head masking, which cannot be captured in a CUDA
    graph (it writes a host scalar into a device tensor)."""
    import_mace()
    from mace.tools.scripts_utils import remove_pt_head

    with contained():
        torch.set_default_dtype(model_dtype(model))  # mace builds the copy in the default dtype
        single = remove_pt_head(copy.deepcopy(model).to("cpu"), head)
    return single.to(model_dtype(model)).eval()
