"""``probe_availabilities``: look at this machine and describe it as the planner's Availabilities.

The bridge from the world to the planner's plain data: it imports torch (to ask for a GPU) and
asks fastmace.models.backends and fastmace.oeq what can run here, without loading a kernel or
building anything. It lives outside ``planner/``, which imports neither torch nor models.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from importlib import metadata as importlib_metadata
from importlib import util as importlib_util

from fastmace.planner.availability import Availabilities, BackendStatus
from fastmace.runtime import environment
from fastmace.runtime.gpu_name import visible_gpu_name

# The variables a plan may set; the planner needs the user's values to keep or replace them.
PLAN_VARIABLES = (
    environment.PYTORCH_CUDA_ALLOC_CONF.name,
    *environment.FP64_EMULATION,
    environment.FP64_EMULATION_BITS,
    *environment.REPRODUCIBLE,
)


# cuEquivariance's kernels come as one distribution per CUDA major version.
CUEQ_OPS_DISTRIBUTIONS = ("cuequivariance-ops-torch-cu13", "cuequivariance-ops-torch-cu12")


def cueq_ops_version() -> str | None:
    """The installed cuequivariance-ops-torch version, read from its metadata (no import)."""
    for distribution in CUEQ_OPS_DISTRIBUTIONS:
        try:
            return importlib_metadata.version(distribution)
        except importlib_metadata.PackageNotFoundError:
            continue
    return None


def probe_availabilities(environ: Mapping[str, str] | None = None) -> Availabilities:
    """What this machine offers: GPU, torch version, backends per device, OEq, the variables."""
    import torch

    from fastmace.models import backends
    from fastmace.oeq import choice, host_extension

    env = os.environ if environ is None else environ
    gpu = bool(torch.cuda.is_available())
    if gpu:
        # NVML's answer leaves CUDA unstarted, so that the plan's variables still take effect.
        name = None if torch.cuda.is_initialized() else visible_gpu_name(env)
        name = name or torch.cuda.get_device_name(0)
        gpu_reason = f"{torch.cuda.device_count()} CUDA device(s), torch CUDA {torch.version.cuda}"
    else:
        name = None
        cuda = torch.version.cuda
        gpu_reason = (
            f"torch {torch.__version__} sees no CUDA GPU (torch CUDA {cuda})"
            if cuda
            else f"torch {torch.__version__} is a CPU-only build"
        )
    loaded = host_extension.record()
    if loaded is not None and loaded.loaded:
        oeq, oeq_reason = "loaded", loaded.summary()
    elif loaded is not None and loaded.how in (host_extension.UNAVAILABLE, host_extension.FAILED):
        oeq, oeq_reason = loaded.how, loaded.reason
    else:
        found = choice.choose_host_extension(env)
        oeq, oeq_reason = found.method, found.reason

    def statuses(device: str) -> dict[str, BackendStatus]:
        table = {}
        for backend in backends.BACKENDS:
            status = backends.availability(backend, device)
            table[backend] = BackendStatus(status.available, status.reason)
        return table

    return Availabilities(
        gpu=gpu,
        gpu_name=name,
        gpu_reason=gpu_reason,
        torch_version=torch.__version__,
        cueq_ops=importlib_util.find_spec("cuequivariance_ops_torch") is not None,
        cueq_ops_version=cueq_ops_version(),
        oeq_extension=oeq,
        oeq_extension_reason=oeq_reason,
        cuda=statuses("cuda"),
        cpu=statuses("cpu"),
        # An empty value counts as unset, as everywhere in fastmace.runtime.environment.
        environment={name: env[name] for name in PLAN_VARIABLES if env.get(name)},
    )
