"""``make_plan``: Workload + EngineConfig + Availabilities -> Plan, every decision with its reason.

Pure decisions: nothing here imports torch, reads the environment or touches a device; all the
machine offers comes in as :class:`Availabilities`. Order of precedence for every setting: the
user's EngineConfig (forced), then the Workload (asked), then availability and the rules below.
A forced or asked setting that cannot be honoured raises :class:`PlanError` with the reason.
"""

from __future__ import annotations

import re

from fastmace.planner.availability import Availabilities
from fastmace.planner.config import EngineConfig
from fastmace.planner.guard import GuardConfig
from fastmace.planner.plan import (
    ASKED,
    AVAILABILITY,
    FORCED,
    KEPT,
    MEASURED,
    OVERWRITE,
    RULE,
    SET,
    Decision,
    EnvironmentSetting,
    Fallback,
    Plan,
    PlanError,
)
from fastmace.planner.workload import Workload
from fastmace.runtime import environment
from fastmace.vocabulary import (
    CPU_BACKEND,
    CUDA_BACKEND_ORDER,
    DEFAULT_BLOCK_STEPS,
    DEFAULT_MATMUL_PRECISION,
    DEFAULT_SKIN_A,
    NEIGHBOUR_HEADROOM,
)

CUDA_BACKEND_REASON = (
    "measured: the fastest available of cueq > hybrid > e3nn (H200, CUDA graphs: cuEq 8-32 % "
    "faster than hybrid for MP-0 medium at 216-32,768 atoms and MH-1 at 216 and 1,728)"
)
LARGE_ATOMS = 10_000  # above this many atoms in all, K is shorter (as benchmarks/md_speed.py)
LARGE_BLOCK_STEPS = 20
EXPANDABLE_SEGMENTS_SINCE = (2, 14)  # docs/environment.md: the allocator rule

CUEQ_KERNEL_CHOICE_REASON = (
    "measured: cuEquivariance-ops {version} times candidate kernels at each new size; a fixed "
    "choice cuts set-up at 13,824 atoms from 20.2 to 5.5 s with steps/s within 1 % at 216, 1,728 "
    "and 13,824 atoms (H200, MP-0 medium; docs/planner.md)"
)
CUEQ_BACKENDS = ("cueq", "hybrid")  # the backends whose model runs cuEquivariance's kernels
# torch.compile on the captured cuEq step, measured on the H200 (MP-0 medium, float32, the
# number of edges symbolic; docs/validation/performance.md, 2026-12-01, seventh session): it
# saves about 0.67 ms + 0.40 µs per atom per step (0.76 ms at 216 atoms, 6.2 at 13,824) and
# compiles for 24-30 s before the first step with Inductor's cache cold (about 13 s warm).
# The plan compiles where the run's predicted saving pays back the compilation within the run:
# the cost this model's last compilation at this size took here (the cache's compile record),
# or COMPILE_COST_S where it was never compiled here.
COMPILE_SAVING_MS = 0.67
COMPILE_SAVING_MS_PER_ATOM = 0.40e-3
COMPILE_COST_S = 30.0
COMPILE_MEASURED = "H200, MP-0 medium, cuEq: about 0.67 ms + 0.40 µs per atom saved per step"
RADIAL_TABLE_REASON = (
    "measured: each block's radial weights read from a table checked at build to 1e-6 of the "
    "weights, forces as close to float64 e3nn as the MLP's (7.3e-8 against 8.0e-8 eV/Å) and "
    "8-14 % faster steps from 1,728 atoms (H200, MP-0 medium; docs/validation/performance.md); "
    "for MH-1, one table per pair of elements, 1.29-1.41x (H100, 216 and 1,728 atoms); "
    "EngineConfig(radial_table=False) turns it off"
)
PRODUCT_BASIS_REASON = (
    "measured: FastMACE's own product-basis kernels take 0.50 ms against cuEquivariance's "
    "0.70 ms of kernel time (forward and backward, both blocks, MP-0 medium, 13,824 atoms, "
    "H100), but a whole evaluation took 25.75 ms either way and they add a Triton compilation "
    "to a cold start (docs/design/product-basis.md), so cuEquivariance's runs; "
    "EngineConfig(product_basis=True) forces them"
)
# FastMACE's own convolution kernels (one warp per 32 channels) with radial tables, against
# cuEquivariance's, side by side (H100, MP-0 medium, compiled, CUDA graphs; stages 84-85 in
# docs/validation/performance.md): ms per step 4.33/3.76 at 1,728 atoms, 5.88/7.21 at 4,096,
# 9.21/13.1 at 8,000, 15.0/21.1 at 13,824 and 31.0/47.2 at 32,768. From 4,096 atoms the saving
# is about 0.51 µs per atom less 0.75 ms per step; the first run generates and compiles the
# kernels for about 11 s (the 13,824-atom case's set-up, 21.9 against 10.9 s).
FUSED_CONVOLUTION_MIN_ATOMS = 3_000
FUSED_CONVOLUTION_SAVING_MS = -0.75
FUSED_CONVOLUTION_SAVING_MS_PER_ATOM = 0.51e-3
FUSED_CONVOLUTION_COST_S = 11.0
FUSED_CONVOLUTION_MEASURED = (
    "H100, MP-0 medium, compiled: 15.0 against 21.1 ms per step at 13,824 atoms, 1.23-1.52x "
    "from 4,096 to 32,768 atoms, 0.87x at 1,728 (0.93x with two channels a thread, "
    "2026-12-07); docs/design/convolution.md"
)
# The same kernels reading MH-1's tables per pair of elements (its radial MLPs see the two
# elements), against cuEquivariance's convolution with those tables apart (H100, MH-1
# template, NaCl, compiled; benchmarks/results/2026-12-07d-h100/): 8.12 against 9.58 ms per
# step at 1,728 atoms, 49.9 against 64.0 at 13,824. The saving, a line through both sizes:
# about 1.05 µs per atom less 0.36 ms per step. Below 1,728 atoms it is not measured.
PAIR_TABLE_CONVOLUTION_MIN_ATOMS = 1_728
PAIR_TABLE_CONVOLUTION_SAVING_MS = -0.36
PAIR_TABLE_CONVOLUTION_SAVING_MS_PER_ATOM = 1.048e-3
PAIR_TABLE_CONVOLUTION_MEASURED = (
    "H100, MH-1, compiled, tables per pair of elements: 8.12 against 9.58 ms per step at 1,728 "
    "atoms, 49.9 against 64.0 at 13,824 (2026-12-07); docs/design/convolution.md"
)
# A warm start (the model compiled at this size here before, so its kernels are in Inductor's
# cache) with one compile worker instead of Inductor's pool (dynamics/compile_workers.py).
COMPILE_WORKERS_REASON = (
    "measured: one compile worker, no pool: this model was compiled at this size here, so its "
    "kernels come from Inductor's cache, and starting the pool cost a warm start more than "
    "loading them in this process (H100, MP-0 medium, 13,824 atoms: 28.8 against 23.1-23.4 s "
    "to the first step, 2026-12-07)"
)
# MACE-POLAR-1 (PolarMACE): why its step is neither captured nor compiled, and its backend.
LONG_RANGE_EAGER_REASON = (
    "rule: a long-range model (MACE-POLAR-1) runs eagerly: graph-longrange sizes its k-space "
    "grid and picks its periodic path by reading device values (a host synchronisation), "
    "and the graph keeps only the real edges, so its step cannot be captured in a CUDA "
    "graph, nor compiled (docs/validation/polar.md#capture)"
)
LONG_RANGE_COMPILE_REASON = "rule: a long-range model (MACE-POLAR-1) runs uncompiled, as eagerly"
LONG_RANGE_BACKEND_REASON = (
    "rule: a long-range model (MACE-POLAR-1) runs on e3nn, where its long-range part is "
    "checked against mace-torch (docs/validation/polar.md)"
)
CPU_BACKEND_REASON = (
    "measured: on the CPU e3nn beats cuEquivariance's CPU fallback (benchmark dry run, mp0-small "
    "on 64 atoms: e3nn 350 ms vs cuEq 729 ms per step); OEq and hybrid need CUDA"
)


def make_plan(
    workload: Workload, config: EngineConfig | None, availability: Availabilities
) -> Plan:
    """The Plan for ``workload`` on the machine ``availability`` describes.

    ``config`` forces settings (None: nothing forced). ``availability`` comes from
    :func:`fastmace.machine.probe_availabilities`, or is written by hand for another machine.
    Raises PlanError when a forced or asked setting is impossible here, naming the reason.
    """
    config = EngineConfig() if config is None else config
    device = _device(workload, availability)
    backend = _backend(config, availability, device.value, workload.long_range)
    dtype = _dtype(workload, config, device.value)
    graphs = _graphs(config, device.value, workload.long_range)
    matmul = _matmul_precision(config, device.value, dtype.value, workload.long_range)
    emulation = _fp64_emulation(config, device.value, dtype.value)
    segments = _expandable_segments(config, availability, device.value)
    kernel_choice = _cueq_kernel_choice(workload, availability, device.value, backend.value)
    compiled = _compile(workload, config, device.value, backend.value, dtype.value)
    workers = _compile_workers(workload, compiled.value)
    table = _radial_table(
        workload, config, device.value, dtype.value, backend.value, compiled.value
    )
    decisions = (
        device,
        backend,
        dtype,
        matmul,
        table,
        _product_basis(workload, config, backend.value),
        _fused_convolution(workload, config, device.value, backend.value, table.value),
        graphs,
        compiled,
        workers,
        _block_steps(workload, config),
        _skin(config),
        _edge_capacity(config),
        _headroom(config),
        segments,
        emulation,
        _mantissa_bits(config, emulation.value),
        _reproducible(workload),
        _guard(config),
        kernel_choice,
    )
    settings = _environment(
        availability,
        segments.value,
        emulation.value,
        config.fp64_emulation_mantissa_bits,
        workload.reproducible,
        kernel_choice.value,
    )
    fallbacks = _fallbacks(
        config, availability, device.value, backend.value, graphs.value, compiled.value
    )
    return Plan(workload, config, availability, decisions, settings, fallbacks)


# -- one function per decision ----------------------------------------------------------------


def _forced(name: str, value: object) -> str:
    return f"forced by EngineConfig({name}={value!r})"


def _device(workload: Workload, found: Availabilities) -> Decision:
    gpu = found.gpu_name or "a CUDA GPU"
    if workload.device == "cpu":
        return Decision("device", "cpu", "asked by the Workload (device='cpu')", ASKED)
    if workload.device == "cuda":
        if not found.gpu:
            raise PlanError(
                f"the Workload asks for device='cuda', but there is no usable CUDA GPU here: "
                f"{found.gpu_reason or 'none found'}; ask for device='cpu' or 'auto', or see "
                "`fastmace doctor`"
            )
        return Decision("device", "cuda", f"asked by the Workload (device='cuda'): {gpu}", ASKED)
    if found.gpu:
        return Decision("device", "cuda", f"auto: {gpu} found", AVAILABILITY)
    why = found.gpu_reason or "no CUDA GPU found"
    return Decision("device", "cpu", f"auto: {why}, so the CPU", AVAILABILITY)


def _backend(
    config: EngineConfig, found: Availabilities, device: str, long_range: bool = False
) -> Decision:
    if config.backend is not None:
        status = found.backend(config.backend, device)
        if not status.available:
            raise PlanError(
                f"EngineConfig(backend={config.backend!r}) cannot run on {device}: "
                f"{status.reason}; leave backend=None to let the planner choose"
            )
        return Decision(
            "backend",
            config.backend,
            f"{_forced('backend', config.backend)} ({status.reason})",
            FORCED,
        )
    if long_range:
        return Decision("backend", CPU_BACKEND, LONG_RANGE_BACKEND_REASON, RULE)
    if device == "cpu":
        return Decision("backend", CPU_BACKEND, CPU_BACKEND_REASON, MEASURED)
    skipped = []
    for name in CUDA_BACKEND_ORDER:
        status = found.backend(name, device)
        if status.available:
            if not skipped:
                return Decision("backend", name, CUDA_BACKEND_REASON, MEASURED)
            reason = f"{CUDA_BACKEND_REASON}; " + "; ".join(skipped)
            return Decision("backend", name, reason, AVAILABILITY)
        skipped.append(f"{name} unavailable: {status.reason}")
    raise PlanError("no backend can run on cuda: " + "; ".join(skipped))


def _dtype(workload: Workload, config: EngineConfig, device: str) -> Decision:
    asked = workload.precision
    if config.dtype is not None:
        if asked not in ("auto", config.dtype):
            raise PlanError(
                f"the Workload asks for precision={asked!r} but EngineConfig(dtype="
                f"{config.dtype!r}) forces {config.dtype}: drop one of the two"
            )
        return Decision("dtype", config.dtype, _forced("dtype", config.dtype), FORCED)
    if asked != "auto":
        return Decision("dtype", asked, f"asked by the Workload (precision={asked!r})", ASKED)
    if device == "cuda":
        return Decision(
            "dtype",
            "float32",
            "rule: float32 on the GPU (positions, velocities and energies stay float64)",
            RULE,
        )
    return Decision(
        "dtype",
        workload.model_dtype,
        f"rule: the model's own dtype on the CPU ({workload.model_dtype}), as fm.load does",
        RULE,
    )


def _matmul_precision(
    config: EngineConfig, device: str, dtype: str, long_range: bool = False
) -> Decision:
    forced = config.matmul_precision
    if forced is None or forced == DEFAULT_MATMUL_PRECISION:
        reason = (
            _forced("matmul_precision", forced)
            if forced
            else "rule: matrix products in the model's dtype, within its rounding of the "
            "float64 reference (TF32 or BF16 only when forced: "
            "EngineConfig(matmul_precision='tf32' or 'bf16'))"
        )
        return Decision(
            "matmul_precision", DEFAULT_MATMUL_PRECISION, reason, FORCED if forced else RULE
        )
    if forced == "bf16":
        if dtype != "float32" or long_range:
            why = "a long-range model (MACE-POLAR-1)" if long_range else f"a {dtype} model"
            raise PlanError(
                "EngineConfig(matmul_precision='bf16') runs the linear layers of a float32 "
                f"short-range model in BF16, but the plan runs {why}; leave "
                "matmul_precision=None"
            )
        reason = _forced("matmul_precision", forced)
        if device != "cuda":
            reason += (
                "; on the CPU the BF16 products are computed in float32 GEMMs (the same "
                "numbers, slower): for checking the tier before a GPU run"
            )
        return Decision("matmul_precision", forced, reason, FORCED)
    if device != "cuda" or dtype != "float32":
        raise PlanError(
            f"EngineConfig(matmul_precision={forced!r}) needs a float32 model on a CUDA device, "
            f"but the plan runs {dtype} on the {device}; leave matmul_precision=None"
        )
    return Decision("matmul_precision", forced, _forced("matmul_precision", forced), FORCED)


def _radial_table(
    workload: Workload, config: EngineConfig, device: str, dtype: str, backend: str, compiled: bool
) -> Decision:
    if config.radial_table is False:
        return Decision("radial_table", False, _forced("radial_table", False), FORCED)
    if config.radial_table:
        if workload.long_range or dtype != "float32":
            why = "a long-range model (MACE-POLAR-1)" if workload.long_range else f"a {dtype} model"
            raise PlanError(
                f"EngineConfig(radial_table=True) needs a float32 local model, but the plan runs "
                f"{why}: the table's error (1e-6 of the weights) would exceed a float64 run's "
                "rounding, and the long-range model's blocks are not tabulated; leave "
                "radial_table=None"
            )
        if compiled and backend == "e3nn":
            # Refused here, before a run directory exists, rather than at the first compiled call.
            raise PlanError(
                "EngineConfig(radial_table=True) and compile=True cannot run together on the e3nn "
                "backend: torch.compile rebuilds an e3nn model from its configuration, which has "
                "no radial tables; drop one of them, or use the cueq, oeq or hybrid backend"
            )
        return Decision("radial_table", True, _forced("radial_table", True), FORCED)
    if device != "cuda" or dtype != "float32":
        why = f"this plan runs {dtype} on the {device}"
        return Decision(
            "radial_table", False, f"rule: tables only for float32 runs on CUDA ({why})", RULE
        )
    if workload.long_range:
        return Decision(
            "radial_table", False, "rule: a long-range model's blocks are not tabulated", RULE
        )
    if not workload.tabulable_radials:
        return Decision(
            "radial_table",
            False,
            "rule: the radial MLPs run as trained: this model's read more than the distance "
            "and the two elements (attention blocks), or it is not loaded yet",
            RULE,
        )
    if compiled and backend == "e3nn":
        return Decision(
            "radial_table",
            False,
            "rule: the compiled e3nn model is rebuilt from its configuration, without tables",
            RULE,
        )
    return Decision("radial_table", True, RADIAL_TABLE_REASON, MEASURED)


def _product_basis(workload: Workload, config: EngineConfig, backend: str) -> Decision:
    if config.product_basis is False:
        return Decision("product_basis", False, _forced("product_basis", False), FORCED)
    if config.product_basis:
        if workload.long_range or backend not in ("cueq", "hybrid"):
            why = "a long-range model (MACE-POLAR-1)" if workload.long_range else backend
            raise PlanError(
                "EngineConfig(product_basis=True) replaces cuEquivariance's symmetric "
                f"contraction of a local model (backend cueq or hybrid), but the plan runs {why}; "
                "give backend='cueq', or leave product_basis=None"
            )
        return Decision("product_basis", True, _forced("product_basis", True), FORCED)
    return Decision("product_basis", False, PRODUCT_BASIS_REASON, MEASURED)


def fused_convolution_saving_s(n_atoms: int, steps: int, per_pair: bool = False) -> float:
    """The seconds FastMACE's own convolution is predicted to save over ``steps`` steps, reading
    tables of the distance (MP-0-like blocks) or, with ``per_pair``, per pair of elements."""
    if per_pair:
        per_step_ms = (
            PAIR_TABLE_CONVOLUTION_SAVING_MS + PAIR_TABLE_CONVOLUTION_SAVING_MS_PER_ATOM * n_atoms
        )
    else:
        per_step_ms = FUSED_CONVOLUTION_SAVING_MS + FUSED_CONVOLUTION_SAVING_MS_PER_ATOM * n_atoms
    return per_step_ms * steps / 1000.0


def _fused_convolution(
    workload: Workload, config: EngineConfig, device: str, backend: str, radial_table: bool
) -> Decision:
    name = "fused_convolution"
    if config.fused_convolution is False:
        return Decision(name, False, _forced(name, False), FORCED)
    if config.fused_convolution:
        # The kernels read cuEquivariance's feature layout; OEq's and e3nn's blocks differ.
        if workload.long_range or backend != "cueq":
            why = "a long-range model (MACE-POLAR-1)" if workload.long_range else backend
            raise PlanError(
                "EngineConfig(fused_convolution=True) replaces cuEquivariance's convolution of "
                f"a local model (backend cueq), but the plan runs {why}; give backend='cueq', "
                "or leave fused_convolution=None"
            )
        return Decision(name, True, _forced(name, True), FORCED)
    if device != "cuda" or backend != "cueq" or workload.long_range:
        runs = "a long-range model" if workload.long_range else f"{backend} on the {device}"
        return Decision(
            name, False, f"rule: measured only for a local model on cuEq on CUDA; this plan "
            f"runs {runs}; EngineConfig(fused_convolution=True) forces it", RULE,
        )  # fmt: skip
    if not radial_table:
        # Without tables each block's radial MLP feeds the kernels and they lost (stage 83:
        # 3.69 against 3.41 ms and 9.20 against 8.55 ms per block at 13,824 atoms).
        return Decision(
            name, False, "measured: FastMACE's convolution pays only with radial tables, which "
            "this plan does not use (the blocks' kernels without them: 1.08x cuEquivariance's "
            "time at 13,824 atoms, H100); EngineConfig(fused_convolution=True) forces it",
            MEASURED,
        )  # fmt: skip
    per_pair = workload.radials_per_element_pair
    smallest, measured = (
        (PAIR_TABLE_CONVOLUTION_MIN_ATOMS, PAIR_TABLE_CONVOLUTION_MEASURED)
        if per_pair
        else (FUSED_CONVOLUTION_MIN_ATOMS, FUSED_CONVOLUTION_MEASURED)
    )
    if workload.n_atoms < smallest:
        below = "not measured" if per_pair else "cuEquivariance's convolution is faster"
        return Decision(
            name, False, f"measured: below {smallest:,} atoms {below} ({measured}); this plan "
            f"has {workload.n_atoms:,}; EngineConfig(fused_convolution=True) forces it", MEASURED,
        )  # fmt: skip
    saving = fused_convolution_saving_s(workload.n_atoms, workload.steps, per_pair)
    pays = saving >= FUSED_CONVOLUTION_COST_S
    reason = (
        f"measured: {workload.steps:,} steps of {workload.n_atoms:,} atoms would save about "
        f"{saving:.0f} s against about {FUSED_CONVOLUTION_COST_S:.0f} s to generate and compile "
        f"the kernels ({measured}); {'on' if pays else 'off'}: on where the saving pays for it; "
        "EngineConfig(fused_convolution=...) forces either"
    )
    return Decision(name, pays, reason, MEASURED)


def _graphs(config: EngineConfig, device: str, long_range: bool = False) -> Decision:
    if config.graphs is not None:
        if config.graphs and device != "cuda":
            raise PlanError(
                "EngineConfig(graphs=True) needs a CUDA device, but the plan runs on the CPU; "
                "leave graphs=None or run on a GPU"
            )
        if config.graphs and long_range:
            raise PlanError(
                "EngineConfig(graphs=True) cannot be honoured: "
                f"{LONG_RANGE_EAGER_REASON.removeprefix('rule: ')}; leave graphs=None"
            )
        return Decision("graphs", config.graphs, _forced("graphs", config.graphs), FORCED)
    if long_range:
        return Decision("graphs", False, LONG_RANGE_EAGER_REASON, RULE)
    if device == "cuda":
        return Decision("graphs", True, "rule: on CUDA, one graph launch per block of K steps")
    return Decision("graphs", False, "rule: CUDA graphs need CUDA")


def compile_saving_s(n_atoms: int, steps: int) -> float:
    """The seconds torch.compile is predicted to save over ``steps`` steps of ``n_atoms``."""
    per_step_ms = COMPILE_SAVING_MS + COMPILE_SAVING_MS_PER_ATOM * n_atoms
    return per_step_ms * steps / 1000.0


def _compile(
    workload: Workload, config: EngineConfig, device: str, backend: str, dtype: str
) -> Decision:
    if config.compile is not None:
        if config.compile and workload.long_range:
            raise PlanError(
                "EngineConfig(compile=True) cannot be honoured: "
                f"{LONG_RANGE_EAGER_REASON.removeprefix('rule: ')}; leave compile=None"
            )
        return Decision("compile", config.compile, _forced("compile", config.compile), FORCED)
    if workload.long_range:
        return Decision("compile", False, LONG_RANGE_COMPILE_REASON, RULE)
    if device != "cuda" or backend != "cueq" or dtype != "float32":
        return Decision(
            "compile",
            False,
            f"rule: measured only for float32 cuEq on CUDA ({COMPILE_MEASURED}); this plan runs "
            f"{dtype} {backend} on the {device}; EngineConfig(compile=True) forces it",
        )
    if workload.reproducible:
        return Decision("compile", False, "rule: the reproducible plan runs the model uncompiled")
    saving = compile_saving_s(workload.n_atoms, workload.steps)
    recorded = workload.compile_cost_s is not None
    cost = workload.compile_cost_s if recorded else COMPILE_COST_S
    pays = saving >= cost
    where = (
        "as this model's last compilation at this size took here"
        if recorded
        else "with Inductor's cache cold, never compiled here"
    )
    reason = (
        f"measured: {workload.steps:,} steps of {workload.n_atoms:,} atoms would save about "
        f"{saving:.0f} s against about {cost:.0f} s of compilation ({where}; "
        f"{COMPILE_MEASURED}); {'on' if pays else 'off'}: on where the saving pays for it"
    )
    return Decision("compile", pays, reason, MEASURED)


def _compile_workers(workload: Workload, compiled: bool) -> Decision:
    """One compile worker where the run's compilation is in Inductor's cache
    (dynamics/compile_workers.py); Inductor's pool of workers otherwise."""
    name = "compile_workers"
    if not compiled:
        return Decision(name, None, "rule: nothing is compiled", RULE)
    if workload.compile_cost_s is None:
        return Decision(
            name, None, "rule: Inductor's pool of compile workers: this model has not been "
            "compiled at this size here, so its kernels are compiled in parallel", RULE,
        )  # fmt: skip
    return Decision(name, 1, COMPILE_WORKERS_REASON, MEASURED)


def _block_steps(workload: Workload, config: EngineConfig) -> Decision:
    if config.block_steps is not None:
        return Decision(
            "block_steps", config.block_steps, _forced("block_steps", config.block_steps), FORCED
        )
    if workload.n_atoms > LARGE_ATOMS:
        return Decision(
            "block_steps",
            LARGE_BLOCK_STEPS,
            f"rule: {LARGE_BLOCK_STEPS} above {LARGE_ATOMS:,} atoms, as the benchmark ran them",
        )
    return Decision(
        "block_steps",
        DEFAULT_BLOCK_STEPS,
        f"rule: {DEFAULT_BLOCK_STEPS} up to {LARGE_ATOMS:,} atoms, as the benchmark ran them",
    )


def _skin(config: EngineConfig) -> Decision:
    if config.skin_A is not None:
        return Decision("skin_A", config.skin_A, _forced("skin_A", config.skin_A), FORCED)
    return Decision("skin_A", DEFAULT_SKIN_A, f"rule: the default Verlet skin, {DEFAULT_SKIN_A} Å")


def _edge_capacity(config: EngineConfig) -> Decision:
    if config.edge_capacity is not None:
        return Decision(
            "edge_capacity",
            config.edge_capacity,
            _forced("edge_capacity", config.edge_capacity),
            FORCED,
        )
    return Decision(
        "edge_capacity",
        None,
        "rule: the first build's edges x headroom; an overflow grows it and redoes the block",
    )


def _headroom(config: EngineConfig) -> Decision:
    if config.headroom is not None:
        return Decision("headroom", config.headroom, _forced("headroom", config.headroom), FORCED)
    return Decision(
        "headroom",
        NEIGHBOUR_HEADROOM,
        f"rule: buffers hold {NEIGHBOUR_HEADROOM:g}x what the first build needs",
    )


def torch_version_tuple(version: str | None) -> tuple[int, int] | None:
    """(major, minor) of a torch version string such as "2.14.0+cu130"; None if unreadable."""
    match = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(match[1]), int(match[2])) if match else None


def _expandable_segments(config: EngineConfig, found: Availabilities, device: str) -> Decision:
    name = "expandable_segments"
    if config.expandable_segments is not None:
        return Decision(
            name, config.expandable_segments, _forced(name, config.expandable_segments), FORCED
        )
    if device != "cuda":
        return Decision(name, False, "rule: the CPU plan uses no CUDA allocator")
    since = ".".join(map(str, EXPANDABLE_SEGMENTS_SINCE))
    version = torch_version_tuple(found.torch_version)
    if version is None:
        return Decision(name, False, f"rule: on from torch {since}; torch's version is unknown")
    if version < EXPANDABLE_SEGMENTS_SINCE:
        return Decision(name, False, f"rule: on from torch {since}; torch is {found.torch_version}")
    reason = f"rule: on from torch {since}; torch is {found.torch_version}"
    user = found.user_value(environment.PYTORCH_CUDA_ALLOC_CONF.name)
    if user is not None:
        reason += f"; but PYTORCH_CUDA_ALLOC_CONF={user!r} is the user's and is kept"
    return Decision(name, True, reason)


def _fp64_emulation(config: EngineConfig, device: str, dtype: str) -> Decision:
    name = "fp64_emulation"
    if config.fp64_emulation:
        if dtype != "float64":
            raise PlanError(
                f"EngineConfig(fp64_emulation=True) needs a float64 plan, but the plan's dtype is "
                f"{dtype}: ask for precision='float64' (Workload) or dtype='float64' (EngineConfig)"
            )
        if device != "cuda":
            raise PlanError(
                "EngineConfig(fp64_emulation=True) emulates float64 in cuBLAS, on CUDA only, but "
                "the plan runs on the CPU"
            )
    if config.fp64_emulation is not None:
        return Decision(name, config.fp64_emulation, _forced(name, config.fp64_emulation), FORCED)
    if dtype != "float64":
        return Decision(name, False, f"rule: nothing to emulate in a {dtype} plan")
    if device != "cuda":
        return Decision(name, False, "rule: cuBLAS emulation applies on CUDA only")
    return Decision(name, False, "rule: off unless forced; native float64 is the reference")


def _mantissa_bits(config: EngineConfig, emulation: bool) -> Decision:
    name, bits = "fp64_emulation_mantissa_bits", config.fp64_emulation_mantissa_bits
    if bits is not None:
        return Decision(name, bits, _forced(name, bits), FORCED)
    if emulation:
        return Decision(name, None, "rule: cuBLAS's default (the variable is not set)")
    return Decision(name, None, "rule: no fp64 emulation in this plan")


def _reproducible(workload: Workload) -> Decision:
    if workload.reproducible:
        return Decision(
            "reproducible",
            True,
            "asked by the Workload: deterministic cuBLAS, Inductor and cuEquivariance",
            ASKED,
        )
    return Decision("reproducible", False, "rule: not asked (Workload.reproducible=False)")


def _cueq_kernel_choice(
    workload: Workload, found: Availabilities, device: str, backend: str
) -> Decision:
    name = "cueq_kernel_choice"
    if device != "cuda" or backend not in CUEQ_BACKENDS:
        return Decision(name, None, f"rule: the {backend} backend on {device} runs no cuEq kernels")
    if workload.reproducible:
        return Decision(name, None, "rule: the reproducible plan fixes cuEquivariance's kernels")
    version = found.cueq_ops_version
    if version is None or not version.startswith(environment.CUEQ_KERNEL_CHOICE_MEASURED):
        measured = ", ".join(f"{prefix}x" for prefix in environment.CUEQ_KERNEL_CHOICE_MEASURED)
        return Decision(
            name, None, f"rule: measured with cuEquivariance-ops {measured} only; this is {version}"
        )
    reason = CUEQ_KERNEL_CHOICE_REASON.format(version=version)
    user = found.user_value(environment.CUEQ_KERNEL_CHOICE)
    if user is not None:
        reason += f"; but {environment.CUEQ_KERNEL_CHOICE}={user!r} is the user's and is kept"
    return Decision(name, environment.CUEQ_KERNEL_CHOICE_VALUE, reason, MEASURED)


def _guard(config: EngineConfig) -> Decision:
    if config.guard is not None:
        changed = {
            name: value
            for name, value in config.guard.to_dict().items()
            if value != getattr(GuardConfig(), name)
        }
        shown = ", ".join(f"{name}={value!r}" for name, value in changed.items())
        reason = f"forced by EngineConfig(guard=GuardConfig({shown}))"
        return Decision("guard", config.guard.to_dict(), reason, FORCED)
    return Decision(
        "guard",
        GuardConfig().to_dict(),
        "rule: the default physical bounds, checked on the device every block (docs/md.md)",
    )


# -- environment variables --------------------------------------------------------------------


def _set_unless_user(
    found: Availabilities, name: str, value: str, reason: str
) -> EnvironmentSetting:
    """docs/environment.md's usual rule: a variable the user set is kept."""
    user = found.user_value(name)
    if user is not None:
        return EnvironmentSetting(name, user, f"kept the user's value ({reason})", KEPT, user)
    return EnvironmentSetting(name, value, reason, SET)


def _environment(
    found: Availabilities,
    expandable_segments: bool,
    fp64_emulation: bool,
    mantissa_bits: int | None,
    reproducible: bool,
    cueq_kernel_choice: str | None,
) -> tuple[EnvironmentSetting, ...]:
    settings = []
    if expandable_segments:
        settings.append(
            _set_unless_user(
                found,
                environment.PYTORCH_CUDA_ALLOC_CONF.name,
                environment.EXPANDABLE_SEGMENTS,
                "expandable segments on",
            )
        )
    if fp64_emulation:
        for name, value in environment.FP64_EMULATION_VALUES.items():
            settings.append(
                _set_unless_user(found, name, value, "float64 plan with fp64 emulation")
            )
        if mantissa_bits is not None:
            settings.append(
                _set_unless_user(
                    found,
                    environment.FP64_EMULATION_BITS,
                    str(mantissa_bits),
                    "the plan's mantissa bits",
                )
            )
    if reproducible:
        for name, value in environment.REPRODUCIBLE.items():
            # docs/environment.md: these overwrite, since a reproducible run must be one.
            user = found.user_value(name)
            if user is not None and user != value:
                reason = f"reproducible plan: overwrites the user's value {user!r}"
                settings.append(EnvironmentSetting(name, value, reason, OVERWRITE, user))
            else:
                settings.append(EnvironmentSetting(name, value, "reproducible plan", SET, user))
    if cueq_kernel_choice is not None:
        settings.append(
            _set_unless_user(
                found,
                environment.CUEQ_KERNEL_CHOICE,
                cueq_kernel_choice,
                "cuEquivariance's kernel choice fixed (measured)",
            )
        )
    return tuple(settings)


# -- fallbacks --------------------------------------------------------------------------------


def _fallbacks(
    config: EngineConfig,
    found: Availabilities,
    device: str,
    backend: str,
    graphs: bool,
    compiled: bool,
) -> tuple[Fallback, ...]:
    """The ordered alternatives: the model uncompiled (where the plan chose to compile), slower
    backends (cueq -> hybrid -> e3nn), then no graphs. Each applies on top of those before, so
    a slower backend, where compilation was not measured, runs uncompiled.

    A forced setting gets none: the user's choice is never swapped behind their back.
    """
    fallbacks: list[Fallback] = []
    if config.compile is None and compiled:
        reason = "fallback: the compiled run failed, the same model runs uncompiled"
        fallbacks.append(Fallback("compile", False, reason))
    if config.backend is None and device == "cuda" and backend in CUDA_BACKEND_ORDER:
        failed = backend
        for name in CUDA_BACKEND_ORDER[CUDA_BACKEND_ORDER.index(backend) + 1 :]:
            if found.backend(name, device).available:
                reason = f"fallback: {failed} failed, {name} is the next fastest available"
                fallbacks.append(Fallback("backend", name, reason))
                failed = name
    if config.graphs is None and graphs:
        reason = "fallback: graph capture failed, the same steps run uncaptured (slower)"
        fallbacks.append(Fallback("graphs", False, reason))
    return tuple(fallbacks)
