"""Every engine setting reaches what Simulation, Relaxation and the ASE calculator build.

Each setting of EngineSettings that the potential or the neighbour list reads is given a value
other than its default and read back from the parts each caller built (fastmace/assembly.py),
so that a setting accepted and dropped by one caller fails here.
"""

from __future__ import annotations

import dataclasses
import io

import ase.build
import pytest

from fastmace import assembly
from fastmace.dynamics.ensembles import ensemble
from fastmace.dynamics.relax import FireSettings
from fastmace.io import OutputSchedule
from fastmace.models.load import load
from fastmace.planner import EngineSettings
from fastmace.relaxation import Relaxation
from fastmace.simulation import RunSettings, Simulation

# Every field below differs from EngineSettings' default.
CHANGED = {
    "block_steps": 4,
    "skin_A": 0.7,
    "edge_capacity": 20_000,
    "headroom": 1.7,
    "matmul_precision": "tf32",
    "radial_table": True,
    "radial_table_fallback": True,
    "product_basis": True,
    "fused_convolution": True,
    "compile_fallback": True,
    "edge_chunk_rows": 50,
}

# The others, and where a test reads them back from what was built.
ELSEWHERE = {
    "device": "the model's own (fm.load); test_engine_settings.py's CASES",
    "backend": "the model's own (fm.load); test_engine_settings.py's CASES",
    "dtype": "the model's own (fm.load); test_engine_settings.py's CASES",
    "graphs": "the engine's capture; test_engine_settings.py's CASES (on CUDA)",
    "compile": "test_the_one_builder_compiles_when_asked, below",
    "guard": "the engine's guard; test_guard.py",
}


def test_every_engine_setting_is_read_back_somewhere():
    # A new EngineSettings field needs a read-back here (CHANGED) or a named test elsewhere.
    names = {field.name for field in dataclasses.fields(EngineSettings)}
    assert names == set(CHANGED) | set(ELSEWHERE)


@pytest.fixture(scope="module")
def model():
    return load("demo-emt-cu", dtype="float32")


@pytest.fixture(scope="module")
def copper():
    atoms = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat(2)
    atoms.rattle(0.02, seed=1)
    return atoms


def settings_for(model) -> EngineSettings:
    base = EngineSettings(device=model.device, backend=model.backend)
    for name, value in CHANGED.items():
        assert getattr(base, name) != value, f"{name}'s test value is its default"
    return dataclasses.replace(base, **CHANGED)


def read_back(potential, neighbours) -> dict[str, object]:
    """What the built parts say of each changed setting."""
    return {
        "skin_A": neighbours.skin,
        "edge_capacity": neighbours.capacity,
        "headroom": neighbours.headroom,
        "matmul_precision": potential.matmul_precision,
        "radial_table": potential.table_report is not None,
        "radial_table_fallback": potential.table_fallback,
        # Asked for: used, or refused with the reason (the demo model runs on e3nn here).
        "product_basis": potential.product_basis_used or bool(potential.product_basis_failure),
        "fused_convolution": potential.fused_convolution_used
        or bool(potential.fused_convolution_failure),
        "compile_fallback": potential.compile_fallback,
        "edge_chunk_rows": potential.edge_chunk_rows,
    }


def expected() -> dict[str, object]:
    return {name: value for name, value in CHANGED.items() if name != "block_steps"}


def test_a_simulation_builds_with_every_setting(model, copper):
    settings = RunSettings(
        ensemble=ensemble("nvt", temperature_K=300.0), steps=4, timestep_fs=1.0, seed=1,
        schedule=OutputSchedule(0, 0, 0), initial_temperature_K=300.0,
    )  # fmt: skip
    run = Simulation(model, [copper], settings, engine=settings_for(model), progress=io.StringIO())
    assert read_back(run.potential, run.neighbours) == expected()
    assert run.engine.block_steps == CHANGED["block_steps"]
    assert run.potential.chunked_calls > 0  # 50 rows: the first forces came in chunks


def test_a_relaxation_builds_with_every_setting(model, copper):
    relaxation = Relaxation(
        model, [copper], FireSettings(), max_steps=4, engine=settings_for(model),
        progress=io.StringIO(),
    )  # fmt: skip
    built = read_back(relaxation.potential, relaxation.engine.force_field.neighbours)
    assert built == expected()
    assert relaxation.engine.block_steps == CHANGED["block_steps"]


def test_the_one_builder_compiles_when_asked(model):
    settings = dataclasses.replace(settings_for(model), compile=True, edge_chunk_rows=None)
    assert assembly.potential(model, [29], settings).compiled


def test_the_calculator_builds_its_potential_with_its_own_settings(model, copper):
    from fastmace.ase import FastMACECalculator

    calculator = FastMACECalculator(model)
    copper = copper.copy()
    copper.calc = calculator
    copper.get_forces()
    potential = calculator._potential
    assert not potential.compiled and potential.table_report is None
    assert potential.edge_chunking is None  # "auto" chunks on CUDA only


def test_the_calculator_runs_the_bf16_tier_when_asked(copper):
    """matmul_precision reaches the calculator's potential (a float32 model: BF16 GEMMs, the
    same numbers in float32 on the CPU), and a wrong value is refused at once."""
    from fastmace.ase import FastMACECalculator

    calculator = FastMACECalculator("demo-emt-cu", dtype="float32", matmul_precision="bf16")
    copper = copper.copy()
    copper.calc = calculator
    copper.get_forces()
    assert calculator._potential.matmul_precision == "bf16"
    assert calculator._potential.bf16_layers
    with pytest.raises(ValueError, match="float32, tf32, bf16"):
        FastMACECalculator("demo-emt-cu", matmul_precision="fp8")


def test_a_large_set_up_says_what_it_is_doing_as_it_goes(model, copper, monkeypatch):
    """From SETUP_PROGRESS_ATOMS atoms on (lowered here to this cell's 32), each part of the
    set-up is announced before it starts and timed when it ends; smaller runs say nothing."""
    import fastmace.simulation

    settings = RunSettings(
        ensemble=ensemble("nvt", temperature_K=300.0), steps=4, timestep_fs=1.0, seed=1,
        schedule=OutputSchedule(0, 0, 0),
    )  # fmt: skip
    quiet = io.StringIO()
    Simulation(model, [copper], settings, engine=settings_for(model), progress=quiet)
    assert "set-up:" not in quiet.getvalue()
    monkeypatch.setattr(fastmace.simulation, "SETUP_PROGRESS_ATOMS", len(copper))
    told = io.StringIO()
    Simulation(model, [copper], settings, engine=settings_for(model), progress=told)
    lines = told.getvalue().splitlines()
    assert lines[0].startswith("set-up: 32 atoms; potential ready in ")
    assert lines[0].endswith("building the neighbour list")
    assert "computing the first forces (edges in chunks of up to 50 rows)" in lines[1]
    assert lines[2].startswith("set-up: first forces in ") and len(lines) == 3


def test_the_first_forces_grow_a_list_too_small_until_it_holds_every_edge(model, copper):
    """A list sized by estimate can be too small for the structure; only an evaluation finds
    out. The first forces are then computed again on a larger list, and equal those of a list
    that was large enough from the start (float32 model, sums in another order)."""
    import torch

    from fastmace.dynamics.overflow import overflowed
    from fastmace.dynamics.state import State

    state = State.from_atoms([copper], device=model.device)
    results = {}
    for capacity in (64, 20_000):
        engine = dataclasses.replace(EngineSettings(device=model.device), edge_capacity=capacity)
        potential = assembly.potential(model, state.atomic_numbers, engine)
        neighbours = assembly.neighbour_list(state, potential, engine)
        field = assembly.force_field(state, potential, neighbours, stress=False)
        attempts = []

        def start(field=field, attempts=attempts):
            attempts.append(field.neighbours.capacity)
            return field(state)

        results[capacity] = assembly.first_forces(start, field, state)
        assert not overflowed(field.edges)
        if capacity == 64:
            assert len(attempts) > 1 and attempts[-1] > 64  # it grew
        else:
            assert attempts == [20_000]
    # The same edges in another order (another capacity): equal to float32's rounding.
    torch.testing.assert_close(results[64].forces, results[20_000].forces, rtol=1e-5, atol=1e-6)


def test_the_dispersion_term_has_the_settings_skin(model, copper):
    """D3's own list takes the settings' skin where it exceeds D3's minimum of 2 Å."""
    from fastmace.dynamics.dispersion import DISPERSION_SKIN_A
    from fastmace.dynamics.state import State

    state = State.from_atoms([copper], device=model.device)
    skin = DISPERSION_SKIN_A + 0.5
    engine = dataclasses.replace(EngineSettings(device=model.device), skin_A=skin)
    assert assembly.dispersion(state, None, engine, three_body=False) is None
    term = assembly.dispersion(state, "pbe", engine, three_body=False)
    assert term.neighbours.skin == skin and not term.d3.three_body


def test_a_large_request_says_so_before_its_structures_are_checked(copper, monkeypatch):
    """fm.md's first words come before the request's checks (a million atoms' close-pair
    search takes tens of seconds on a CPU), then the set-up's own (thresholds lowered to
    this cell's 32 atoms)."""
    import fastmace as fm
    import fastmace.api
    import fastmace.preflight.request
    import fastmace.simulation

    for module in (fastmace.api, fastmace.preflight.request, fastmace.simulation):
        monkeypatch.setattr(module, "SETUP_PROGRESS_ATOMS", len(copper))
    told = io.StringIO()
    fm.md(copper, steps=2, temperature_K=300.0, progress=told)
    notes = [line for line in told.getvalue().splitlines() if line.startswith("set-up:")]
    assert notes[0] == "set-up: 32 atoms in 1 system; checking the structures"
    assert notes[1].startswith("set-up: request checked in ")
    assert notes[1].endswith(" s; planning, loading the model")
    assert notes[2].startswith("set-up: 32 atoms; potential ready in ")
