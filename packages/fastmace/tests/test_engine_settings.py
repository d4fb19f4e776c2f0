"""The plan is the one carrier of engine settings: each setting fm.md can force reaches the engine.

Each case forces one setting, runs a few steps and reads what the engine, the neighbour list
and the model actually used back from metadata.json.
"""

from __future__ import annotations

import json
from typing import Any

import ase.build
import pytest
import torch

import fastmace as fm
from fastmace.api import engine_config
from fastmace.planner import EngineConfig


def copper() -> ase.Atoms:
    atoms = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 2, 1))
    atoms.rattle(0.02, seed=5)
    return atoms


def run(tmp_path, **arguments: Any) -> dict[str, Any]:
    fm.md(
        copper(), model="demo-emt-cu", temperature_K=300.0, steps=8, timestep_fs=2.0,
        output=tmp_path / "run", **arguments,
    )  # fmt: skip
    return json.loads((tmp_path / "run" / "metadata.json").read_text())


# (what fm.md is given, where metadata.json says what was used, the value there)
CASES = [
    ({"config": EngineConfig(edge_capacity=20_000)}, ("engine", "edge_capacity"), 20_000),
    ({"config": EngineConfig(headroom=3.0)}, ("engine", "headroom"), 3.0),
    ({"config": EngineConfig(skin_A=0.3)}, ("engine", "skin_A"), 0.3),
    ({"skin_A": 0.3}, ("engine", "skin_A"), 0.3),
    ({"config": EngineConfig(block_steps=4)}, ("engine", "block_steps"), 4),
    ({"block_steps": 4}, ("engine", "block_steps"), 4),
    ({"config": EngineConfig(dtype="float64")}, ("model", "dtype"), "float64"),
    ({"dtype": "float64"}, ("model", "dtype"), "float64"),
    ({"config": EngineConfig(backend="cueq")}, ("model", "backend"), "cueq"),
    ({"backend": "cueq"}, ("model", "backend"), "cueq"),
    # The own product basis, checked against cuEquivariance's module when built (on the CPU
    # it runs the torch formulas: the kernels' own tests are test_product_basis.py's).
    ({"config": EngineConfig(backend="cueq", product_basis=True)}, ("engine", "product_basis"),
     True),
    # The own convolution likewise, checked against each block's own convolution.
    ({"config": EngineConfig(backend="cueq", fused_convolution=True)},
     ("engine", "fused_convolution"), True),
    # The BF16 tier: on the CPU the same numbers in float32 GEMMs (a float32 model).
    ({"config": EngineConfig(matmul_precision="bf16", dtype="float32")},
     ("engine", "matmul_precision"), "bf16"),
    ({"matmul_precision": "bf16", "dtype": "float32"}, ("engine", "matmul_precision"), "bf16"),
    pytest.param(
        {"graphs": False}, ("engine", "capture"), False,
        marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                   reason="graphs are on by default on CUDA only")],
    ),
]  # fmt: skip


@pytest.mark.parametrize(("given", "where", "value"), CASES)
def test_a_forced_setting_reaches_the_engine(tmp_path, given, where, value) -> None:
    document = run(tmp_path, **given)
    section, name = where
    assert document[section][name] == value
    # The plan records it as forced, whichever way it was given.
    decision = "graphs" if name == "capture" else name  # metadata's engine record: "capture"
    if section == "engine":
        assert document["plan"]["decisions"][decision]["source"] == "forced"


def test_the_default_headroom_sizes_the_edge_buffer(tmp_path) -> None:
    """Without a forced capacity the list holds the first build's edges x the headroom."""
    small = run(tmp_path / "a", config=EngineConfig(headroom=1.0))["engine"]["edge_capacity"]
    large = run(tmp_path / "b", config=EngineConfig(headroom=2.0))["engine"]["edge_capacity"]
    assert large - 8 == pytest.approx(2 * (small - 8), abs=2)


def test_fm_md_keywords_and_config_make_one_engine_config() -> None:
    merged = engine_config(EngineConfig(compile=True), block_steps=4, graphs=False, backend="auto")
    assert merged == EngineConfig(compile=True, block_steps=4, graphs=False)
    assert engine_config(EngineConfig(skin_A=0.3), skin_A=0.3) == EngineConfig(skin_A=0.3)
    with pytest.raises(ValueError, match=r"skin_A=0\.4.*skin_A=0\.3.*force each setting once"):
        engine_config(EngineConfig(skin_A=0.3), skin_A=0.4)
    with pytest.raises(ValueError, match=r"graphs=True.*graphs=False"):
        engine_config(EngineConfig(graphs=False), graphs=True)
    with pytest.raises(TypeError, match="capture= is now graphs="):
        fm.md(copper(), model="demo-emt-cu", temperature_K=300.0, steps=1, capture=False)


def test_a_forced_capacity_too_small_grows_before_the_first_step(tmp_path) -> None:
    """The set-up recovers from an overflow of the first forces, as the engine does later."""
    document = run(tmp_path, config=EngineConfig(edge_capacity=1))
    assert document["engine"]["edge_capacity"] > 1
    assert document["plan"]["decisions"]["edge_capacity"]["value"] == 1


def test_a_tf32_engine_setting_reaches_the_potential() -> None:
    # fm.md refuses TF32 on the CPU (the planner's rule); the carrier itself is tested here.
    from fastmace.dynamics.ensembles import ensemble
    from fastmace.models.load import load
    from fastmace.planner import EngineSettings
    from fastmace.runs import RunSettings
    from fastmace.simulation import Simulation

    settings = RunSettings(ensemble=ensemble("nve"), steps=1, timestep_fs=1.0)
    simulation = Simulation(
        load("demo-emt-cu"), [copper()], settings, engine=EngineSettings(matmul_precision="tf32")
    )
    assert simulation.potential.matmul_precision == "tf32"


def test_a_bf16_run_names_the_layers_it_changed(tmp_path) -> None:
    """metadata.json lists the layers whose GEMMs took BF16 inputs (the demo model's linear
    layers and skip connections), and the report says so."""
    document = run(tmp_path, matmul_precision="bf16", dtype="float32")
    layers = document["engine"]["bf16_layers"]
    assert "interactions.0.linear_up" in layers and "interactions.0.skip_tp" in layers
    report = (tmp_path / "run" / "report.txt").read_text()
    assert f"{len(layers)} linear layers in BF16" in report
