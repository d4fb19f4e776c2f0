"""The planner: Workload + EngineConfig + Availabilities -> Plan, every decision with its reason.

Importing this package imports no torch: :func:`probe_availabilities` (which does) is loaded on
first use. Typical use::

    from fastmace.planner import EngineConfig, Workload, make_plan, probe_availabilities

    plan = make_plan(Workload.from_structures(atoms, temperature_K=300), EngineConfig(),
                     probe_availabilities())
    print(plan.describe())
"""

from __future__ import annotations

from typing import Any

from fastmace.planner.availability import Availabilities, BackendStatus
from fastmace.planner.config import EngineConfig
from fastmace.planner.decide import make_plan
from fastmace.planner.plan import (
    Decision,
    EngineSettings,
    EnvironmentSetting,
    Fallback,
    Plan,
    PlanError,
)
from fastmace.planner.workload import Workload


def __getattr__(name: str) -> Any:
    if name == "probe_availabilities":  # imports torch: only when asked for
        from fastmace.planner.probe import probe_availabilities

        return probe_availabilities
    raise AttributeError(f"module 'fastmace.planner' has no attribute {name!r}")


__all__ = [
    "Availabilities",
    "BackendStatus",
    "Decision",
    "EngineConfig",
    "EngineSettings",
    "EnvironmentSetting",
    "Fallback",
    "Plan",
    "PlanError",
    "Workload",
    "make_plan",
    "probe_availabilities",
]
