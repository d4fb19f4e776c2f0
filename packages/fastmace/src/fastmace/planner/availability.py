"""``Availabilities``: what this machine offers the planner, as plain data.

:func:`fastmace.machine.probe_availabilities` fills it in (that function imports torch);
the planner only reads it, so plans can be made, and tested, for machines one does not have.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from fastmace.vocabulary import BACKENDS

_E3NN_EVERYWHERE = "mace-torch's reference kernels run everywhere"


@dataclass(frozen=True)
class BackendStatus:
    """Whether one backend can run on one kind of device, and why (from models.backends)."""

    available: bool
    reason: str


@dataclass(frozen=True, kw_only=True)
class Availabilities:
    """The GPU, the software versions, each backend's status per device, and the environment."""

    gpu: bool
    """torch sees a usable CUDA GPU."""
    gpu_name: str | None = None
    gpu_reason: str = ""
    """Why there is no GPU (or what was found)."""
    torch_version: str | None = None
    """torch's ``__version__``, e.g. "2.14.0+cu130"; None when unknown."""
    cueq_ops: bool = False
    """cuequivariance-ops-torch (cuEquivariance's CUDA kernels) is installed."""
    cueq_ops_version: str | None = None
    """Its version, e.g. "0.13.0"; None when unknown or not installed."""
    oeq_extension: str = "unavailable"
    """How OpenEquivariance's host extension comes: prebuilt, toolchain, loaded or unavailable."""
    oeq_extension_reason: str = ""
    cuda: Mapping[str, BackendStatus] = field(default_factory=dict)
    """Per backend, on a CUDA device."""
    cpu: Mapping[str, BackendStatus] = field(default_factory=dict)
    """Per backend, on the CPU."""
    environment: Mapping[str, str] = field(default_factory=dict)
    """The variables a plan may set, as the user had them (only those set and not empty)."""

    def __post_init__(self) -> None:
        # Own copies, so that a caller's later change to its dicts cannot alter this record.
        for name in ("cuda", "cpu", "environment"):
            object.__setattr__(self, name, dict(getattr(self, name)))
        for table in (self.cuda, self.cpu):
            unknown = sorted(set(table) - set(BACKENDS))
            if unknown:
                raise ValueError(f"unknown backends {unknown}; the backends are {BACKENDS}")

    def backend(self, name: str, device: str) -> BackendStatus:
        """``name``'s status on ``device`` ("cuda" or "cpu"); one not probed is unavailable."""
        table = self.cuda if device == "cuda" else self.cpu
        if name in table:
            return table[name]
        if name == "e3nn":
            return BackendStatus(True, _E3NN_EVERYWHERE)
        return BackendStatus(False, f"not probed on {device}")

    def user_value(self, name: str) -> str | None:
        """The value the user set for ``name``, or None (an empty value counts as unset)."""
        return self.environment.get(name) or None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable data, for metadata.json."""
        return {
            "gpu": self.gpu,
            "gpu_name": self.gpu_name,
            "gpu_reason": self.gpu_reason,
            "torch_version": self.torch_version,
            "cueq_ops": self.cueq_ops,
            "cueq_ops_version": self.cueq_ops_version,
            "oeq_extension": self.oeq_extension,
            "oeq_extension_reason": self.oeq_extension_reason,
            "cuda": {name: asdict(status) for name, status in self.cuda.items()},
            "cpu": {name: asdict(status) for name, status in self.cpu.items()},
            "environment": dict(self.environment),
        }
