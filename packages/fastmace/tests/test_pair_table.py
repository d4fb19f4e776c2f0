"""Radial tables per pair of elements (dynamics/pair_table.py): MH-1's non-linear blocks, the
density blocks and distance transforms give the radial MLPs' energies, forces and stresses to
well within float32 rounding, with one table per ordered pair of the run's elements; blocks
whose MLPs read more than the distance and the elements are refused, as are tables too large;
the lookup kernels with per-pair starts equal the torch formulas in Triton's interpreter."""

from __future__ import annotations

import dataclasses

import ase.build
import pytest
import torch
from conftest import model_edges, python_report
from helpers.potential_checks import assert_matches_reference
from helpers.structures import cluster, small_cell, triclinic_mixed

import fastmace as fm
from fastmace.dynamics.pair_table import (
    PairRadialTable,
    pair_table_refusal,
    pair_tabulated_model,
)
from fastmace.dynamics.potential import Potential
from fastmace.dynamics.radial_table import (
    TABLE_TOLERANCE,
    TableError,
    radial_table,
    radial_table_backward,
)
from fastmace.dynamics.state import State
from fastmace.models.templates import TEMPLATES, template

SPECIES = [29, 8, 6, 1]  # the elements of the structures below
VARIANTS = {
    # MH-1's block: per-element embeddings of sender and receiver beside the radial features.
    "tiny-nonlinear": {"interaction": "RealAgnosticResidualNonLinearInteractionBlock"},
    # A density block (a second MLP), the Agnesi transform and the cutoff applied after the MLP.
    "tiny-density-agnesi": {
        "interaction": "RealAgnosticDensityResidualInteractionBlock",
        "extra": {"distance_transform": "Agnesi", "apply_cutoff": False},
    },
    # MH-1's block with both of those.
    "tiny-nonlinear-agnesi": {
        "interaction": "RealAgnosticResidualNonLinearInteractionBlock",
        "extra": {"distance_transform": "Agnesi", "apply_cutoff": False},
    },
}


@pytest.fixture
def variants(monkeypatch):
    for name, changes in VARIANTS.items():
        shape = dataclasses.replace(TEMPLATES["tiny"], **changes)
        monkeypatch.setitem(TEMPLATES, name, shape)


def structures() -> list:
    return [triclinic_mixed(), small_cell(), cluster()]


def both(model: torch.nn.Module):
    """The potential's results with the MLPs and with tables per pair of elements."""
    state = State.from_atoms(structures())
    plain = Potential(model, SPECIES)
    tabulated = Potential(model, SPECIES, radial_table=True)
    edges = model_edges(state, plain.r_max)
    return (
        state,
        plain(state, edges, compute_stress=True),
        tabulated(state, edges, compute_stress=True),
        tabulated,
    )


@pytest.mark.parametrize("name", list(VARIANTS))
def test_pair_tables_give_the_mlps_results_within_float32_rounding(variants, name):
    model = template(name, dtype=torch.float32)
    assert pair_table_refusal(model) is None
    state, plain, tabulated, potential = both(model)
    report = potential.table_report
    assert report.element_pairs == len(SPECIES) ** 2
    assert report.max_relative_error <= TABLE_TOLERANCE
    assert any(isinstance(m, PairRadialTable) for m in potential.model.modules())
    # A table is within TABLE_TOLERANCE (about 8 float32 epsilons) of its MLP, on top of the
    # rounding itself: a stress that is a small sum of large terms needs that much more room.
    assert_matches_reference(model, structures(), tabulated, state, epsilons=300)
    for quantity in ("energy", "forces", "stress"):
        a, b = getattr(plain, quantity), getattr(tabulated, quantity)
        scale = float(a.abs().max().clamp_min(1e-3))
        assert float((a - b).abs().max()) <= 2e-5 * scale, quantity


def test_in_float64_pair_tables_are_within_their_own_tolerance_of_the_mlps(variants):
    _, plain, tabulated, _ = both(template("tiny-nonlinear-agnesi", dtype=torch.float64))
    scale = float(plain.forces.abs().max())
    error = float((plain.forces - tabulated.forces).abs().max())
    assert 0 < error <= 10 * TABLE_TOLERANCE * scale  # a table, and a close one
    assert float((plain.energy - tabulated.energy).abs().max()) <= 10 * TABLE_TOLERANCE * float(
        plain.energy.abs().max()
    )


def test_each_pair_reads_its_own_table(variants):
    """Swapping the elements of a pair changes the weights (the embeddings differ by end)."""
    model = template("tiny-nonlinear", dtype=torch.float64)
    tabulated, report = pair_tabulated_model(model, [8, 1])
    table = tabulated.interactions[0].conv_tp_weights
    r = torch.full((4,), 1.3, dtype=torch.float64)
    pairs = torch.arange(4, dtype=torch.float64)  # O-O, O-H, H-O, H-H
    weights = table(torch.stack([r, pairs], dim=1))
    assert report.element_pairs == 4 and table.coefficients.shape[0] == 4 * table.intervals
    assert all(float((weights[i] - weights[j]).abs().max()) > 1e-9
               for i in range(4) for j in range(i))  # fmt: skip


@pytest.mark.parametrize(("name", "inside"), [("tiny-nonlinear", True),
                                             ("tiny-nonlinear-agnesi", False)])  # fmt: skip
def test_with_the_own_convolution_pair_tables_are_read_inside_it(variants, name, inside):
    """FastMACE's convolution reads each edge's pair table itself (the weights never
    stored) and gives what the tables and the convolution give one after the other; where the
    model applies its cutoff after the MLP the block multiplies the weights by it, so there
    the tables stay outside the convolution."""
    from fastmace.dynamics.table_conv import TabulatedConvolution
    from fastmace.models import backends

    model = backends.convert(template(name, dtype=torch.float64), "cueq", "cpu")
    state = State.from_atoms(structures())
    apart = Potential(model, SPECIES, radial_table=True)
    together = Potential(model, SPECIES, radial_table=True, fused_convolution=True)
    assert together.fused_convolution_used
    convolutions = [block.conv_tp for block in together.model.interactions]
    assert all(isinstance(c, TabulatedConvolution) == inside for c in convolutions)
    if inside:
        assert all(isinstance(c.table, PairRadialTable) for c in convolutions)
    edges = model_edges(state, apart.r_max)
    want = apart(state, edges, compute_stress=True)
    got = together(state, edges, compute_stress=True)
    for quantity in ("energy", "forces", "stress"):
        torch.testing.assert_close(
            getattr(got, quantity), getattr(want, quantity), rtol=1e-10, atol=1e-12
        )


def test_blocks_that_read_more_than_distance_and_elements_are_refused(monkeypatch):
    shape = dataclasses.replace(
        TEMPLATES["tiny"], interaction="RealAgnosticAttResidualInteractionBlock"
    )
    monkeypatch.setitem(TEMPLATES, "tiny-attention", shape)
    model = template("tiny-attention", dtype=torch.float32)
    assert "RealAgnosticAttResidualInteractionBlock" in pair_table_refusal(model)
    with pytest.raises(TableError, match="cannot be tabulated: its RealAgnosticAtt"):
        Potential(model, [29, 8], radial_table=True)


def test_tables_that_would_be_too_large_are_refused(variants):
    model = template("tiny-nonlinear", dtype=torch.float32)
    with pytest.raises(TableError, match=r"4 elements need 16 tables per block.*above 1 MB"):
        pair_tabulated_model(model, [1, 6, 8, 29], most_megabytes=1.0)


def test_an_mh1_run_records_its_pair_tables_and_passes_the_gate(tmp_path):
    atoms = ase.build.bulk("NaCl", "rocksalt", a=5.64, cubic=True)
    atoms.rattle(0.05, seed=1)
    fm.md(
        atoms, model="template:mh-1", head="omat_pbe", dtype="float32", temperature_K=300.0,
        steps=2, timestep_fs=1.0, radial_table=True, check="gate", output=tmp_path / "run",
    )  # fmt: skip
    import json

    document = json.loads((tmp_path / "run" / "metadata.json").read_text())
    assert document["engine"]["radial_table"]["element_pairs"] == 4
    workload = document["plan"]["workload"]  # what the planner learned from the loaded model
    assert workload["tabulable_radials"] and workload["radials_per_element_pair"]
    assert document["gate"]["passed"] and document["gate"]["radial_table"] is True
    assert "one per pair of elements (4)" in (tmp_path / "run" / "report.txt").read_text()


def test_the_table_ops_with_start_rows_keep_their_fakes_promises():
    """torch.library.opcheck: schema, fakes (what torch.compile traces) and autograd, for the
    radial-table ops reading a table per pair of elements."""
    generator = torch.Generator().manual_seed(3)
    intervals = 8
    coefficients = torch.randn(3 * intervals, 4, 5, dtype=torch.float64, generator=generator)
    lengths = (torch.rand(11, dtype=torch.float64, generator=generator) * 7).requires_grad_()
    start = torch.randint(0, 3, (11,), generator=generator) * intervals
    inverse = torch.tensor(intervals / 6.0, dtype=torch.float64)
    grad = torch.randn(11, 5, dtype=torch.float64, generator=generator)
    torch.library.opcheck(radial_table, (lengths, coefficients, inverse, start, intervals))
    torch.library.opcheck(
        radial_table_backward,
        (grad, lengths.detach(), coefficients, inverse, start, intervals),
    )


COMPARE = """
import json, torch
from fastmace.dynamics.radial_table import _evaluate
from fastmace.dynamics.radial_table_triton import lookup, lookup_backward
generator = torch.Generator().manual_seed(0)
report = {{}}
for dtype in (torch.float32, torch.float64):
    intervals, pairs = 16, 3
    coefficients = torch.randn(pairs * intervals, 4, 200, dtype=dtype, generator=generator)
    coefficients = coefficients.to({device!r})
    inverse = torch.tensor(intervals / 6.0, dtype=dtype, device={device!r})
    r = (torch.rand(77, dtype=dtype, generator=generator) * 7.0).to({device!r})
    start = (torch.randint(0, pairs, (77,), generator=generator) * intervals).to({device!r})
    grad = torch.randn(77, 200, dtype=dtype, generator=generator).to({device!r})
    weights, slope = _evaluate(r * inverse, coefficients, start, intervals)
    expected_grad = (grad * slope).sum(dim=1) * inverse
    got = lookup(r, coefficients, inverse, start, intervals)
    got_grad = lookup_backward(grad, r, coefficients, inverse, start, intervals)
    report[str(dtype)] = [
        float((got - weights).abs().max() / weights.abs().max()),
        float((got_grad - expected_grad).abs().max() / expected_grad.abs().max()),
    ]
print(json.dumps(report))
"""


def assert_kernels_agree(report: dict[str, list[float]]) -> None:
    for dtype, errors in report.items():
        rounding = 1e-5 if "float32" in dtype else 1e-13  # summation order of the backward
        assert all(error <= rounding for error in errors), (dtype, errors)


def test_the_per_pair_kernels_match_the_torch_formulas_in_the_interpreter(clean_env):
    env = {**clean_env, "TRITON_INTERPRET": "1"}
    assert_kernels_agree(python_report(COMPARE.format(device="cpu"), env))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_the_gpu_the_per_pair_kernels_and_tables_agree(clean_env, variants):
    assert_kernels_agree(python_report(COMPARE.format(device="cuda"), clean_env))
    model = template("tiny-nonlinear-agnesi", dtype=torch.float32).to("cuda")
    state = State.from_atoms(structures(), device="cuda")
    plain = Potential(model, SPECIES)
    tabulated = Potential(model, SPECIES, radial_table=True)
    edges = model_edges(state, plain.r_max)
    a, b = plain(state, edges).forces, tabulated(state, edges).forces
    assert float((a - b).abs().max()) <= 2e-5 * float(a.abs().max())
