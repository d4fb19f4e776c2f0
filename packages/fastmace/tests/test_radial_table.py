"""Radial weights read from tables (dynamics/radial_table.py): the same energies, forces and
stresses as the radial MLPs to well within float32 rounding, zero beyond the cutoff, refused
where the weights are not a function of the distance alone, and the Triton kernels equal to
the torch formulas (in Triton's interpreter on the CPU, and on the GPU)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import ase.build
import pytest
import torch
from conftest import CompileForHopper, model_edges, python_report
from helpers.potential_checks import assert_matches_reference, model_of
from helpers.structures import cluster, copper_supercell, small_cell, triclinic_mixed

import fastmace as fm
from fastmace.dynamics.potential import Potential, UnsupportedModelError
from fastmace.dynamics.radial_table import (
    TABLE_TOLERANCE,
    RadialTable,
    TableError,
    tabulated_model,
)
from fastmace.dynamics.state import State
from fastmace.models.templates import TEMPLATES, template
from fastmace.planner import PlanError

HERE = Path(__file__).parent
SPECIES = [29, 8, 6, 1]


def outputs(model: torch.nn.Module, device: str = "cpu"):
    """The potential's results on four structures, with the MLPs and with tables."""
    structures = [copper_supercell(), triclinic_mixed(), small_cell(), cluster()]
    state = State.from_atoms(structures, device=device)
    plain = Potential(model, SPECIES)
    tabulated = Potential(model, SPECIES, radial_table=True)
    edges = model_edges(state, plain.r_max)
    return (
        structures,
        state,
        plain(state, edges, compute_stress=True),
        tabulated(state, edges, compute_stress=True),
        tabulated,
    )


@pytest.mark.parametrize("name", ["mp0-small", "tiny"])
def test_tables_give_the_mlps_results_within_float32_rounding(name):
    model = model_of(name, torch.float32)
    structures, state, plain, tabulated, potential = outputs(model)
    report = potential.table_report
    assert report.blocks == len(model.interactions)
    assert report.max_relative_error <= TABLE_TOLERANCE
    # Still mace-torch's numbers, to its float32 tolerance, system by system.
    assert_matches_reference(model, structures, tabulated, state)
    # And much closer to the MLPs than float32's 1000-epsilon tolerance (1.2e-4 of the scale).
    for quantity in ("energy", "forces", "stress"):
        a, b = getattr(plain, quantity), getattr(tabulated, quantity)
        scale = float(a.abs().max().clamp_min(1e-3))
        assert float((a - b).abs().max()) <= 2e-5 * scale, quantity


def test_in_float64_the_tables_are_within_their_own_tolerance_of_the_mlps():
    """float64 shows the table's error alone, without float32's rounding on top."""
    _, _, plain, tabulated, _ = outputs(model_of("mp0-small", torch.float64))
    scale = float(plain.forces.abs().max())
    assert float((plain.forces - tabulated.forces).abs().max()) <= 10 * TABLE_TOLERANCE * scale
    assert float((plain.forces - tabulated.forces).abs().max()) > 0  # a table, not the MLP


def test_between_nodes_a_table_is_within_its_tolerance_of_the_float64_mlp():
    """At distances the build never looked at, in the weights and in their slope."""
    model = model_of("mp0-small", torch.float64)
    tabulated, _ = tabulated_model(model)
    block, original = tabulated.interactions[1], model.interactions[1]
    r = torch.rand(4000, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    r = (0.3 + r * (model.r_max - 0.3)).requires_grad_(True)
    features, _ = model.radial_embedding(r[:, None], None, None, None)
    exact = original.conv_tp_weights(features)
    read = block.conv_tp_weights(r[:, None])
    error = float((read - exact).detach().abs().max())
    assert error <= TABLE_TOLERANCE * float(exact.detach().abs().max())
    # d(sum of weights . v)/dr for a random v: the slope, through the custom backward.
    v = torch.randn_like(exact)
    (exact_slope,) = torch.autograd.grad((exact * v).sum(), r)
    (read_slope,) = torch.autograd.grad((read * v).sum(), r)
    scale = float(exact_slope.abs().max())
    assert float((read_slope - exact_slope).abs().max()) <= 100 * TABLE_TOLERANCE * scale


def test_a_table_that_would_outgrow_its_memory_is_refused_before_it_is_built():
    """A function that needs more intervals than the memory left allows (the float64 build
    needs several times the table on the device): refused before the doubling, not after."""

    def radial(r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def fast(x: torch.Tensor) -> torch.Tensor:  # 0.9 rad per interval at 256 intervals
            return torch.sin(40.0 * x)[:, None].repeat(1, 64)

        return torch.func.jvp(fast, (r,), (torch.ones_like(r),))

    table = RadialTable.build(radial, 6.0, TABLE_TOLERANCE, torch.zeros(1))
    assert table.coefficients.shape[0] > 512  # what it needs without a limit
    with pytest.raises(TableError, match=r"512 intervals would take 0\.5 MB, above the 0\.3 MB"):
        RadialTable.build(radial, 6.0, TABLE_TOLERANCE, torch.zeros(1), most_megabytes=0.3)


def test_a_doubled_table_holds_the_function_at_its_own_nodes():
    """The build reuses the midpoints its error check evaluated as the next grid's nodes: the
    table it ends with holds the function's values and slopes at that table's nodes, as if
    they had been evaluated there (and it counts the function's calls: none twice)."""
    points = []

    def radial(r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        points.append(r.numel())

        def wave(x: torch.Tensor) -> torch.Tensor:  # needs 1,024 or more intervals on [0, 6]
            return torch.stack([torch.sin(12.0 * x), torch.cos(7.0 * x) * x], dim=1)

        return torch.func.jvp(wave, (r,), (torch.ones_like(r),))

    table = RadialTable.build(radial, 6.0, TABLE_TOLERANCE, torch.zeros(1, dtype=torch.float64))
    intervals = table.intervals
    assert intervals >= 1024
    grid = torch.arange(intervals + 1, dtype=torch.float64) * table.spacing
    values, slopes = radial(grid)
    torch.testing.assert_close(table.coefficients[:, 0], values[:-1], rtol=0, atol=1e-14)
    torch.testing.assert_close(
        table.coefficients[:, 1], slopes[:-1] * table.spacing, rtol=0, atol=1e-14
    )
    # The first grid (257 nodes), then three midpoint sets per level: nothing else.
    levels = (intervals // 256).bit_length()
    assert sum(points[:-1]) == 257 + sum(3 * 256 * 2**level for level in range(levels))


def test_beyond_the_cutoff_the_weights_and_their_slope_are_zero():
    """Padding edges sit at 2 r_max: they must read zeros and send no force."""
    model = model_of("tiny", torch.float32)
    table = tabulated_model(model)[0].interactions[0].conv_tp_weights
    assert isinstance(table, RadialTable)
    r = torch.tensor([model.r_max, 1.5 * model.r_max, 2 * model.r_max]).requires_grad_(True)
    weights = table(r[:, None])
    assert bool((weights == 0).all())
    (slope,) = torch.autograd.grad(weights.sum(), r)
    assert bool((slope == 0).all())


@pytest.fixture
def attention(monkeypatch) -> str:
    """A template whose radial MLPs read the node features (not tabulable at all)."""
    shape = dataclasses.replace(
        TEMPLATES["tiny"], interaction="RealAgnosticAttResidualInteractionBlock"
    )
    monkeypatch.setitem(TEMPLATES, "tiny-attention", shape)
    return "tiny-attention"


def test_models_whose_weights_are_not_a_function_of_the_distance_are_refused(
    monkeypatch, attention
):
    # A distance transform makes the weights depend on the elements too: not one table (the
    # potential builds one per pair of elements instead, tests/test_pair_table.py).
    extra = {"distance_transform": "Agnesi"}
    agnesi = dataclasses.replace(TEMPLATES["tiny"], extra=extra)
    monkeypatch.setitem(TEMPLATES, "tiny-agnesi", agnesi)
    with pytest.raises(TableError, match="distance transform"):
        tabulated_model(template("tiny-agnesi", dtype=torch.float32))
    with pytest.raises(TableError, match=r"cannot be tabulated: its RealAgnosticAttResidual"):
        Potential(template(attention, dtype=torch.float32), [29, 8], radial_table=True)
    with pytest.raises(UnsupportedModelError, match="leave radial_table off"):
        Potential(template("polar-tiny", dtype=torch.float32), [1, 8], radial_table=True)
    # Tables the planner chose (fallback on) that cannot be built: the MLPs run, with a warning.
    with pytest.warns(RuntimeWarning, match="RealAgnosticAtt.*the radial MLPs run as trained"):
        chosen = Potential(
            template(attention, dtype=torch.float32), [1, 8], radial_table=True,
            radial_table_fallback=True,
        )  # fmt: skip
    assert chosen.table_report is None and "RealAgnosticAtt" in (chosen.table_failure or "")


def test_a_run_whose_model_cannot_have_tables_writes_nothing(tmp_path, attention):
    atoms = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True)
    with pytest.raises(TableError, match="RealAgnosticAttResidualInteractionBlock"):
        fm.md(
            atoms, model=f"template:{attention}", dtype="float32", temperature_K=300.0,
            steps=2, radial_table=True, output=tmp_path / "run",
        )  # fmt: skip
    assert not (tmp_path / "run").exists()


def test_a_table_run_records_its_tables_and_passes_the_gate(tmp_path):
    atoms = ase.build.bulk("NaCl", "rocksalt", a=5.64, cubic=True)
    atoms.rattle(0.05, seed=1)
    fm.md(
        atoms, model="template:mp0-small", dtype="float32", temperature_K=300.0, steps=4,
        timestep_fs=1.0, radial_table=True, check="gate", output=tmp_path / "run",
    )  # fmt: skip
    document = json.loads((tmp_path / "run" / "metadata.json").read_text())
    assert document["plan"]["decisions"]["radial_table"]["value"] is True
    assert document["engine"]["radial_table"]["max_relative_error"] <= TABLE_TOLERANCE
    assert document["gate"]["passed"] and document["gate"]["radial_table"] is True
    report = (tmp_path / "run" / "report.txt").read_text()
    assert "radial weights from tables" in report


def test_an_e3nn_model_is_not_compiled_with_tables():
    """Compile rebuilds e3nn models from their configuration, which knows no tables."""
    from fastmace.dynamics.potential import ModelCompileError

    model = model_of("tiny", torch.float32)
    potential = Potential(model, SPECIES, radial_table=True, compile=True)
    state = State.from_atoms([copper_supercell()])
    with pytest.raises(ModelCompileError, match="radial_table or compile, not both"):
        potential(state, model_edges(state, potential.r_max))


def test_a_float64_run_cannot_have_tables():
    with pytest.raises(PlanError, match=r"radial_table=True.*float32 local model.*float64"):
        fm.md(
            ase.build.bulk("Cu", "fcc", a=3.61, cubic=True), model="demo-emt-cu",
            dtype="float64", temperature_K=300.0, steps=1, radial_table=True,
        )  # fmt: skip


COMPARE = """
import json, torch
from fastmace.dynamics.radial_table import _evaluate
from fastmace.dynamics.radial_table_triton import lookup, lookup_backward
generator = torch.Generator().manual_seed(0)
report = {{}}
for dtype in (torch.float32, torch.float64):
    coefficients = torch.randn(64, 4, 200, dtype=dtype, generator=generator).to({device!r})
    inverse = torch.tensor(64 / 6.0, dtype=dtype, device={device!r})
    # Beyond the table's end too (r > 6), and a row count that is not a whole block.
    r = (torch.rand(77, dtype=dtype, generator=generator) * 7.0).to({device!r})
    grad = torch.randn(77, 200, dtype=dtype, generator=generator).to({device!r})
    weights, slope = _evaluate(r * inverse, coefficients)
    expected_grad = (grad * slope).sum(dim=1) * inverse
    got = lookup(r, coefficients, inverse)
    got_grad = lookup_backward(grad, r, coefficients, inverse)
    report[str(dtype)] = [
        float((got - weights).abs().max() / weights.abs().max()),
        float((got_grad - expected_grad).abs().max() / expected_grad.abs().max()),
    ]
print(json.dumps(report))
"""


def compare(env: dict[str, str], device: str) -> dict[str, list[float]]:
    return python_report(COMPARE.format(device=device), env)


def assert_kernels_agree(report: dict[str, list[float]]) -> None:
    for dtype, errors in report.items():
        rounding = 1e-5 if "float32" in dtype else 1e-13  # summation order of the backward
        assert all(error <= rounding for error in errors), (dtype, errors)


def test_the_kernels_match_the_torch_formulas_in_the_interpreter(clean_env):
    assert_kernels_agree(compare({**clean_env, "TRITON_INTERPRET": "1"}, "cpu"))


def test_the_kernels_compile_for_hopper(monkeypatch):
    """Triton's whole pipeline down to an sm_90 cubin, without a GPU."""
    from fastmace.dynamics import radial_table_triton as kernels

    compiled: list[str] = []
    for name in ("_lookup", "_lookup_backward"):
        monkeypatch.setattr(kernels, name, CompileForHopper(getattr(kernels, name), compiled))
    coefficients = torch.zeros(8, 4, 200)
    r, inverse = torch.zeros(40), torch.tensor(1.0)
    kernels.lookup(r, coefficients, inverse)
    kernels.lookup_backward(torch.zeros(40, 200), r, coefficients, inverse)
    assert compiled == ["_lookup", "_lookup_backward"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_the_gpu_the_kernels_and_the_tables_agree(clean_env):
    assert_kernels_agree(compare(clean_env, "cuda"))
    model = template("mp0-small", dtype=torch.float32).to("cuda")
    _, _, plain, tabulated, _ = outputs(model, device="cuda")
    scale = float(plain.forces.abs().max())
    assert float((plain.forces - tabulated.forces).abs().max()) <= 2e-5 * scale
