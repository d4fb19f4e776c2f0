"""The gate against mace-torch's float64 e3nn model in a child process, and the fallback."""

from __future__ import annotations

import json

import ase.build
import ase.io
import pytest
import torch

import fastmace as fm
from fastmace.gate import GateError, gate_with_fallback, run_gate
from fastmace.models.load import load
from fastmace.vocabulary import REDUCED_PRECISION_TOLERANCE


def copper() -> ase.Atoms:
    atoms = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 1, 1))
    atoms.rattle(0.05, seed=4)
    return atoms


def perturb(model) -> None:
    with torch.no_grad():
        parameter = next(p for p in model.module.parameters() if p.numel() > 1)
        parameter.mul_(1.05)


def test_gate_passes_for_a_faithful_model_and_leaves_no_scratch(cache):
    result = run_gate(load("demo-emt-cu"), copper())
    assert result.passed, result.summary()
    assert result.forces_eV_per_A.max < 1e-10 and result.stress_eV_per_A3 is not None
    assert result.reference == "mace-torch e3nn float64 (child process)"
    assert not list(cache.glob("gate-*")), "the child's scratch outlived it"


def test_a_bf16_plan_is_gated_as_it_runs_to_its_own_tolerance(cache):
    """The gate evaluates the BF16 tier itself (its force error a hundred times float32's)
    and holds it to BF16_GATE_EPSILONS BF16 epsilons of the float32 gate's scales."""
    model = load("demo-emt-cu", dtype="float32")
    plain = run_gate(model, copper())
    reduced = run_gate(model, copper(), matmul_precision="bf16")
    assert plain.passed and reduced.passed, reduced.summary()
    assert reduced.forces_eV_per_A.max > 100 * plain.forces_eV_per_A.max
    loosening = REDUCED_PRECISION_TOLERANCE["bf16"] / (1000 * torch.finfo(torch.float32).eps)
    tolerance = reduced.forces_eV_per_A.tolerance
    assert tolerance == pytest.approx(loosening * plain.forces_eV_per_A.tolerance)
    assert reduced.matmul_precision == "bf16"


def test_the_gate_checks_the_own_kernels_where_the_plan_runs_them(cache):
    """With the plan's own convolution and product basis, the gate evaluates the potential
    that runs them (on a cuEquivariance model), and says so."""
    result = run_gate(
        load("demo-emt-cu", backend="cueq"), copper(), fused_convolution=True, product_basis=True
    )
    assert result.passed, result.summary()
    assert result.own_kernels == ("convolution", "product basis")
    assert "with the own convolution and product basis" in result.summary()
    assert run_gate(load("demo-emt-cu", backend="cueq"), copper()).own_kernels == ()


def test_a_perturbed_backend_fails_the_gate_and_the_next_one_is_used(cache):
    model = load("demo-emt-cu", backend="cueq")
    perturb(model)
    gated = gate_with_fallback(model, copper())
    assert gated.model.backend == "e3nn" and gated.gate.passed
    (failure,) = gated.failures
    assert failure["backend"] == "cueq" and "gate FAILED" in failure["reason"]


def test_no_passing_candidate_is_an_error(cache):
    model = load("demo-emt-cu", backend="e3nn")
    perturb(model)
    with pytest.raises(GateError, match="no backend passed the gate"):
        gate_with_fallback(model, copper())


def test_fm_md_with_the_gate_records_it(cache, tmp_path):
    result = fm.md(
        copper(), model="demo-emt-cu", temperature_K=300.0, steps=5, timestep_fs=2.0,
        block_steps=5, check="gate", output=tmp_path / "run",
    )  # fmt: skip
    assert "gate:      gate passed" in result.report
    document = json.loads((tmp_path / "run" / "metadata.json").read_text())
    assert document["gate"]["passed"] is True and document["fallbacks"] == []
    # The run was planned: decisions with reasons are in the metadata and the report.
    assert document["plan"]["decisions"] and "Plan:" in result.report
    assert (tmp_path / "run" / "report.txt").read_text() == result.report


def test_the_reference_process_refuses_a_file_swapped_after_the_parents_load(tmp_path):
    """Issue 33: with --trusted, the parent loaded the bytes it read; the child is held to their
    SHA-256 and refuses the file swapped since, before unpickling it (which would run code)."""
    import hashlib
    import pickle
    import shutil

    from fastmace.gate import child
    from fastmace.models.files import find_label_file
    from fastmace.models.label_table import find_checkpoint

    original = find_label_file(find_checkpoint("demo-emt-cu"))[1]
    path = tmp_path / "model.model"
    shutil.copyfile(original, path)
    loaded = load(str(path), trusted=True)  # the parent's load, as --trusted does
    assert loaded.origin["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    marker = tmp_path / "code-ran"

    class Planted:
        def __reduce__(self):
            return (marker.touch, ())

    path.write_bytes(pickle.dumps(Planted()))  # swapped between the parent's load and the gate
    structure = tmp_path / "structure.traj"
    ase.io.write(structure, ase.build.bulk("Cu", "fcc", a=3.61), format="traj")
    request = tmp_path / "request.json"
    request.write_text(json.dumps({
        "model": loaded.origin, "structure": str(structure), "device": "cpu",
        "output": str(tmp_path / "reference.npz"),
    }))  # fmt: skip
    with pytest.raises(SystemExit, match=r"refused the model file.*SHA-256"):
        child.main(str(request))
    assert not marker.exists()
    assert not (tmp_path / "reference.npz").exists()
