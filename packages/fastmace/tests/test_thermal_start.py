"""A run drawn from rest at an energy minimum starts at twice its target and reaches it; the
report and the result give the mean temperature of the run's second half."""

from __future__ import annotations

import io
import json
import math

import ase.build
import numpy as np
import pytest
import torch
from conftest import settings

import fastmace as fm
from fastmace.dynamics.thermal_start import AT_MINIMUM_FMAX_EV_PER_A
from fastmace.runs import SecondHalfMean
from fastmace.simulation import Simulation


def crystal(rattle: float = 0.0) -> ase.Atoms:
    atoms = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat(2)
    if rattle:
        atoms.rattle(rattle, seed=3)
    return atoms


def start_velocities(demo, structures, equipartition: bool) -> tuple[torch.Tensor, Simulation]:
    run = Simulation(
        demo, structures, settings(10, start_at_equipartition=equipartition),
        progress=io.StringIO(),
    )  # fmt: skip
    return run.engine.md.state.velocities.clone(), run


def test_a_crystal_at_its_minimum_starts_at_twice_the_target_and_a_rattled_one_does_not(demo):
    structures = [crystal(), crystal(rattle=0.1)]
    plain, _ = start_velocities(demo, structures, equipartition=False)
    doubled, run = start_velocities(demo, structures, equipartition=True)
    start = run.thermal_start
    assert start.doubled == (True, False)
    assert start.fmax_eV_per_A[0] < 1e-6 < AT_MINIMUM_FMAX_EV_PER_A < start.fmax_eV_per_A[1]
    first, second = slice(0, 32), slice(32, 64)  # the same draw, scaled by sqrt(2) or not
    torch.testing.assert_close(doubled[first], plain[first] * math.sqrt(2.0), rtol=1e-15, atol=0)
    assert torch.equal(doubled[second], plain[second])
    assert "for 1 of 2 systems at rest at an energy minimum" in start.describe()


def test_without_the_default_draw_nothing_is_doubled(demo):
    _, run = start_velocities(demo, [crystal()], equipartition=False)
    assert run.thermal_start is None


def test_fm_md_doubles_only_its_own_draw_and_records_it(demo, tmp_path):
    atoms = crystal()
    fm.md(atoms, steps=10, temperature_K=300.0, output=tmp_path / "default", seed=1,
          progress=io.StringIO())  # fmt: skip
    metadata = json.loads((tmp_path / "default" / "metadata.json").read_text())
    assert metadata["settings"]["thermal_start"]["doubled"] == [True]
    report = (tmp_path / "default" / "report.txt").read_text()
    assert "start:     velocities drawn at twice the target for the system" in report
    fm.md(atoms, steps=10, temperature_K=300.0, output=tmp_path / "asked", seed=1,
          initial_temperature_K=300.0, progress=io.StringIO())  # fmt: skip
    metadata = json.loads((tmp_path / "asked" / "metadata.json").read_text())
    assert metadata["settings"]["thermal_start"] is None  # an asked temperature is kept
    moving = atoms.copy()
    moving.set_velocities(np.full((len(atoms), 3), 1e-3))
    fm.md(moving, steps=10, temperature_K=300.0, output=tmp_path / "moving", seed=1,
          progress=io.StringIO())  # fmt: skip
    metadata = json.loads((tmp_path / "moving" / "metadata.json").read_text())
    assert metadata["settings"]["thermal_start"] is None  # the structure's own velocities


@pytest.mark.slow
def test_a_crystal_from_rest_reaches_its_temperature_in_a_short_default_run():
    """Four copies of a perfect copper crystal, 300 steps of 1 fs at 300 K with Langevin's
    default friction: the second half's mean is within 12 % of the target (drawn at 300 K,
    equipartition left about 225 K: measured 225 +- 7 K over 16 copies and 1,000 steps). One
    copy's mean scatters by about 30 K, so four give the target within about 15 K (seed 5:
    301 K; seed 6: 313 K), and a start without the doubling fails (seed 5: 179 K)."""
    result = fm.md(crystal(), steps=300, temperature_K=300.0, replicas=4, thermo_every=10,
                   seed=5, device="cpu", progress=io.StringIO())  # fmt: skip
    means = np.array(result.mean_temperature_K)
    assert len(means) == 4 and result.mean_from_step == 150
    assert abs(means.mean() - 300.0) < 0.12 * 300.0, means


def test_the_second_half_mean_counts_the_rows_from_the_middle_of_the_run():
    mean = SecondHalfMean(total_steps=9)  # from step 5 (the middle, rounded up)
    mean.add([{"step": 4, "system": 0, "temperature_K": 1000.0}])
    mean.add([{"step": 5, "system": 0, "temperature_K": 290.0},
              {"step": 5, "system": 1, "temperature_K": 100.0}])  # fmt: skip
    mean.add([{"step": 9, "system": 0, "temperature_K": 310.0},
              {"step": 9, "system": 1, "temperature_K": 200.0}])  # fmt: skip
    assert mean.from_step == 5 and mean.means() == [300.0, 150.0]
    resumed = SecondHalfMean(total_steps=100, start_step=80)  # only what this process saw
    assert resumed.from_step == 80
    assert SecondHalfMean(total_steps=10).means() == []


def test_the_summary_and_report_give_the_mean(demo):
    result = fm.md(crystal(), steps=20, temperature_K=300.0, thermo_every=5, seed=2,
                   progress=io.StringIO())  # fmt: skip
    assert result.mean_from_step == 10 and len(result.mean_temperature_K) == 1
    assert f"mean T from step 10 = {result.mean_temperature_K[0]:.1f} K" in result.summary()
    assert f"(mean from step 10: {result.mean_temperature_K[0]:.1f} K)" in result.report
