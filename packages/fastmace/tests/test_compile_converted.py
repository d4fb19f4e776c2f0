"""torch.compile of a cuEquivariance-converted model: compiled on a weight-sharing copy.

cuEquivariance runs its naive (pure torch) code on the CPU, so Dynamo traces the same module
tree it traces on CUDA, where the kernels are registered operators. The copy replaces the
deep copy that left a CPU constant in the naive modules on CUDA (dynamics/module_copy.py).
"""

from __future__ import annotations

import ase.build
import numpy as np
import pytest
import torch

from fastmace.dynamics.ensembles import ensemble
from fastmace.dynamics.module_copy import weight_sharing_copy
from fastmace.io import OutputSchedule
from fastmace.models.load import load
from fastmace.planner import EngineSettings
from fastmace.provenance import simulation_metadata
from fastmace.runtime import environment
from fastmace.simulation import RunSettings, Simulation

pytest.importorskip("cuequivariance_torch")


def test_weight_sharing_copy_shares_storage_not_modules():
    model = load("demo-emt-cu", backend="cueq").module
    twin = weight_sharing_copy(model)
    pairs = list(zip(model.named_parameters(), twin.named_parameters(), strict=True))
    assert all(a[0] == b[0] and a[1].data_ptr() == b[1].data_ptr() for a, b in pairs)
    assert all(p.requires_grad for p in model.parameters())
    assert not any(p.requires_grad for p in twin.parameters())
    originals = {id(m) for m in model.modules()}
    assert not any(id(m) in originals for m in twin.modules())
    # Replacing a block of the copy leaves the original's block where it was.
    block = model.interactions[0]
    twin.interactions[0] = torch.nn.Identity()
    assert model.interactions[0] is block


@pytest.mark.parametrize("radial_table", [False, True], ids=["mlp", "radial-table"])
def test_compiled_cueq_model_runs_the_same_dynamics(
    tmp_path, monkeypatch, radial_table, one_interaction_copper, header_precompiles
):
    """With radial tables too: their custom operator is one opaque call in the compiled graph."""
    monkeypatch.setenv("FASTMACE_CACHE", str(tmp_path / "cache"))
    for name in (environment.TORCHINDUCTOR_CACHE_DIR.name, environment.TRITON_CACHE_DIR.name,
                 *environment.COMPILE_CACHE_FLAGS):  # fmt: skip
        monkeypatch.delenv(name, raising=False)  # restored afterwards: compiling sets them
    # What is checked is how any converted model is compiled: the smaller one builds its package
    # in a third of the demo's time.
    model = load(one_interaction_copper, backend="cueq")
    atoms = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 1, 1))
    atoms.rattle(0.02, seed=3)

    def run(compile: bool) -> Simulation:
        settings = RunSettings(
            ensemble=ensemble("nve"), steps=6, timestep_fs=2.0, seed=7,
            schedule=OutputSchedule(0, 0, 0), initial_temperature_K=300.0,
        )  # fmt: skip
        simulation = Simulation(
            model, [atoms], settings,
            engine=EngineSettings(block_steps=3, compile=compile, radial_table=radial_table),
        )  # fmt: skip
        simulation.result = simulation.run()
        return simulation

    eager, compiled = run(False), run(True)
    # Random weights: a real trajectory, not NaNs (which assert_allclose takes as equal).
    assert np.isfinite(eager.result.structures[0].positions).all()
    assert compiled.potential.compiled
    # On the CPU the whole evaluation is compiled ahead of time: built and checked against the
    # eager evaluation now, loaded from the cache root by the next run.
    built = compiled.potential.aot_reports  # one per kind of evaluation (with stress or not)
    assert built and {report.how for report in built} == {"built"}
    again = run(True)
    loaded = again.potential.aot_reports
    assert [report.how for report in loaded] == ["loaded"] * len(built)
    assert [report.key for report in loaded] == [report.key for report in built]
    # The same package: the same dynamics, to the last bits of float64 positions (the process
    # that built it had also compiled and run the eager check; here it only loads).
    np.testing.assert_allclose(
        again.result.structures[0].positions, compiled.result.structures[0].positions, atol=1e-12
    )
    assert (compiled.potential.table_report is not None) == radial_table
    np.testing.assert_allclose(
        compiled.result.structures[0].positions, eager.result.structures[0].positions, atol=1e-10
    )
    # Compiled, cuEquivariance's linear layers with more than one path run stacked
    # (dynamics/stacked_linear.py; eager runs keep them), and the run's metadata says which.
    assert compiled.potential.stacked_layers and not eager.potential.stacked_layers
    engine = simulation_metadata(compiled.record(), "finished")["engine"]
    assert engine["stacked_layers"] == compiled.potential.stacked_layers
    assert engine["stacked_refused"] == {}
    # The caller's model still trains: its parameters were not switched off by compilation.
    assert all(p.requires_grad for p in model.module.parameters())
    # The package was built without precompiled headers: nothing was locked in Inductor's
    # shared directory, where a lock a killed build left behind stalls the next build.
    assert header_precompiles == []
