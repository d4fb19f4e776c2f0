"""``fm.EngineConfig``: the engine settings a user may force; None leaves each to the planner.

Every field defaults to None, "let the planner decide". A value given here wins over every
rule of the planner; if the machine cannot honour it, planning fails with the reason
(:class:`fastmace.planner.PlanError`). Values are checked when the config is made.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from fastmace.planner.guard import GuardConfig
from fastmace.vocabulary import BACKENDS, DTYPES, MATMUL_PRECISIONS

# cuBLAS's fixed-point emulation takes 1 to 79 mantissa bits (as configure_fp64_emulation checks).
MANTISSA_BITS = range(1, 80)

_SWITCHES = (
    "graphs", "compile", "expandable_segments", "fp64_emulation", "radial_table",
    "product_basis", "fused_convolution",
)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """Engine settings to force; None (every default) means "the planner decides"."""

    backend: str | None = None
    """"e3nn", "cueq", "oeq" or "hybrid" ("auto" means None)."""
    dtype: str | None = None
    """The model's dtype: "float32" or "float64" ("auto" means None)."""
    matmul_precision: str | None = None
    """How a float32 model's matrix products run: "float32" (the default: results within
    float32 rounding of the reference), "tf32" (CUDA tensor cores: faster, looser; the gate
    holds it to its own tolerance, docs/md.md) or "bf16" (the linear layers' GEMMs with BF16
    inputs and float32 sums, everything else float32; its own gate tolerance too)."""
    radial_table: bool | None = None
    """Read each interaction block's radial weights from a table of the distance instead of
    running its radial MLP (float32 models whose blocks allow it: faster at large sizes,
    within 1e-6 of the MLP; off unless forced, docs/md.md)."""
    product_basis: bool | None = None
    """Each product block's symmetric contraction as FastMACE's own kernels instead of
    cuEquivariance's (cueq and hybrid backends, local models; checked against
    cuEquivariance's module when built, which runs instead if they fail; slower so far, so
    off unless forced: docs/design/product-basis.md)."""
    fused_convolution: bool | None = None
    """Each interaction block's convolution as FastMACE's own kernels instead of
    cuEquivariance's (cueq backend, local models; checked against the block's own module when
    built, which runs instead if they fail; not yet measured faster, so off unless forced:
    docs/design/convolution.md)."""
    graphs: bool | None = None
    """Capture each block of K steps as a CUDA graph."""
    compile: bool | None = None
    """torch.compile the model (None: the planner's choice, on for long float32 cuEq runs)."""
    edge_capacity: int | None = None
    """Edges the neighbour list holds at the start (None: the first build's need x headroom)."""
    headroom: float | None = None
    """Factor on the first build's needs when sizing the neighbour buffers (>= 1)."""
    skin_A: float | None = None
    """Verlet skin of the neighbour list, Å."""
    block_steps: int | None = None
    """K: MD steps per captured launch; the host looks in once per block."""
    expandable_segments: bool | None = None
    """PyTorch's CUDA allocator with expandable segments (PYTORCH_CUDA_ALLOC_CONF)."""
    fp64_emulation: bool | None = None
    """Let cuBLAS emulate float64 matrix products (float64 plans on CUDA only)."""
    fp64_emulation_mantissa_bits: int | None = None
    """Mantissa bits of that emulation (1 to 79; None: cuBLAS's default)."""
    guard: GuardConfig | None = None
    """The physical bounds checked every block (None: the defaults; False: off; a mapping of
    bounds, as a run config's ``[guard]`` table, is made a GuardConfig)."""
    max_batch_atoms: int | None = None
    """At most this many atoms in one batch: a larger request runs as several batches, one
    after another (fastmace.batching); None: one batch."""

    def __post_init__(self) -> None:
        for name in ("backend", "dtype"):
            if getattr(self, name) == "auto":
                object.__setattr__(self, name, None)
        if self.guard is not None:
            object.__setattr__(self, "guard", GuardConfig.coerce(self.guard))
        _one_of("backend", self.backend, BACKENDS)
        _one_of("dtype", self.dtype, DTYPES)
        _one_of("matmul_precision", self.matmul_precision, MATMUL_PRECISIONS)
        for name in _SWITCHES:
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise ValueError(
                    f"EngineConfig({name}={value!r}) is not allowed: use True, False or None "
                    "(let the planner decide)"
                )
        _whole_at_least("edge_capacity", self.edge_capacity, 1)
        _whole_at_least("block_steps", self.block_steps, 1)
        _whole_at_least("max_batch_atoms", self.max_batch_atoms, 1)
        if self.headroom is not None and not (_finite(self.headroom) and self.headroom >= 1):
            raise ValueError(
                f"EngineConfig(headroom={self.headroom!r}) is not allowed: use a number >= 1 "
                "(1.25 leaves a quarter more room than the first build needs)"
            )
        if self.skin_A is not None and not (_finite(self.skin_A) and self.skin_A > 0):
            raise ValueError(
                f"EngineConfig(skin_A={self.skin_A!r}) is not allowed: use a positive skin in Å "
                "(0.5 is usual)"
            )
        bits = self.fp64_emulation_mantissa_bits
        if bits is not None:
            if isinstance(bits, bool) or not isinstance(bits, int) or bits not in MANTISSA_BITS:
                raise ValueError(
                    f"EngineConfig(fp64_emulation_mantissa_bits={bits!r}) is not allowed: use a "
                    "whole number from 1 to 79, or None for cuBLAS's default"
                )
            if self.fp64_emulation is not True:
                raise ValueError(
                    f"EngineConfig(fp64_emulation_mantissa_bits={bits}) needs "
                    "fp64_emulation=True as well"
                )

    def forced(self) -> dict[str, Any]:
        """The settings the user forced (every field that is not None)."""
        return {
            f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None
        }

    def to_dict(self) -> dict[str, Any]:
        """Every field, None included: JSON-serialisable (the guard as a mapping)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.guard is not None:
            values["guard"] = self.guard.to_dict()
        return values


def _one_of(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value is not None and value not in choices:
        raise ValueError(
            f"EngineConfig({name}={value!r}) is not allowed: use one of {', '.join(choices)}, "
            "or None (let the planner decide)"
        )


def _whole_at_least(name: str, value: Any, least: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(
            f"EngineConfig({name}={value!r}) is not allowed: use a whole number >= {least}, "
            "or None (let the planner decide)"
        )


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
