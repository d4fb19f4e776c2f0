"""Batches that fit: a request larger than one batch runs as several, each system as it would
in one batch."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import copper

import fastmace as fm
from fastmace.batching import BatchError, MemoryBudget, saved_parts, split_into_batches

COMMON = {"model": "demo-emt-cu", "temperature_K": 300.0, "steps": 20, "seed": 5,
          "thermo_every": 10, "trajectory_every": 10}  # fmt: skip


def cu32():
    """32 rattled copper atoms (conftest.copper)."""
    return copper((2, 2, 2))


def test_systems_are_cut_into_consecutive_whole_groups():
    assert split_into_batches([32, 32, 32, 32], 64) == [range(0, 2), range(2, 4)]
    assert split_into_batches([32, 40, 10, 32], 64) == [range(0, 1), range(1, 3), range(3, 4)]
    assert split_into_batches([32, 32], 1000) == [range(0, 2)]
    with pytest.raises(BatchError, match="system 1 has 70 atoms, more than one batch holds"):
        split_into_batches([32, 70], 64)


def test_a_request_in_batches_gives_each_system_its_one_batch_trajectory(tmp_path):
    together = fm.md(cu32(), replicas=4, **COMMON)
    apart = fm.md(
        cu32(), replicas=4, config=fm.EngineConfig(max_batch_atoms=64),
        output=tmp_path / "run", **COMMON,
    )  # fmt: skip
    assert len(apart.structures) == 4
    for one, other in zip(together.structures, apart.structures, strict=True):
        np.testing.assert_allclose(one.positions, other.positions, rtol=0, atol=1e-9)
    assert [row["system"] for row in apart.thermo] == [0, 1, 2, 3]
    assert apart.report.startswith("The request ran as 2 batches")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        "batch-001",
        "batch-002",
        "batches.json",
    ]
    for batch in ("batch-001", "batch-002"):
        assert (tmp_path / "run" / batch / "report.txt").is_file()


def test_replica_exchange_refuses_to_be_split():
    with pytest.raises(BatchError, match="replica exchange needs all 4 replicas in one batch"):
        fm.md(cu32(), replicas=4, exchange_every=5, config=fm.EngineConfig(max_batch_atoms=64),
              **{**COMMON, "temperature_K": fm.geometric_ladder(300, 400, 4)})  # fmt: skip


def test_a_batched_request_resumes_batch_by_batch(tmp_path):
    config = fm.EngineConfig(max_batch_atoms=64)
    common = {**COMMON, "restart_every": 10}
    whole = fm.md(cu32(), replicas=4, config=config, output=tmp_path / "whole", **common)
    fm.md(cu32(), replicas=4, config=config, output=tmp_path / "pieces",
          **{**common, "steps": 10})  # fmt: skip
    resumed = fm.md(cu32(), replicas=4, config=config, output=tmp_path / "pieces",
                    resume=True, **common)  # fmt: skip
    for one, other in zip(whole.structures, resumed.structures, strict=True):
        np.testing.assert_array_equal(one.positions, other.positions)


def test_the_memory_budget_sizes_batches_from_two_evaluations_in_the_share_free():
    mib = 2**20
    budget = MemoryBudget(per_atom_bytes=0.5 * mib, fixed_bytes=100 * mib, free_bytes=10_000 * mib)
    # 70 % of 10,000 MiB, less two fixed parts, over two evaluations of 0.5 MiB per atom.
    assert budget.max_atoms(216) == int((7_000 - 200) / 1.0)
    assert budget.max_atoms(10_000) == 10_000  # the largest structure always runs whole
    assert "0.500 MiB per atom" in budget.describe(216)


def test_a_resumed_request_keeps_the_batches_it_started_with(tmp_path):
    common = {**COMMON, "restart_every": 10}
    whole = fm.md(cu32(), replicas=4, config=fm.EngineConfig(max_batch_atoms=64),
                  output=tmp_path / "whole", **common)  # fmt: skip
    fm.md(cu32(), replicas=4, config=fm.EngineConfig(max_batch_atoms=64),
          output=tmp_path / "pieces", **{**common, "steps": 10})  # fmt: skip
    assert saved_parts(tmp_path / "pieces", 4) == [range(0, 2), range(2, 4)]
    # Resumed without the limit (as an automatically sized run would be, with other memory
    # free): the recorded cut holds.
    resumed = fm.md(cu32(), replicas=4, output=tmp_path / "pieces", resume=True, **common)
    assert resumed.report.startswith("The request ran as 2 batches")
    for one, other in zip(whole.structures, resumed.structures, strict=True):
        np.testing.assert_array_equal(one.positions, other.positions)
    with pytest.raises(BatchError, match="cuts 4 systems into batches, but this request has 3"):
        saved_parts(tmp_path / "pieces", 3)
