"""The planner: Workload + EngineConfig + Availabilities -> Plan, each decision with its reason.

A matrix of machines (written by hand as Availabilities, so no GPU is needed) and workloads,
with the expected decision and reason for each; the errors for impossible forced settings;
describe(), to_dict() and the fallbacks; that the pure modules import no torch; and that fm.load
picks the backend the planner picks.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest
from conftest import run_python

from fastmace.planner import (
    Availabilities,
    BackendStatus,
    EngineConfig,
    EngineSettings,
    Plan,
    PlanError,
    Workload,
    make_plan,
)
from fastmace.planner.decide import torch_version_tuple
from fastmace.planner.plan import FALLBACK, SOURCES

# -- machines ---------------------------------------------------------------------------------

OK = BackendStatus(True, "available")
NO_OPS = BackendStatus(False, "cuequivariance-ops-torch (the CUDA kernels) is not installed")
OEQ_NO_EXTENSION = BackendStatus(
    False,
    "OpenEquivariance's host extension: the prebuilt extension is not used (fastmace-oeq-ext is "
    "not installed) and the host toolchain build cannot run; missing: libcuda.so.1",
)
# FASTMACE_OEQ_PREBUILT=1 with a wheel built for another torch: as fastmace.oeq.choice says it.
OEQ_PREBUILT_MISMATCH = BackendStatus(
    False,
    "OpenEquivariance's host extension: FASTMACE_OEQ_PREBUILT=1 refuses the toolchain build and "
    "the prebuilt extension cannot be used (built for torch 2.13.0+cu130, installed "
    "2.14.0+cu130): install the fastmace-oeq-ext wheel built for this torch, or unset "
    "FASTMACE_OEQ_PREBUILT",
)
CPU_TABLE = {
    "e3nn": OK,
    "cueq": BackendStatus(True, "cuEquivariance's PyTorch fallback (CPU)"),
    "oeq": BackendStatus(False, "OpenEquivariance's kernels run on CUDA GPUs only"),
    "hybrid": BackendStatus(False, "OpenEquivariance's kernels run on CUDA GPUs only"),
}


def machine(
    gpu: bool = True,
    torch: str = "2.14.0+cu130",
    env: dict[str, str] | None = None,
    cueq_ops_version: str | None = None,
    **cuda: BackendStatus,
) -> Availabilities:
    """A machine with every CUDA backend available except those given."""
    table = {"e3nn": OK, "cueq": OK, "oeq": OK, "hybrid": OK, **cuda}
    return Availabilities(
        gpu=gpu,
        gpu_name="NVIDIA H200" if gpu else None,
        gpu_reason="1 CUDA device(s)" if gpu else f"torch {torch} sees no CUDA GPU",
        torch_version=torch,
        cueq_ops=table["cueq"].available,
        cueq_ops_version=cueq_ops_version,
        oeq_extension="prebuilt" if table["hybrid"].available else "unavailable",
        cuda=table,
        cpu=CPU_TABLE,
        environment=env or {},
    )


NO_GPU = machine(gpu=False, cueq=NO_OPS, hybrid=NO_OPS, oeq=OEQ_NO_EXTENSION)
EVERYTHING = machine()
CUEQ_WITHOUT_OPS = machine(cueq=NO_OPS, hybrid=NO_OPS)
OEQ_WITHOUT_EXTENSION = machine(oeq=OEQ_NO_EXTENSION, hybrid=OEQ_NO_EXTENSION)
PREBUILT_MISMATCH = machine(oeq=OEQ_PREBUILT_MISMATCH, hybrid=OEQ_PREBUILT_MISMATCH)
OLD_TORCH = machine(torch="2.9.1+cu128")
USER_ALLOCATOR = machine(env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"})
CUEQ_OPS_013 = machine(cueq_ops_version="0.13.0")
CUEQ_OPS_013_USER_CHOICE = machine(
    cueq_ops_version="0.13.0", env={"CUEQUIVARIANCE_OPS_U1D_ALGOS": "3"}
)
CUEQ_OPS_014 = machine(cueq_ops_version="0.14.0")
USER_CUBLAS = machine(
    env={"CUBLAS_EMULATION_STRATEGY": "performant", "CUBLAS_WORKSPACE_CONFIG": ":16:8"}
)


def workload(**changes: Any) -> Workload:
    """64 Cu atoms, NVT at 300 K, unless changed."""
    fields: dict[str, Any] = {
        "atoms_per_system": (64,),
        "species": (29,),
        "temperatures_K": 300.0,
    }
    return Workload(**{**fields, **changes})


PlanFor = Callable[..., Plan]


@pytest.fixture
def plan_for() -> PlanFor:
    """The planner set-up the tests share: ``plan_for(config=None, found=EVERYTHING,
    **changes)`` is the plan of ``workload(**changes)`` forced by ``config`` on ``found``."""

    def plan(
        config: EngineConfig | None = None, found: Availabilities = EVERYTHING, **changes: Any
    ) -> Plan:
        return make_plan(workload(**changes), config, found)

    return plan


# -- the matrix -------------------------------------------------------------------------------

# id, workload changes, config, machine, {decision: (value, words in its reason, source)},
# {variable: (value, action)}, fallbacks as (name, value)
CASES: list[tuple[str, dict, EngineConfig, Availabilities, dict, dict, list]] = [
    (
        "no-gpu",
        {},
        EngineConfig(),
        NO_GPU,
        {
            "device": ("cpu", "sees no CUDA GPU", "availability"),
            "backend": ("e3nn", "e3nn 350 ms vs cuEq 729 ms", "measured"),
            "dtype": ("float64", "model's own dtype on the CPU", "rule"),
            "graphs": (False, "CUDA graphs need CUDA", "rule"),
            "compile": (False, "measured only for float32 cuEq on CUDA", "rule"),
            "block_steps": (50, "50 up to 10,000 atoms", "rule"),
            "skin_A": (0.5, "default Verlet skin", "rule"),
            "edge_capacity": (None, "first build", "rule"),
            "headroom": (1.25, "1.25x", "rule"),
            "expandable_segments": (False, "no CUDA allocator", "rule"),
            "fp64_emulation": (False, "CUDA only", "rule"),
            "reproducible": (False, "not asked", "rule"),
        },
        {},
        [],
    ),
    (
        "no-gpu-float32-model",
        {"model_dtype": "float32"},
        EngineConfig(),
        NO_GPU,
        {"dtype": ("float32", "model's own dtype on the CPU (float32)", "rule")},
        {},
        [],
    ),
    (
        "cpu-asked-on-gpu-machine",
        {"device": "cpu"},
        EngineConfig(),
        EVERYTHING,
        {
            "device": ("cpu", "asked by the Workload", "asked"),
            "backend": ("e3nn", "cuEquivariance's CPU fallback", "measured"),
            "graphs": (False, "CUDA graphs need CUDA", "rule"),
        },
        {},
        [],
    ),
    (
        "gpu-cueq-without-ops",
        {},
        EngineConfig(),
        CUEQ_WITHOUT_OPS,
        {
            "device": ("cuda", "NVIDIA H200", "availability"),
            "backend": ("e3nn", "cueq unavailable: cuequivariance-ops-torch", "availability"),
            "dtype": ("float32", "float32 on the GPU", "rule"),
            "graphs": (True, "one graph launch per block", "rule"),
        },
        {"PYTORCH_CUDA_ALLOC_CONF": ("expandable_segments:True", "set")},
        [("graphs", False)],
    ),
    (
        "oeq-without-extension",
        {},
        EngineConfig(),
        OEQ_WITHOUT_EXTENSION,
        {"backend": ("cueq", "measured: the fastest available of cueq > hybrid", "measured")},
        {"PYTORCH_CUDA_ALLOC_CONF": ("expandable_segments:True", "set")},
        [("backend", "e3nn"), ("graphs", False)],
    ),
    (
        "oeq-prebuilt-1-mismatched-wheel",
        {},
        EngineConfig(),
        PREBUILT_MISMATCH,
        {"backend": ("cueq", "measured: the fastest available of cueq > hybrid", "measured")},
        {"PYTORCH_CUDA_ALLOC_CONF": ("expandable_segments:True", "set")},
        [("backend", "e3nn"), ("graphs", False)],
    ),
    (
        "everything-available",
        {},
        EngineConfig(),
        EVERYTHING,
        {
            "backend": ("cueq", "fastest available of cueq > hybrid > e3nn", "measured"),
            "dtype": ("float32", "float32 on the GPU", "rule"),
            "graphs": (True, "one graph launch per block", "rule"),
            "expandable_segments": (True, "torch is 2.14.0+cu130", "rule"),
            "fp64_emulation": (False, "nothing to emulate in a float32 plan", "rule"),
            "compile": (False, "would save about 1 s against about 30 s", "measured"),
        },
        {"PYTORCH_CUDA_ALLOC_CONF": ("expandable_segments:True", "set")},
        [("backend", "hybrid"), ("backend", "e3nn"), ("graphs", False)],
    ),
    (
        "long-large-run-compiles",
        {"atoms_per_system": (13_824,), "steps": 20_000},
        EngineConfig(),
        EVERYTHING,
        {"compile": (True, "20,000 steps of 13,824 atoms would save about 124 s", "measured")},
        {"PYTORCH_CUDA_ALLOC_CONF": ("expandable_segments:True", "set")},
        # Uncompiled first: the slower backends were not measured compiled.
        [("compile", False), ("backend", "hybrid"), ("backend", "e3nn"), ("graphs", False)],
    ),
    (
        "long-small-run-compiles",
        {"atoms_per_system": (216,), "steps": 100_000},
        EngineConfig(),
        EVERYTHING,
        {"compile": (True, "save about 76 s against about 30 s", "measured")},
        {"PYTORCH_CUDA_ALLOC_CONF": ("expandable_segments:True", "set")},
        [("compile", False), ("backend", "hybrid"), ("backend", "e3nn"), ("graphs", False)],
    ),
    (
        "short-small-run-stays-uncompiled",
        {"atoms_per_system": (216,), "steps": 10_000},
        EngineConfig(),
        EVERYTHING,
        {"compile": (False, "save about 8 s against about 30 s of compilation (with", "measured")},
        {"PYTORCH_CUDA_ALLOC_CONF": ("expandable_segments:True", "set")},
        [("backend", "hybrid"), ("backend", "e3nn"), ("graphs", False)],
    ),
    (
        # The cache's record of this model's last compilation here makes a short run pay.
        "recorded-compilation-short-run-compiles",
        {"atoms_per_system": (13_824,), "steps": 1_000, "compile_cost_s": 4.0},
        EngineConfig(),
        EVERYTHING,
        {"compile": (True, "save about 6 s against about 4 s of compilation (as this", "measured")},
        {"PYTORCH_CUDA_ALLOC_CONF": ("expandable_segments:True", "set")},
        [("compile", False), ("backend", "hybrid"), ("backend", "e3nn"), ("graphs", False)],
    ),
    (
        "recorded-compilation-too-slow-for-the-run",
        {"atoms_per_system": (13_824,), "steps": 1_000, "compile_cost_s": 12.0},
        EngineConfig(),
        EVERYTHING,
        {"compile": (False, "against about 12 s of compilation (as this model's", "measured")},
        {"PYTORCH_CUDA_ALLOC_CONF": ("expandable_segments:True", "set")},
        [("backend", "hybrid"), ("backend", "e3nn"), ("graphs", False)],
    ),
    (
        "old-torch-no-expandable-segments",
        {},
        EngineConfig(),
        OLD_TORCH,
        {"expandable_segments": (False, "on from torch 2.14; torch is 2.9.1", "rule")},
        {},
        [("backend", "hybrid"), ("backend", "e3nn"), ("graphs", False)],
    ),
    (
        "large-system",
        {"atoms_per_system": (6_000, 6_000)},
        EngineConfig(),
        EVERYTHING,
        {"block_steps": (20, "20 above 10,000 atoms", "rule")},
        {"PYTORCH_CUDA_ALLOC_CONF": ("expandable_segments:True", "set")},
        [("backend", "hybrid"), ("backend", "e3nn"), ("graphs", False)],
    ),
    (
        "float64-gpu-without-emulation",
        {"precision": "float64"},
        EngineConfig(),
        EVERYTHING,
        {
            "dtype": ("float64", "asked by the Workload", "asked"),
            "fp64_emulation": (False, "off unless forced", "rule"),
        },
        {"PYTORCH_CUDA_ALLOC_CONF": ("expandable_segments:True", "set")},
        [("backend", "hybrid"), ("backend", "e3nn"), ("graphs", False)],
    ),
    (
        "float64-with-fp64-emulation",
        {"precision": "float64"},
        EngineConfig(fp64_emulation=True, fp64_emulation_mantissa_bits=53),
        EVERYTHING,
        {
            "fp64_emulation": (True, "forced by EngineConfig(fp64_emulation=True)", "forced"),
            "fp64_emulation_mantissa_bits": (53, "forced", "forced"),
        },
        {
            "PYTORCH_CUDA_ALLOC_CONF": ("expandable_segments:True", "set"),
            "CUBLAS_EMULATE_DOUBLE_PRECISION": ("1", "set"),
            "CUBLAS_EMULATION_STRATEGY": ("eager", "set"),
            "CUBLAS_FIXEDPOINT_EMULATION_MANTISSA_BIT_COUNT": ("53", "set"),
        },
        [("backend", "hybrid"), ("backend", "e3nn"), ("graphs", False)],
    ),
    (
        "fp64-emulation-keeps-user-strategy",
        {},
        EngineConfig(dtype="float64", fp64_emulation=True),
        USER_CUBLAS,
        {
            "dtype": ("float64", "forced by EngineConfig(dtype='float64')", "forced"),
            "fp64_emulation_mantissa_bits": (None, "cuBLAS's default", "rule"),
        },
        {
            "PYTORCH_CUDA_ALLOC_CONF": ("expandable_segments:True", "set"),
            "CUBLAS_EMULATE_DOUBLE_PRECISION": ("1", "set"),
            "CUBLAS_EMULATION_STRATEGY": ("performant", "kept"),
        },
        [("backend", "hybrid"), ("backend", "e3nn"), ("graphs", False)],
    ),
    (
        "reproducible-overwrites",
        {"reproducible": True},
        EngineConfig(),
        USER_CUBLAS,
        {"reproducible": (True, "deterministic cuBLAS, Inductor and cuEquivariance", "asked")},
        {
            "PYTORCH_CUDA_ALLOC_CONF": ("expandable_segments:True", "set"),
            "CUBLAS_WORKSPACE_CONFIG": (":4096:8", "overwrite"),
            "TORCHINDUCTOR_DETERMINISTIC": ("1", "set"),
            "CUEQUIVARIANCE_OPS_U1D_ALGOS": ("1,1", "set"),
        },
        [("backend", "hybrid"), ("backend", "e3nn"), ("graphs", False)],
    ),
    (
        "cueq-kernel-choice-fixed-where-measured",
        {},
        EngineConfig(),
        CUEQ_OPS_013,
        {"cueq_kernel_choice": ("2", "20.2 to 5.5 s", "measured")},
        {
            "PYTORCH_CUDA_ALLOC_CONF": ("expandable_segments:True", "set"),
            "CUEQUIVARIANCE_OPS_U1D_ALGOS": ("2", "set"),
        },
        [("backend", "hybrid"), ("backend", "e3nn"), ("graphs", False)],
    ),
    (
        "cueq-kernel-choice-for-hybrid",
        {},
        EngineConfig(backend="hybrid"),
        CUEQ_OPS_013,
        {"cueq_kernel_choice": ("2", "cuEquivariance-ops 0.13.0 times candidate", "measured")},
        {
            "PYTORCH_CUDA_ALLOC_CONF": ("expandable_segments:True", "set"),
            "CUEQUIVARIANCE_OPS_U1D_ALGOS": ("2", "set"),
        },
        [("graphs", False)],
    ),
    (
        "cueq-kernel-choice-keeps-the-users",
        {},
        EngineConfig(),
        CUEQ_OPS_013_USER_CHOICE,
        {"cueq_kernel_choice": ("2", "ALGOS='3' is the user's and is kept", "measured")},
        {
            "PYTORCH_CUDA_ALLOC_CONF": ("expandable_segments:True", "set"),
            "CUEQUIVARIANCE_OPS_U1D_ALGOS": ("3", "kept"),
        },
        [("backend", "hybrid"), ("backend", "e3nn"), ("graphs", False)],
    ),
    (
        "cueq-kernel-choice-not-for-unmeasured-versions",
        {},
        EngineConfig(),
        CUEQ_OPS_014,
        {"cueq_kernel_choice": (None, "measured with cuEquivariance-ops 0.13.x only", "rule")},
        {"PYTORCH_CUDA_ALLOC_CONF": ("expandable_segments:True", "set")},
        [("backend", "hybrid"), ("backend", "e3nn"), ("graphs", False)],
    ),
    (
        "cueq-kernel-choice-not-for-e3nn",
        {},
        EngineConfig(backend="e3nn"),
        CUEQ_OPS_013,
        {"cueq_kernel_choice": (None, "the e3nn backend on cuda runs no cuEq kernels", "rule")},
        {"PYTORCH_CUDA_ALLOC_CONF": ("expandable_segments:True", "set")},
        [("graphs", False)],
    ),
    (
        "cueq-kernel-choice-reproducible-wins",
        {"reproducible": True},
        EngineConfig(),
        CUEQ_OPS_013,
        {"cueq_kernel_choice": (None, "reproducible plan fixes", "rule")},
        {
            "PYTORCH_CUDA_ALLOC_CONF": ("expandable_segments:True", "set"),
            "CUBLAS_WORKSPACE_CONFIG": (":4096:8", "set"),
            "TORCHINDUCTOR_DETERMINISTIC": ("1", "set"),
            "CUEQUIVARIANCE_OPS_U1D_ALGOS": ("1,1", "set"),
        },
        [("backend", "hybrid"), ("backend", "e3nn"), ("graphs", False)],
    ),
    (
        "reproducible-on-cpu",
        {"reproducible": True},
        EngineConfig(),
        NO_GPU,
        {"reproducible": (True, "deterministic", "asked")},
        {
            "CUBLAS_WORKSPACE_CONFIG": (":4096:8", "set"),
            "TORCHINDUCTOR_DETERMINISTIC": ("1", "set"),
            "CUEQUIVARIANCE_OPS_U1D_ALGOS": ("1,1", "set"),
        },
        [],
    ),
    (
        "everything-at-once",
        {"precision": "float64", "reproducible": True},
        EngineConfig(fp64_emulation=True),
        USER_ALLOCATOR,
        {
            "fp64_emulation": (True, "forced", "forced"),
            "reproducible": (True, "deterministic", "asked"),
        },
        {
            "PYTORCH_CUDA_ALLOC_CONF": ("max_split_size_mb:512", "kept"),
            "CUBLAS_EMULATE_DOUBLE_PRECISION": ("1", "set"),
            "CUBLAS_EMULATION_STRATEGY": ("eager", "set"),
            "CUBLAS_WORKSPACE_CONFIG": (":4096:8", "set"),
            "TORCHINDUCTOR_DETERMINISTIC": ("1", "set"),
            "CUEQUIVARIANCE_OPS_U1D_ALGOS": ("1,1", "set"),
        },
        [("backend", "hybrid"), ("backend", "e3nn"), ("graphs", False)],
    ),
    (
        "user-allocator-setting-kept",
        {},
        EngineConfig(),
        USER_ALLOCATOR,
        {
            "expandable_segments": (
                True,
                "'max_split_size_mb:512' is the user's and is kept",
                "rule",
            )
        },
        {"PYTORCH_CUDA_ALLOC_CONF": ("max_split_size_mb:512", "kept")},
        [("backend", "hybrid"), ("backend", "e3nn"), ("graphs", False)],
    ),
    (
        "forced-settings-win",
        {},
        EngineConfig(
            backend="cueq",
            graphs=False,
            compile=True,
            block_steps=10,
            skin_A=1.0,
            edge_capacity=5000,
            headroom=1.5,
            expandable_segments=False,
        ),
        EVERYTHING,
        {
            "backend": ("cueq", "forced by EngineConfig(backend='cueq')", "forced"),
            "graphs": (False, "forced by EngineConfig(graphs=False)", "forced"),
            "compile": (True, "forced", "forced"),
            "block_steps": (10, "forced", "forced"),
            "skin_A": (1.0, "forced", "forced"),
            "edge_capacity": (5000, "forced", "forced"),
            "headroom": (1.5, "forced", "forced"),
            "expandable_segments": (False, "forced", "forced"),
        },
        {},
        [],  # forced settings are never swapped for a fallback
    ),
    (
        "forced-backend-on-cpu-fallback",
        {},
        EngineConfig(backend="cueq"),
        NO_GPU,
        {"backend": ("cueq", "cuEquivariance's PyTorch fallback (CPU)", "forced")},
        {},
        [],
    ),
]


def _plan(case: tuple) -> Plan:
    _, changes, config, found, *_ = case
    return make_plan(workload(**changes), config, found)


@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_decisions_and_reasons(case: tuple) -> None:
    _, _, _, _, expected, variables, fallbacks = case
    plan = _plan(case)
    for name, (value, words, source) in expected.items():
        decision = plan.decision(name)
        assert (decision.value, decision.source) == (value, source), decision
        assert words in decision.reason, decision
    assert {s.name: (s.value, s.action) for s in plan.environment} == variables
    assert [(f.name, f.value) for f in plan.fallbacks] == fallbacks


@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_every_decision_has_a_reason_and_the_dict_is_json(case: tuple) -> None:
    plan = _plan(case)
    assert all(d.reason and d.source in SOURCES for d in plan.decisions)
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["decisions"]["backend"]["value"] == plan.backend
    assert data["workload"]["n_atoms"] == plan.workload.n_atoms
    assert [v["name"] for v in data["environment"]] == [s.name for s in plan.environment]


@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_describe_fits_in_a_few_lines(case: tuple) -> None:
    plan = _plan(case)
    text = plan.describe()
    assert len(text.splitlines()) <= 12, text
    assert plan.backend in text and plan.dtype in text
    assert text.splitlines()[0] == f"Plan: {plan.workload.summary()}"


@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_applying_the_environment_gives_what_the_plan_says(case: tuple) -> None:
    """The plan's predicted variables are what fastmace.runtime.environment then sets."""
    plan = _plan(case)
    environ = dict(plan.availabilities.environment)
    assert plan.apply_environment(environ) == plan.environment_values()
    for name, value in plan.environment_values().items():
        assert environ[name] == value


# -- impossible settings ----------------------------------------------------------------------

IMPOSSIBLE = [
    (
        "hybrid-forced-with-mismatched-prebuilt",
        {},
        EngineConfig(backend="hybrid"),
        PREBUILT_MISMATCH,
        ["backend='hybrid'", "cannot run on cuda", "FASTMACE_OEQ_PREBUILT=1 refuses"],
    ),
    (
        "cueq-forced-without-ops",
        {},
        EngineConfig(backend="cueq"),
        CUEQ_WITHOUT_OPS,
        ["backend='cueq'", "cuequivariance-ops-torch (the CUDA kernels) is not installed"],
    ),
    (
        "hybrid-forced-on-cpu",
        {},
        EngineConfig(backend="hybrid"),
        NO_GPU,
        ["cannot run on cpu", "OpenEquivariance's kernels run on CUDA GPUs only"],
    ),
    (
        "cuda-asked-without-gpu",
        {"device": "cuda"},
        EngineConfig(),
        NO_GPU,
        ["device='cuda'", "sees no CUDA GPU", "fastmace doctor"],
    ),
    ("graphs-forced-on-cpu", {}, EngineConfig(graphs=True), NO_GPU, ["graphs=True", "CPU"]),
    (
        "fp64-emulation-in-float32-plan",
        {},
        EngineConfig(fp64_emulation=True),
        EVERYTHING,
        ["needs a float64 plan", "float32", "precision='float64'"],
    ),
    (
        "fp64-emulation-on-cpu",
        {"precision": "float64"},
        EngineConfig(fp64_emulation=True),
        NO_GPU,
        ["CUDA only"],
    ),
    (
        "tf32-on-cpu",
        {},
        EngineConfig(matmul_precision="tf32"),
        NO_GPU,
        ["matmul_precision='tf32'", "float32 model on a CUDA device", "cpu"],
    ),
    (
        "radial-table-in-a-float64-plan",
        {"precision": "float64"},
        EngineConfig(radial_table=True),
        EVERYTHING,
        ["radial_table=True", "float32 local model", "float64"],
    ),
    (
        "radial-table-for-a-long-range-model",
        {"long_range": True},
        EngineConfig(radial_table=True),
        EVERYTHING,
        ["radial_table=True", "long-range model"],
    ),
    (
        "radial-table-compiled-on-e3nn",
        {"precision": "float32"},
        EngineConfig(radial_table=True, compile=True),
        NO_GPU,
        ["radial_table=True", "compile=True", "e3nn", "cueq, oeq or hybrid"],
    ),
    (
        "product-basis-on-e3nn",
        {},
        EngineConfig(product_basis=True),
        NO_GPU,
        ["product_basis=True", "backend cueq or hybrid", "e3nn"],
    ),
    (
        "product-basis-for-a-long-range-model",
        {"long_range": True},
        EngineConfig(product_basis=True),
        EVERYTHING,
        ["product_basis=True", "long-range model"],
    ),
    (
        "fused-convolution-on-hybrid",
        {},
        EngineConfig(fused_convolution=True, backend="hybrid"),
        EVERYTHING,
        ["fused_convolution=True", "backend cueq", "hybrid"],
    ),
    (
        "fused-convolution-for-a-long-range-model",
        {"long_range": True},
        EngineConfig(fused_convolution=True),
        EVERYTHING,
        ["fused_convolution=True", "long-range model"],
    ),
    (
        "bf16-in-a-float64-plan",
        {"precision": "float64"},
        EngineConfig(matmul_precision="bf16"),
        EVERYTHING,
        ["matmul_precision='bf16'", "float32 short-range model", "a float64 model"],
    ),
    (
        "bf16-for-a-long-range-model",
        {"long_range": True},
        EngineConfig(matmul_precision="bf16"),
        EVERYTHING,
        ["matmul_precision='bf16'", "long-range model"],
    ),
    (
        "tf32-in-a-float64-plan",
        {"precision": "float64"},
        EngineConfig(matmul_precision="tf32"),
        EVERYTHING,
        ["matmul_precision='tf32'", "float64"],
    ),
    (
        "precision-and-dtype-disagree",
        {"precision": "float64"},
        EngineConfig(dtype="float32"),
        EVERYTHING,
        ["precision='float64'", "dtype='float32'"],
    ),
    (
        "graphs-forced-for-a-long-range-model",
        {"long_range": True},
        EngineConfig(graphs=True),
        EVERYTHING,
        ["graphs=True) cannot be honoured", "host synchronisation", "leave graphs=None"],
    ),
    (
        "compile-forced-for-a-long-range-model",
        {"long_range": True},
        EngineConfig(compile=True),
        EVERYTHING,
        ["compile=True) cannot be honoured", "host synchronisation", "leave compile=None"],
    ),
]


@pytest.mark.parametrize("case", IMPOSSIBLE, ids=[case[0] for case in IMPOSSIBLE])
def test_impossible_settings_raise_with_the_reason(case: tuple, plan_for: PlanFor) -> None:
    _, changes, config, found, words = case
    with pytest.raises(PlanError) as error:
        plan_for(config=config, found=found, **changes)
    for word in words:
        assert word in str(error.value)


def test_a_long_range_model_runs_eagerly_on_e3nn_even_on_a_gpu(plan_for: PlanFor) -> None:
    # A run long enough that a local model's plan would compile it on cuEq.
    plan = plan_for(long_range=True, steps=10_000_000)
    backend, graphs, compiled = (plan.decision(n) for n in ("backend", "graphs", "compile"))
    assert (backend.value, backend.source) == ("e3nn", "rule")
    assert "long-range" in backend.reason and "docs/validation/polar.md" in backend.reason
    assert graphs.value is False and "host synchronisation" in graphs.reason
    assert compiled.value is False and "long-range" in compiled.reason
    assert plan.fallbacks == ()  # no slower backend, and nothing captured to give up
    settings = plan.engine_settings()
    assert (settings.backend, settings.graphs, settings.compile) == ("e3nn", False, False)
    local = plan_for(steps=10_000_000)
    assert (local.backend, local.decision("compile").value) == ("cueq", True)


# -- fallbacks --------------------------------------------------------------------------------


def test_candidates_walk_the_fallbacks_in_order(plan_for: PlanFor) -> None:
    plan = plan_for()
    candidates = list(plan.candidates())
    assert [(c.backend, c.graphs) for c in candidates] == [
        ("cueq", True),
        ("hybrid", True),
        ("e3nn", True),
        ("e3nn", False),
    ]
    assert candidates[0] is plan
    assert candidates[1].decision("backend").source == FALLBACK
    assert "cueq failed" in candidates[1].decision("backend").reason
    assert [len(c.fallbacks) for c in candidates] == [3, 2, 1, 0]
    assert candidates[3].decision("dtype") == plan.decision("dtype")  # the rest is unchanged


def test_fallbacks_skip_unavailable_backends(plan_for: PlanFor) -> None:
    found = machine(cueq=NO_OPS)  # hybrid available (as a test of the order), cueq not
    plan = plan_for(found=found)
    assert [(f.name, f.value) for f in plan.fallbacks] == [("backend", "e3nn"), ("graphs", False)]


# -- the records ------------------------------------------------------------------------------


def test_plan_and_inputs_are_frozen(plan_for: PlanFor) -> None:
    plan = plan_for()
    for record, field in ((plan, "decisions"), (plan.workload, "steps"), (plan.config, "dtype")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(record, field, None)


def test_engine_settings_carry_every_engine_decision(plan_for: PlanFor) -> None:
    plan = plan_for()
    assert plan.engine_settings() == EngineSettings(
        device="cuda", backend="cueq", dtype="float32", block_steps=50, skin_A=0.5,
        edge_capacity=None, headroom=1.25, graphs=True, compile=False, compile_fallback=True,
        matmul_precision="float32", radial_table_fallback=True,
    )  # fmt: skip
    forced = EngineConfig(
        backend="hybrid", dtype="float32", graphs=False, compile=True, edge_capacity=999,
        headroom=2.0, skin_A=0.25, block_steps=7, matmul_precision="tf32",
    )  # fmt: skip
    settings = plan_for(config=forced).engine_settings()
    # Every engine setting an EngineConfig can force comes out, under the same name.
    assert {name: getattr(settings, name) for name in forced.forced()} == forced.forced()
    # What the user forced fails loudly; only the planner's own choice falls back.
    assert not settings.compile_fallback


def test_unknown_decision_names_what_the_plan_decides(plan_for: PlanFor) -> None:
    plan = plan_for()
    with pytest.raises(KeyError, match="it decides: device, backend"):
        plan.decision("threads")


@pytest.mark.parametrize(
    ("version", "expected"),
    [("2.14.0+cu130", (2, 14)), ("2.15.0.dev20260301+cu130", (2, 15)), ("2.9.1", (2, 9)),
     ("", None), (None, None), ("nightly", None)],
)  # fmt: skip
def test_torch_version_tuple(version: str | None, expected: tuple[int, int] | None) -> None:
    assert torch_version_tuple(version) == expected


# -- EngineConfig and Workload checks ---------------------------------------------------------


def test_engine_config_defaults_leave_everything_to_the_planner() -> None:
    assert EngineConfig().forced() == {}
    assert EngineConfig(backend="auto", dtype="auto").forced() == {}
    assert EngineConfig(block_steps=10).forced() == {"block_steps": 10}


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"backend": "cuda"}, "backend='cuda') is not allowed: use one of e3nn, cueq, oeq, hybrid"),
        ({"dtype": "float16"}, "dtype='float16'"),
        ({"matmul_precision": "fp8"}, "matmul_precision='fp8') is not allowed: use one of"),
        ({"graphs": "yes"}, "graphs='yes'"),
        ({"compile": 1}, "compile=1"),
        ({"block_steps": 0}, "block_steps=0"),
        ({"block_steps": 2.5}, "whole number"),
        ({"edge_capacity": -5}, "edge_capacity=-5"),
        ({"headroom": 0.9}, "headroom=0.9"),
        ({"skin_A": 0}, "skin_A=0"),
        ({"skin_A": float("nan")}, "skin_A=nan"),
        ({"fp64_emulation": True, "fp64_emulation_mantissa_bits": 80}, "1 to 79"),
        ({"fp64_emulation_mantissa_bits": 40}, "needs fp64_emulation=True"),
    ],
)
def test_engine_config_rejects_bad_values(settings: dict, words: str) -> None:
    with pytest.raises(ValueError) as error:
        EngineConfig(**settings)
    assert words in str(error.value)


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"ensemble": "nvp"}, "unknown ensemble 'nvp'"),
        ({"temperatures_K": ()}, "needs a temperature"),
        ({"temperatures_K": (300.0, 400.0)}, "one per system (1)"),
        ({"temperatures_K": -1.0}, "positive temperature"),
        ({"pressure_GPa": 1.0}, "takes no pressure"),
        ({"ensemble": "npt", "periodic": (True, True, False)}, "periodic in x, y and z"),
        ({"atoms_per_system": (0,)}, "atoms_per_system"),
        ({"species": (0,)}, "1 to 118"),
        ({"steps": -1}, "steps=-1"),
        ({"timestep_fs": 20.0}, "(0, 10] fs"),
        ({"precision": "half"}, "precision='half'"),
        ({"device": "gpu"}, "device='gpu'"),
        ({"reproducible": "yes"}, "reproducible='yes'"),
        ({"periodic": ((True, True),)}, "one (x, y, z) triple"),
        ({"long_range": "yes"}, "long_range='yes'"),
        (
            {"ensemble": "npt", "pressure_GPa": 0.0, "long_range": True},
            "leaves out its long-range part",
        ),
    ],
)
def test_workload_rejects_bad_values(changes: dict, words: str) -> None:
    with pytest.raises(ValueError) as error:
        workload(**changes)
    assert words in str(error.value)


def test_workload_normalises_its_inputs() -> None:
    asked = workload(
        atoms_per_system=[10, 20], species=[8, 1, 8], ensemble="NHC", temperatures_K=[300, 350]
    )
    assert asked.atoms_per_system == (10, 20)
    assert asked.species == (1, 8)
    assert asked.ensemble == "nvt-nose-hoover"
    assert asked.temperatures_K == (300.0, 350.0)
    assert asked.periodicity == ((True, True, True), (True, True, True))
    assert (asked.n_systems, asked.n_atoms) == (2, 30)
    nve = workload(ensemble="nve", temperatures_K=())
    assert nve.temperatures_K == ()


def test_workload_from_structures_reads_ase_atoms() -> None:
    from ase.build import bulk, molecule

    crystal = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2)
    water = molecule("H2O")
    asked = Workload.from_structures(
        [crystal, water], ensemble="nvt-csvr", temperature_K=300, steps=200, reproducible=True
    )
    assert asked.atoms_per_system == (32, 3)
    assert asked.species == (1, 8, 29)
    assert asked.periodicity == ((True, True, True), (False, False, False))
    assert (asked.ensemble, asked.steps, asked.reproducible) == ("nvt-csvr", 200, True)
    assert asked.summary() == (
        "2 systems, 35 atoms (H, O, Cu), nvt-csvr at 300 K, 200 steps of 1 fs"
    )
    one = Workload.from_structures(crystal, ensemble="npt", temperature_K=300, pressure_GPa=1.0)
    assert one.atoms_per_system == (32,) and one.pressure_GPa == 1.0
    json.dumps(asked.to_dict())
    with pytest.raises(TypeError, match=r"ase\.Atoms"):
        Workload.from_structures([], temperature_K=300)
    with pytest.raises(ValueError, match="periodic in x, y and z"):
        Workload.from_structures(water, ensemble="npt", temperature_K=300)


# -- no torch in the decisions; one backend order -------------------------------------------

PURE = (
    "import sys, json\n"
    "from fastmace.planner import Availabilities, EngineConfig, Workload, make_plan\n"
    "import fastmace.planner.decide, fastmace.planner.plan, fastmace.planner.workload\n"
    "import fastmace.planner.config, fastmace.planner.availability\n"
    "found = Availabilities(gpu=True, torch_version='2.14.0')\n"
    "plan = make_plan(Workload(atoms_per_system=(8,), species=(29,), temperatures_K=300.0),"
    " EngineConfig(), found)\n"
    "plan.describe(); json.dumps(plan.to_dict())\n"
    "heavy = ('torch', 'mace', 'e3nn', 'cuequivariance_torch', 'openequivariance',\n"
    "         'fastmace.dynamics', 'fastmace.models', 'fastmace.gate', 'fastmace.oeq')\n"
    "print(json.dumps(sorted(m for m in heavy if m in sys.modules)))\n"
)


def test_planning_imports_neither_torch_nor_md_nor_models(clean_env) -> None:
    result = run_python(PURE, clean_env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


@pytest.mark.parametrize(
    "unavailable",
    [(), ("cueq",), ("hybrid",), ("cueq", "hybrid"), ("oeq", "hybrid"), ("cueq", "oeq", "hybrid")],
)
def test_fm_load_and_the_planner_pick_the_same_backend(
    unavailable: tuple[str, ...], plan_for: PlanFor
) -> None:
    """fm.load(backend="auto") (and so fm.calculator) and fm.md's plan run the same kernels."""
    from fastmace.models import backends
    from fastmace.models.load import choose_backend

    found = machine(**{name: NO_OPS for name in unavailable})

    def availability(backend: str, device: str) -> backends.Availability:
        status = found.backend(backend, device)
        return backends.Availability(backend, status.available, status.reason)

    plan = plan_for(found=found)
    assert choose_backend("auto", "cuda", availability)[0] == plan.backend
    assert (
        choose_backend("auto", "cpu", availability)[0]
        == plan_for(found=found, device="cpu").backend
    )


def test_probe_describes_this_machine(plan_for: PlanFor) -> None:
    import torch

    from fastmace.machine import probe_availabilities

    environ = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64", "CUBLAS_WORKSPACE_CONFIG": ""}
    found = probe_availabilities(environ)
    assert found.gpu == torch.cuda.is_available()
    assert found.torch_version == torch.__version__
    assert found.cpu["e3nn"].available
    assert not found.cpu["hybrid"].available
    assert found.environment == {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"}
    json.dumps(found.to_dict())
    plan = plan_for(found=found)
    if not found.gpu:
        assert (plan.device, plan.backend) == ("cpu", "e3nn")


def test_the_own_product_basis_only_when_forced(plan_for: PlanFor) -> None:
    # Faster kernels, the same whole evaluation (docs/design/product-basis.md): not chosen.
    plain = plan_for()
    decision = plain.decision("product_basis")
    assert (decision.value, decision.source) == (False, "measured")
    assert "25.75 ms either way" in decision.reason and not plain.engine_settings().product_basis
    assert "product" not in plain.describe()
    forced = plan_for(config=EngineConfig(product_basis=True))
    assert forced.engine_settings().product_basis
    assert forced.decision("product_basis").source == "forced"
    assert "product      own" in forced.describe()
    # Forced on the CPU too, where it runs the torch formulas (the backend forced to cuEq).
    cpu = plan_for(config=EngineConfig(product_basis=True, backend="cueq"), found=NO_GPU)
    assert cpu.engine_settings().product_basis


def test_the_own_convolution_where_its_saving_pays_for_its_compilation(plan_for: PlanFor) -> None:
    # With radial tables, from 3,000 atoms, on cuEq on CUDA, for runs long enough that the
    # saving measured per step pays for generating and compiling the kernels.
    large = {"atoms_per_system": (13824,), "species": (11, 17), "tabulable_radials": True}
    chosen = plan_for(**large, steps=100_000)
    decision = chosen.decision("fused_convolution")
    assert (decision.value, decision.source) == (True, "measured")
    assert "100,000 steps of 13,824 atoms would save about 630 s" in decision.reason
    assert chosen.engine_settings().fused_convolution and chosen.radial_table
    assert "convolution  own" in chosen.describe()
    # MH-1's tables per pair of elements: measured apart (1.18x at 1,728 atoms), so chosen from
    # there, for a run long enough at that size, with the saving of its own measurements.
    pairs = {**large, "radials_per_element_pair": True}
    for changes, value, words in (
        ({**pairs, "atoms_per_system": (1728,), "steps": 10_000}, True, "save about 15 s"),
        ({**pairs, "steps": 1_000}, True, "1,000 steps of 13,824 atoms would save about 14 s"),
        ({**pairs, "atoms_per_system": (1728,), "steps": 1_000}, False, "save about 1 s"),
        ({**pairs, "atoms_per_system": (216,)}, False, "below 1,728 atoms not measured"),
    ):
        decision = plan_for(**changes).decision("fused_convolution")
        assert (decision.value, decision.source) == (value, "measured"), changes
        assert words in decision.reason and "tables per pair" in decision.reason, decision.reason
    # Each reason it is left out: too short a run, too few atoms, no tables, the device, the
    # backend, a long-range model.
    for changes, config, words in (
        ({**large, "steps": 1_000}, None, "save about 6 s against about 11 s"),
        ({**large, "atoms_per_system": (1728,)}, None, "below 3,000 atoms"),
        ({**large, "tabulable_radials": False}, None, "only with radial tables"),
        ({**large, "device": "cpu"}, None, "e3nn on the cpu"),
        (large, EngineConfig(backend="hybrid"), "hybrid on the cuda"),
        ({**large, "long_range": True}, None, "a long-range model"),
    ):
        plain = plan_for(config=config, **changes)
        decision = plain.decision("fused_convolution")
        assert decision.value is False and decision.source in ("measured", "rule"), changes
        assert words in decision.reason, (changes, decision.reason)
        assert "convolution" not in plain.describe()
    # Forced either way, whatever the rule says.
    forced = plan_for(config=EngineConfig(fused_convolution=True, backend="cueq"))
    assert forced.engine_settings().fused_convolution
    assert forced.decision("fused_convolution").source == "forced"
    assert "convolution  own" in forced.describe()
    off = plan_for(config=EngineConfig(fused_convolution=False), **large, steps=100_000)
    assert off.decision("fused_convolution").source == "forced"
    assert not off.engine_settings().fused_convolution


def test_one_worker_where_the_compilation_was_recorded_here(plan_for):
    compiled = {"atoms_per_system": (13824,), "species": (11, 17)}
    config = EngineConfig(compile=True, backend="cueq")
    cold = plan_for(config=config, **compiled)
    assert cold.compile_workers is None
    assert "not been compiled at this size here" in cold.decision("compile_workers").reason
    assert "workers" not in cold.describe()
    warm = plan_for(config=config, compile_cost_s=7.7, **compiled)
    decision = warm.decision("compile_workers")
    assert (warm.compile_workers, decision.source) == (1, "measured")
    assert "28.8 against 23.1-23.4 s" in decision.reason
    assert "  workers      1" in warm.describe()
    uncompiled = plan_for(config=EngineConfig(compile=False), compile_cost_s=7.7, **compiled)
    assert uncompiled.compile_workers is None


def test_radial_tables_by_default_where_the_model_allows_them(plan_for: PlanFor) -> None:
    tabulable = workload(tabulable_radials=True)
    chosen = make_plan(tabulable, None, EVERYTHING)
    assert chosen.radial_table and chosen.engine_settings().radial_table
    assert chosen.decision("radial_table").source == "measured"
    assert chosen.engine_settings().radial_table_fallback  # chosen, so a failed build falls back
    assert "radial       table" in chosen.describe()
    # Each reason the rule keeps the MLPs: the model, the device, the dtype, long range.
    for changes, words in (
        ({"tabulable_radials": False}, "more than the distance and the two elements"),
        ({"tabulable_radials": True, "device": "cpu"}, "float32 runs on CUDA"),
        ({"tabulable_radials": True, "precision": "float64"}, "float32 runs on CUDA"),
        ({"tabulable_radials": True, "long_range": True}, "long-range"),
    ):
        plain = plan_for(**changes)
        decision = plain.decision("radial_table")
        assert (decision.value, decision.source) == (False, "rule"), changes
        assert words in decision.reason, (changes, decision.reason)
        assert "radial" not in plain.describe()
    # Turned off, or forced where the rule would not choose it.
    off = make_plan(tabulable, EngineConfig(radial_table=False), EVERYTHING)
    assert not off.radial_table and off.decision("radial_table").source == "forced"
    forced = plan_for(config=EngineConfig(radial_table=True))
    assert forced.radial_table and not forced.engine_settings().radial_table_fallback
    # On e3nn with compile forced, the rule leaves the tables out instead of refusing.
    e3nn = make_plan(tabulable, EngineConfig(backend="e3nn", compile=True), EVERYTHING)
    assert e3nn.compile and not e3nn.radial_table


def test_compile_cost_record_must_be_seconds() -> None:
    for bad in (-1.0, float("nan"), float("inf"), True, "5"):
        with pytest.raises(ValueError, match="compile_cost_s"):
            workload(compile_cost_s=bad)
    assert workload(compile_cost_s=0).compile_cost_s == 0


def test_matmul_precision_is_float32_unless_tf32_is_forced(plan_for: PlanFor) -> None:
    plain = plan_for()
    assert plain.matmul_precision == "float32"
    assert plain.decision("matmul_precision").source == "rule"
    assert "matmul" not in plain.describe()
    fast = plan_for(config=EngineConfig(matmul_precision="tf32"))
    assert fast.matmul_precision == "tf32" and fast.engine_settings().matmul_precision == "tf32"
    assert "matmul       tf32" in fast.describe()
    reduced = plan_for(config=EngineConfig(matmul_precision="bf16"))
    assert reduced.engine_settings().matmul_precision == "bf16"
    assert "matmul       bf16" in reduced.describe()
    assert "CPU" not in reduced.decision("matmul_precision").reason


def test_bf16_on_the_cpu_is_planned_and_says_how_it_runs(plan_for: PlanFor) -> None:
    """On the CPU the BF16 tier computes the same numbers in float32 GEMMs: planned when
    forced (to check a model's BF16 accuracy before a GPU run), with that in its reason."""
    config = EngineConfig(matmul_precision="bf16")
    plan = plan_for(config=config, found=NO_GPU, model_dtype="float32")
    assert plan.matmul_precision == "bf16"
    assert "the same numbers, slower" in plan.decision("matmul_precision").reason
