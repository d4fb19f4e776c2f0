"""D3's fused Triton kernels give the torch version's numbers.

Run in Triton's interpreter on the CPU (``TRITON_INTERPRET=1``, set in a child process only:
Triton reads it when the kernels are defined). The torch version is itself checked against
torch-dftd (test_dispersion.py), so agreement here to float64 rounding carries that over.
On a GPU the same comparison runs compiled (marked ``gpu``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import CompileForHopper, python_report

from fastmace.dynamics.dispersion import FUSED_TOLERANCE

HERE = Path(__file__).parent
TOLERANCE = FUSED_TOLERANCE  # relative, of the largest value of each quantity

COMPARE = """
import json, sys
sys.path.insert(0, {here!r})
import torch
from ase.build import bulk
from d3_structures import structures
from fastmace.dynamics.dispersion import (
    D3BJ, D3BJParameters, DEFAULT_CUTOFF_A, kernel_disagreement,
)
from fastmace.dynamics.neighbours import NeighbourList
from fastmace.dynamics.potential import pad_edges
from fastmace.dynamics.state import State

def errors(parts, skin, padding):
    state = State.from_atoms(parts, device={device!r})
    edges = pad_edges(NeighbourList(state, DEFAULT_CUTOFF_A, skin=skin).build(state), padding)
    found = {{}}
    for kernel in ("torch", "triton"):
        d3 = D3BJ(D3BJParameters.for_functional("pbe"), state.atomic_numbers.tolist(),
                  device={device!r}, kernel=kernel)
        found[kernel] = d3(state, edges, compute_stress=True)
    result = {{}}
    for name in ("energy", "forces", "stress"):
        want, got = getattr(found["torch"], name), getattr(found["triton"], name)
        scale = want.abs().max().clamp_min(1e-300)
        result[name] = float((got - want).abs().max() / scale)
    return result

table = structures()
report = {{name: errors([atoms], 0.0, 0) for name, atoms in table.items()}}
report["batch, skin and padding"] = errors(list(table.values()), 1.5, 7)
# A run's own check on a perfect crystal, whose forces cancel to rounding noise.
state = State.from_atoms([bulk("NaCl", "rocksalt", a=5.64, cubic=True)], device={device!r})
edges = NeighbourList(state, DEFAULT_CUTOFF_A, skin=0.5).build(state)
found = [D3BJ(D3BJParameters.for_functional("pbe"), state.atomic_numbers.tolist(),
              device={device!r}, kernel=kernel)(state, edges, compute_stress=True)
         for kernel in ("torch", "triton")]
report["perfect crystal"] = {{"the run's check": kernel_disagreement(*found)}}
print(json.dumps(report))
"""


def compare(env: dict[str, str], device: str) -> dict[str, dict[str, float]]:
    return python_report(COMPARE.format(here=str(HERE), device=device), env)


def test_the_fused_kernels_match_the_torch_version_in_the_interpreter(clean_env):
    env = {**clean_env, "TRITON_INTERPRET": "1"}
    report = compare(env, "cpu")
    assert set(report) == {"molecule", "slab", "bulk", "batch, skin and padding", "perfect crystal"}
    for case, errors in report.items():
        for quantity, error in errors.items():
            assert error <= TOLERANCE, (case, quantity, error)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_fused_kernels_match_the_torch_version_on_the_gpu(clean_env):
    report = compare(clean_env, "cuda")
    for case, errors in report.items():
        for quantity, error in errors.items():
            assert error <= TOLERANCE, (case, quantity, error)


def _term(device: str):
    from ase.build import bulk

    from fastmace.dynamics.dispersion import DispersionTerm
    from fastmace.dynamics.state import State

    state = State.from_atoms([bulk("NaCl", "rocksalt", a=5.64, cubic=True)], device=device)
    return DispersionTerm.for_state(state, "pbe", 0.5)


def test_off_cuda_a_run_keeps_the_torch_version_and_says_so():
    term = _term("cpu")
    assert term.d3.kernel == "torch" and term.kernel_choice == "torch (not on CUDA)"
    assert term.record()["kernel"] == "torch (not on CUDA)"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_a_run_checks_and_takes_the_fused_kernels():
    term = _term("cuda")
    assert term.d3.kernel == "triton", term.kernel_choice
    assert term.kernel_choice.startswith("triton (within ")


def test_the_fused_kernels_compile_for_a_hopper_gpu(monkeypatch):
    from d3_structures import structures

    from fastmace.dynamics import dispersion_triton as fused
    from fastmace.dynamics.dispersion import D3BJ, DEFAULT_CUTOFF_A, D3BJParameters
    from fastmace.dynamics.neighbours import NeighbourList
    from fastmace.dynamics.state import State

    compiled: list[str] = []
    for name in ("_coordination", "_energy", "_forces"):
        monkeypatch.setattr(fused, name, CompileForHopper(getattr(fused, name), compiled))
    state = State.from_atoms([structures()["bulk"]])
    edges = NeighbourList(state, DEFAULT_CUTOFF_A, skin=0.0).build(state)
    d3 = D3BJ(D3BJParameters.for_functional("pbe"), state.atomic_numbers.tolist(), kernel="triton")
    d3(state, edges, compute_stress=True)
    assert compiled == ["_coordination", "_energy", "_forces"]
