"""The planner: Workload + EngineConfig + Availabilities -> Plan, every decision with its reason.

Importing this package imports no torch, and nothing of ``dynamics`` or ``models``: what a
machine offers comes in as plain data, from :func:`fastmace.machine.probe_availabilities` or
written by hand. Typical use::

    from fastmace.machine import probe_availabilities
    from fastmace.planner import EngineConfig, Workload, make_plan

    plan = make_plan(Workload.from_structures(atoms, temperature_K=300), EngineConfig(),
                     probe_availabilities())
    print(plan.describe())
"""

from __future__ import annotations

from fastmace.planner.availability import Availabilities, BackendStatus
from fastmace.planner.config import EngineConfig
from fastmace.planner.decide import make_plan
from fastmace.planner.guard import GuardConfig
from fastmace.planner.plan import (
    Decision,
    EngineSettings,
    EnvironmentSetting,
    Fallback,
    Plan,
    PlanError,
    engine_settings_for,
)
from fastmace.planner.workload import Workload

__all__ = [
    "Availabilities",
    "BackendStatus",
    "Decision",
    "EngineConfig",
    "EngineSettings",
    "EnvironmentSetting",
    "Fallback",
    "GuardConfig",
    "Plan",
    "PlanError",
    "Workload",
    "engine_settings_for",
    "make_plan",
]
