"""Several devices: a request's systems spread over child processes, one per device, each
system as it would run in one batch.

On this machine the children run on the CPU (two processes, no device variables); on a
machine with several GPUs each child sees one (``CUDA_VISIBLE_DEVICES``), the only difference.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from conftest import copper

import fastmace as fm
from fastmace.runner import ChildStopped, RunnerConfig, RunnerError
from fastmace.spread import (
    DeviceSlot,
    SpreadError,
    balanced_parts,
    cuda_slots,
    part_arguments,
    run_spread,
)

COMMON = {"model": "demo-emt-cu", "temperature_K": 300.0, "seed": 5, "thermo_every": 10,
          "trajectory_every": 10, "restart_every": 10}  # fmt: skip


def cu32():
    """32 rattled copper atoms (conftest.copper)."""
    return copper((2, 2, 2))


def test_systems_are_cut_into_consecutive_parts_of_about_equal_atoms():
    assert balanced_parts([32, 32, 32, 32], 2) == [range(0, 2), range(2, 4)]
    assert balanced_parts([32, 32, 32, 32], 3) == [range(0, 1), range(1, 3), range(3, 4)]
    assert balanced_parts([100, 10, 10, 10, 10], 2) == [range(0, 1), range(1, 5)]
    assert balanced_parts([1, 1, 1, 100], 3) == [range(0, 2), range(2, 3), range(3, 4)]
    assert balanced_parts([5], 3) == [range(0, 1)]  # never more parts than systems


def test_each_child_sees_one_of_the_visible_devices():
    slots = cuda_slots("all", "2,3", 2)
    assert [slot.environment for slot in slots] == [
        {"CUDA_VISIBLE_DEVICES": "2"},
        {"CUDA_VISIBLE_DEVICES": "3"},
    ]
    assert [s.environment["CUDA_VISIBLE_DEVICES"] for s in cuda_slots(2, None, 4)] == ["0", "1"]
    with pytest.raises(SpreadError, match="asks for 3 GPUs, but this process sees 2"):
        cuda_slots(3, None, 2)
    with pytest.raises(SpreadError, match="sees none"):
        cuda_slots("all", None, 0)
    with pytest.raises(SpreadError, match="positive whole number or 'all'"):
        cuda_slots(0, None, 2)


def test_a_part_keeps_its_systems_settings_and_streams():
    arguments = {**COMMON, "temperature_K": [300.0, 310.0, 320.0, 330.0], "replicas": 4}
    chosen = part_arguments(arguments, range(2, 4), 4, None, resume=False)
    assert chosen["temperature_K"] == [320.0, 330.0]
    assert chosen["seed"] == 7 and chosen["replicas"] == 1 and chosen["gpus"] is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without")
def test_gpus_on_a_machine_without_cuda_says_so():
    with pytest.raises(SpreadError, match="sees none"):
        fm.md(cu32(), steps=2, gpus=2, **COMMON)


def test_a_spread_exchange_needs_one_temperature_per_replica():
    with pytest.raises(SpreadError, match="one value per replica"):
        run_spread({**COMMON, "exchange_every": 5}, [cu32()] * 2,
                   [DeviceSlot("a"), DeviceSlot("b")], RunnerConfig(), io.StringIO())  # fmt: skip


def test_a_ladder_spread_over_two_processes_exchanges_as_in_one(tmp_path):
    ladder = fm.geometric_ladder(300.0, 900.0, 4)
    settings = {**COMMON, "temperature_K": ladder, "exchange_every": 5, "steps": 20}
    together = fm.md(cu32(), replicas=4, **settings)
    slots = [DeviceSlot("CPU process 0"), DeviceSlot("CPU process 1")]
    arguments = {**settings, "device": "cpu", "output": str(tmp_path / "run")}
    # Stopped after 10 steps and resumed to 20: the ladder's state comes back on both.
    run_spread({**arguments, "steps": 10}, [cu32() for _ in range(4)], slots, RunnerConfig(),
               io.StringIO())  # fmt: skip
    spread = run_spread({**arguments, "resume": True}, [cu32() for _ in range(4)], slots,
                        RunnerConfig(), io.StringIO())  # fmt: skip
    rungs = [[(row["step"], row["system"], row["rung"]) for row in result.thermo
              if row["step"] == 20] for result in (together, spread)]  # fmt: skip
    assert rungs[0] == rungs[1]
    assert [rung for _, _, rung in rungs[0]] != [0, 1, 2, 3]  # walkers did change rungs
    for one, other in zip(together.structures, spread.structures, strict=True):
        np.testing.assert_allclose(one.positions, other.positions, rtol=0, atol=1e-9)
    assert not list((tmp_path / "run").glob(".exchange-rendezvous-*"))  # removed at the end


def test_spread_systems_follow_their_one_batch_trajectories_and_resume(tmp_path):
    together = fm.md(cu32(), replicas=4, steps=20, **COMMON)
    slots = [DeviceSlot("CPU process 0"), DeviceSlot("CPU process 1")]
    arguments = {**COMMON, "device": "cpu", "output": str(tmp_path / "run")}
    progress = io.StringIO()
    run_spread({**arguments, "steps": 10}, [cu32() for _ in range(4)], slots, RunnerConfig(),
               progress)  # fmt: skip
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        "devices.json",
        "gpu-0",
        "gpu-1",
    ]
    assert "[gpu-0] " in progress.getvalue() and "[gpu-1] " in progress.getvalue()
    resumed = run_spread({**arguments, "steps": 20, "resume": True}, [cu32() for _ in range(4)],
                         slots, RunnerConfig(), io.StringIO())  # fmt: skip
    assert resumed.report.startswith("The request ran on 2 GPUs at once: systems 0 to 1 on CPU")
    assert [row["system"] for row in resumed.thermo if row["step"] == 20] == [0, 1, 2, 3]
    for one, other in zip(together.structures, resumed.structures, strict=True):
        np.testing.assert_allclose(one.positions, other.positions, rtol=0, atol=1e-9)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_two_gpus_give_each_system_its_one_gpu_trajectory(tmp_path):
    from conftest import same_trajectory_atol_A

    ladder = fm.geometric_ladder(300.0, 900.0, 4)
    settings = {**COMMON, "temperature_K": ladder, "exchange_every": 5, "steps": 20}
    alone = fm.md(cu32(), replicas=4, device="cuda", **settings)
    spread = fm.md(cu32(), replicas=4, device="cuda", gpus=2, output=tmp_path / "run",
                   progress=io.StringIO(), **settings)  # fmt: skip
    assert spread.report.startswith("The request ran on 2 GPUs at once")
    assert [row["rung"] for row in alone.thermo if row["step"] == 20] == [
        row["rung"] for row in spread.thermo if row["step"] == 20
    ]
    for one, other in zip(alone.structures, spread.structures, strict=True):
        np.testing.assert_allclose(one.positions, other.positions, rtol=0,
                                   atol=same_trajectory_atol_A())  # fmt: skip


def test_a_ladder_part_that_fails_stops_the_others_at_once(tmp_path):
    """Part 1's child cannot start (a bad variable in its environment); part 0 would wait for
    it at the rendezvous for the group's ten minutes, and is stopped instead."""
    ladder = fm.geometric_ladder(300.0, 900.0, 4)
    settings = {**COMMON, "temperature_K": ladder, "exchange_every": 5, "steps": 20}
    slots = [DeviceSlot("CPU process 0"),
             DeviceSlot("CPU process 1", {"FASTMACE_SOFT_FILE_LOCKS": "maybe"})]  # fmt: skip
    progress = io.StringIO()
    arguments = {**settings, "device": "cpu", "output": str(tmp_path / "run")}
    with pytest.raises(RunnerError, match="FASTMACE_SOFT_FILE_LOCKS") as failed:
        run_spread(arguments, [cu32() for _ in range(4)], slots, RunnerConfig(), progress)
    assert not isinstance(failed.value, ChildStopped)  # the cause, not the part stopped for it
    assert "the part on CPU process 1 failed (1 other part(s)" in progress.getvalue()
