"""``Plan``: how a Workload will run, as pure data, every decision with its reason.

A Plan is made by :func:`fastmace.planner.make_plan` and changes nothing by itself. It holds
the decisions (backend, dtype, graphs, ...), the environment variables it will set, and the
ordered fallbacks to try if a decision fails at run time. :meth:`Plan.apply_environment` sets
the variables through :mod:`fastmace.runtime.environment`, before CUDA starts.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from fastmace.planner.availability import Availabilities
from fastmace.planner.config import EngineConfig
from fastmace.planner.guard import GuardConfig
from fastmace.planner.workload import Workload
from fastmace.runtime import environment
from fastmace.vocabulary import (
    BACKENDS,
    CPU_BACKEND,
    DEFAULT_BLOCK_STEPS,
    DEFAULT_MATMUL_PRECISION,
    DEFAULT_SKIN_A,
    DTYPES,
    MATMUL_PRECISIONS,
    NEIGHBOUR_HEADROOM,
)

# Where a decision comes from.
FORCED = "forced"  # EngineConfig: the user's forced setting
ASKED = "asked"  # Workload: the user asked for it (device, precision, reproducible)
RULE = "rule"  # one of the planner's rules
AVAILABILITY = "availability"  # what this machine offers
MEASURED = "measured"  # a rule backed by a measurement, named in the reason
FALLBACK = "fallback"  # a candidate plan after a decision failed
SOURCES = (FORCED, ASKED, RULE, AVAILABILITY, MEASURED, FALLBACK)

# What a plan does to one environment variable.
SET = "set"  # unset before: the plan sets it
KEPT = "kept"  # the user's value is kept, as docs/environment.md says
OVERWRITE = "overwrite"  # the user's value is replaced (reproducible plans only)


class PlanError(ValueError):
    """The Workload and EngineConfig cannot be planned here; the message says why and what to do."""


@dataclass(frozen=True)
class Decision:
    """One setting of the plan, its value, why, and where the reason comes from."""

    name: str
    value: Any
    reason: str
    source: str = RULE


@dataclass(frozen=True)
class EnvironmentSetting:
    """One environment variable the plan will set or keep: its value in force afterwards."""

    name: str
    value: str
    reason: str
    action: str = SET
    before: str | None = None
    """The user's value, when there was one."""


@dataclass(frozen=True)
class Fallback:
    """An alternative to try if the plan fails: set decision ``name`` to ``value``."""

    name: str
    value: Any
    reason: str


@dataclass(frozen=True, kw_only=True)
class EngineSettings:
    """What the engine runs with: the one carrier of engine settings, from the plan to
    ``fm.load``, :class:`~fastmace.simulation.Simulation` and the neighbour list.

    :meth:`Plan.engine_settings` makes it from the plan's decisions; the defaults are for
    runs made by hand (tests, benchmarks), and match the planner's CPU rules.
    """

    device: str = "cpu"
    backend: str = CPU_BACKEND
    dtype: str | None = None
    """The model's dtype (None: the checkpoint's)."""
    block_steps: int = DEFAULT_BLOCK_STEPS
    """K: MD steps per launch (shortened so that every output interval is whole blocks)."""
    skin_A: float = DEFAULT_SKIN_A
    edge_capacity: int | None = None
    """The neighbour list's edges at the start (None: the first build's need x headroom)."""
    headroom: float = NEIGHBOUR_HEADROOM
    graphs: bool | None = None
    """CUDA graphs, one per block (None: on where the state is on a CUDA device)."""
    compile: bool = False
    """Run the model through torch.compile."""
    compile_fallback: bool = False
    """If compilation fails, run the model uncompiled (and say so) instead of stopping: for
    compilation the planner chose, not the user."""
    matmul_precision: str = DEFAULT_MATMUL_PRECISION
    """How the model's matrix products run: "float32", "tf32" (tensor cores, CUDA) or "bf16"
    (the linear layers' GEMMs with BF16 inputs, dynamics/irreps_linear.py)."""
    radial_table: bool = False
    """Radial weights read from tables of the distance (dynamics/radial_table.py)."""
    radial_table_fallback: bool = False
    """If the tables cannot be built to their tolerance, run the radial MLPs (and say so)
    instead of stopping: for tables the planner chose, not the user."""
    product_basis: bool = False
    """FastMACE's own product-basis kernels (dynamics/product_basis.py), checked when built;
    cuEquivariance's contraction runs where they fail (and the run says why)."""
    fused_convolution: bool = False
    """FastMACE's own convolution kernels (dynamics/fused_conv.py), checked when built; the
    block's own convolution runs where they fail (and the run says why)."""
    guard: GuardConfig = field(default_factory=GuardConfig)
    """The physical bounds the engine checks every block (fastmace.dynamics.guard)."""
    edge_chunk_rows: int | str | None = "auto"
    """Edges (or mirrored pairs) one evaluation takes at once: "auto" (on CUDA, what fits in a
    share of the memory free at set-up, fastmace.planner.edge_memory), a number, or None (all)."""

    def __post_init__(self) -> None:
        if not isinstance(self.guard, GuardConfig):
            raise ValueError(f"guard must be a GuardConfig, got {self.guard!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend={self.backend!r}: use one of {', '.join(BACKENDS)}")
        if self.matmul_precision not in MATMUL_PRECISIONS:
            raise ValueError(
                f"matmul_precision={self.matmul_precision!r}: use one of "
                f"{', '.join(MATMUL_PRECISIONS)}"
            )
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r}: use one of {', '.join(DTYPES)} or None")
        if isinstance(self.block_steps, bool) or not (
            isinstance(self.block_steps, int) and self.block_steps >= 1
        ):
            raise ValueError(f"block_steps must be a whole number >= 1, got {self.block_steps!r}")
        if not self.skin_A > 0:
            raise ValueError(f"the neighbour-list skin must be positive (Å), got {self.skin_A}")
        if self.edge_capacity is not None and not self.edge_capacity >= 1:
            raise ValueError(f"edge_capacity must be >= 1 or None, got {self.edge_capacity}")
        if not self.headroom >= 1:
            raise ValueError(f"headroom must be >= 1, got {self.headroom}")
        rows = self.edge_chunk_rows
        if rows not in (None, "auto") and (
            isinstance(rows, bool) or not isinstance(rows, int) or rows < 1
        ):
            raise ValueError(f"edge_chunk_rows must be a number >= 1, 'auto' or None, got {rows!r}")

    def to_dict(self) -> dict[str, Any]:
        """Every field: JSON-serialisable."""
        return dataclasses.asdict(self)  # the guard becomes a mapping too


@dataclass(frozen=True)
class Plan:
    """How ``workload`` runs here: decisions, environment variables, ordered fallbacks."""

    workload: Workload
    config: EngineConfig
    availabilities: Availabilities
    decisions: tuple[Decision, ...]
    environment: tuple[EnvironmentSetting, ...]
    fallbacks: tuple[Fallback, ...]

    def __post_init__(self) -> None:
        names = [decision.name for decision in self.decisions]
        if len(set(names)) != len(names):
            raise ValueError(f"a plan decides each setting once; got {names}")

    # -- reading -----------------------------------------------------------------------------

    def decision(self, name: str) -> Decision:
        for decision in self.decisions:
            if decision.name == name:
                return decision
        known = ", ".join(decision.name for decision in self.decisions)
        raise KeyError(f"the plan has no decision {name!r}; it decides: {known}")

    def value(self, name: str) -> Any:
        return self.decision(name).value

    @property
    def device(self) -> str:
        return self.value("device")

    @property
    def compile_workers(self) -> int | None:
        """Inductor's compile workers for the run (None: Inductor's own pool)."""
        return self.value("compile_workers")

    @property
    def backend(self) -> str:
        return self.value("backend")

    @property
    def dtype(self) -> str:
        return self.value("dtype")

    @property
    def graphs(self) -> bool:
        return self.value("graphs")

    @property
    def compile(self) -> bool:
        return self.value("compile")

    @property
    def matmul_precision(self) -> str:
        return self.value("matmul_precision")

    @property
    def radial_table(self) -> bool:
        return self.value("radial_table")

    @property
    def product_basis(self) -> bool:
        return self.value("product_basis")

    @property
    def fused_convolution(self) -> bool:
        return self.value("fused_convolution")

    @property
    def block_steps(self) -> int:
        return self.value("block_steps")

    @property
    def skin_A(self) -> float:
        return self.value("skin_A")

    @property
    def edge_capacity(self) -> int | None:
        return self.value("edge_capacity")

    @property
    def headroom(self) -> float:
        return self.value("headroom")

    @property
    def expandable_segments(self) -> bool:
        return self.value("expandable_segments")

    @property
    def fp64_emulation(self) -> bool:
        return self.value("fp64_emulation")

    @property
    def fp64_emulation_mantissa_bits(self) -> int | None:
        return self.value("fp64_emulation_mantissa_bits")

    @property
    def reproducible(self) -> bool:
        return self.value("reproducible")

    @property
    def cueq_kernel_choice(self) -> str | None:
        """The value for CUEQUIVARIANCE_OPS_U1D_ALGOS, or None: cuEquivariance's own choice."""
        return self.value("cueq_kernel_choice")

    @property
    def guard(self) -> GuardConfig:
        return GuardConfig(**self.value("guard"))

    def environment_values(self) -> dict[str, str]:
        """Each variable the plan concerns and its value once the plan is applied."""
        return {setting.name: setting.value for setting in self.environment}

    def engine_settings(self) -> EngineSettings:
        """The decisions the engine runs with, for fm.load, Simulation and the neighbour list."""
        return EngineSettings(
            device=self.device,
            backend=self.backend,
            dtype=self.dtype,
            block_steps=self.block_steps,
            skin_A=self.skin_A,
            edge_capacity=self.edge_capacity,
            headroom=self.headroom,
            graphs=self.graphs,
            compile=self.compile,
            compile_fallback=self.decision("compile").source != FORCED,
            matmul_precision=self.matmul_precision,
            radial_table=self.radial_table,
            radial_table_fallback=self.decision("radial_table").source != FORCED,
            product_basis=self.product_basis,
            fused_convolution=self.fused_convolution,
            guard=self.guard,
        )

    # -- alternatives ------------------------------------------------------------------------

    def candidates(self) -> Iterator[Plan]:
        """This plan, then each fallback applied on top of the ones before, in order.

        Forced settings have no fallbacks: what the user forced is never replaced.
        """
        plan = self
        yield plan
        for index, fallback in enumerate(self.fallbacks):
            decisions = tuple(
                Decision(d.name, fallback.value, fallback.reason, FALLBACK)
                if d.name == fallback.name
                else d
                for d in plan.decisions
            )
            plan = dataclasses.replace(
                plan, decisions=decisions, fallbacks=self.fallbacks[index + 1 :]
            )
            yield plan

    # -- acting ------------------------------------------------------------------------------

    def apply_environment(self, environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
        """Set the plan's variables (default: os.environ) before CUDA starts; returns them.

        The work is done by fastmace.runtime.environment, which records every change for
        metadata.json and keeps the user's values where docs/environment.md says so.
        """
        if self.expandable_segments:
            environment.configure_allocator(True, environ)
        if self.fp64_emulation:
            environment.configure_fp64_emulation(self.fp64_emulation_mantissa_bits, environ)
        if self.reproducible:
            environment.configure_reproducible(environ)
        if self.cueq_kernel_choice is not None:
            environment.configure_cueq_kernel_choice(self.cueq_kernel_choice, environ)
        env = os.environ if environ is None else environ
        return {setting.name: env[setting.name] for setting in self.environment}

    # -- showing -----------------------------------------------------------------------------

    def describe(self) -> str:
        """The plan in a few lines (about ten): what was decided and why."""
        d = self.decision
        lines = [f"Plan: {self.workload.summary()}"]

        def line(label: str, value: Any, reason: str) -> None:
            lines.append(f"  {label:<12} {_show(value):<8} {reason}")

        for name in ("device", "backend", "dtype"):
            line(name, d(name).value, d(name).reason)
        if self.matmul_precision != DEFAULT_MATMUL_PRECISION:
            line("matmul", self.matmul_precision, d("matmul_precision").reason)
        if self.radial_table:
            line("radial", "table", d("radial_table").reason)
        if self.product_basis:
            line("product", "own", d("product_basis").reason)
        if self.fused_convolution:
            line("convolution", "own", d("fused_convolution").reason)
        if self.fp64_emulation:
            bits = self.fp64_emulation_mantissa_bits
            mantissa = "cuBLAS's default mantissa" if bits is None else f"{bits} mantissa bits"
            line("fp64 emul.", True, f"{d('fp64_emulation').reason}; {mantissa}")
        compiled = d("compile")
        graphs = f"{d('graphs').reason}; compile {_show(compiled.value)} ({compiled.reason})"
        line("graphs", self.graphs, graphs)
        if self.compile_workers is not None:
            line("workers", self.compile_workers, d("compile_workers").reason)
        line("block K", self.block_steps, d("block_steps").reason)
        capacity = "sized at the first build" if self.edge_capacity is None else self.edge_capacity
        edges = f"skin; edge capacity {capacity}, headroom {self.headroom:g}"
        line("neighbours", f"{self.skin_A:g} Å", edges)
        line("allocator", self.expandable_segments, d("expandable_segments").reason)
        if self.reproducible:
            line("reproducible", True, d("reproducible").reason)
        if d("guard").source == FORCED:
            line("guard", self.guard.enabled, d("guard").reason)
        if self.environment:
            shown = ", ".join(f"{s.name}={s.value} ({s.action})" for s in self.environment)
            lines.append(f"  {'environment':<12} {shown}")
        if self.fallbacks:
            shown = " -> ".join(f"{f.name} {_show(f.value)}" for f in self.fallbacks)
            lines.append(f"  {'fallbacks':<12} {shown}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable data, for metadata.json."""
        return {
            "workload": self.workload.to_dict(),
            "config": self.config.to_dict(),
            "availabilities": self.availabilities.to_dict(),
            "decisions": {
                d.name: {"value": d.value, "reason": d.reason, "source": d.source}
                for d in self.decisions
            },
            "environment": [dataclasses.asdict(setting) for setting in self.environment],
            "fallbacks": [dataclasses.asdict(fallback) for fallback in self.fallbacks],
        }


def engine_settings_for(
    owner: str, engine: EngineSettings | None, plan: Plan | None, default: EngineSettings
) -> EngineSettings:
    """The one set of engine settings of a run kind (``owner``: "Simulation", ...): the plan's
    when it was planned, else ``engine`` given by hand, else ``default``; both given and
    different is refused, so that a setting has one carrier."""
    if plan is None:
        return default if engine is None else engine
    planned = plan.engine_settings()
    if engine is not None and engine != planned:
        raise ValueError(
            f"{owner} got engine settings twice, from the plan and as engine=, and they "
            "differ: force a setting through the plan's EngineConfig instead"
        )
    return planned


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)
