"""FastMACE: molecular dynamics with pretrained MACE potentials, run whole on one NVIDIA GPU.

Import fastmace before torch: the import switches PyTorch's file locks to NFS-safe soft locks
(see docs/environment.md). It imports neither torch nor MACE and creates no file.
"""

# This must stay the first statement that runs code: it has to precede any import of torch.
from fastmace.runtime.startup import apply_at_import as _apply_at_import

_RUNTIME_INFO = _apply_at_import()

from fastmace._version import __version__  # noqa: E402
from fastmace.runtime.cache import CacheLocationError  # noqa: E402
from fastmace.runtime.environment import EnvironmentVariableError  # noqa: E402
from fastmace.runtime.startup import RuntimeInfo  # noqa: E402

# The public API that needs torch is imported on first use, so `import fastmace` stays light.
_LAZY = {
    "load": ("fastmace.models.load", "load"),
    "LoadedModel": ("fastmace.models.load", "LoadedModel"),
    "MDResult": ("fastmace.runs", "MDResult"),
    "md": ("fastmace.api", "md"),
    "relax": ("fastmace.api", "relax"),
    "RelaxResult": ("fastmace.relaxation", "RelaxResult"),
    "calculator": ("fastmace.ase", "calculator"),
    "Workload": ("fastmace.planner", "Workload"),
    "EngineConfig": ("fastmace.planner", "EngineConfig"),
    "GuardConfig": ("fastmace.planner", "GuardConfig"),
    "Plan": ("fastmace.planner", "Plan"),
    "RunnerConfig": ("fastmace.runner", "RunnerConfig"),
    "TemperatureSchedule": ("fastmace.protocol", "TemperatureSchedule"),
    "PressureSchedule": ("fastmace.protocol", "PressureSchedule"),
    "geometric_ladder": ("fastmace.dynamics.replica_exchange", "geometric_ladder"),
}


def __getattr__(name: str) -> object:
    from importlib import import_module

    if name in _LAZY:
        module, attribute = _LAZY[name]
        return getattr(import_module(module), attribute)
    raise AttributeError(f"module 'fastmace' has no attribute {name!r}")


def runtime_info() -> RuntimeInfo:
    """What ``import fastmace`` decided for this process: file locks and the CUDA driver cache."""
    return _RUNTIME_INFO


__all__ = [
    "CacheLocationError",
    "EngineConfig",
    "EnvironmentVariableError",
    "GuardConfig",
    "LoadedModel",
    "MDResult",
    "Plan",
    "PressureSchedule",
    "RelaxResult",
    "RunnerConfig",
    "RuntimeInfo",
    "TemperatureSchedule",
    "Workload",
    "__version__",
    "calculator",
    "geometric_ladder",
    "load",
    "md",
    "relax",
    "runtime_info",
]
