"""Replica exchange's swap move: it keeps every rung canonical (detailed balance, tested on a
toy whose canonical distribution is known exactly), and its bookkeeping is consistent."""

from __future__ import annotations

import math

import pytest
import torch

from fastmace.dynamics.replica_exchange import ReplicaExchange, geometric_ladder

# A toy system: d harmonic degrees of freedom, whose potential energy at temperature kT is
# Gamma(d / 2, kT) distributed (mean d kT / 2, variance d kT^2 / 2).
DOF = 6
LADDER = torch.tensor(geometric_ladder(0.5, 1.5, 4), dtype=torch.float64)


def canonical_energies(kT: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    shape = torch.full_like(kT, DOF / 2)
    return torch._standard_gamma(shape, generator=generator) * kT


@pytest.mark.parametrize("rounds", [20_000])
def test_swaps_keep_each_rung_canonical(rounds):
    # Start every round in equilibrium (each walker's energy drawn at its rung's temperature),
    # swap once, and collect the energy found at each rung afterwards: it must still follow
    # that rung's canonical distribution. Always swapping would move each rung's mean to its
    # neighbour's, far outside the bounds; that is checked too, so the test can fail.
    draws = torch.Generator().manual_seed(1)
    exchange = ReplicaExchange.start(LADDER.clone(), torch.Generator().manual_seed(2))
    after = torch.zeros(rounds, LADDER.shape[0], dtype=torch.float64)
    forced = torch.zeros_like(after)
    for index in range(rounds):
        energy = canonical_energies(LADDER[exchange.rung], draws)
        before_walkers = exchange.walkers()
        exchange.exchange(energy)
        after[index] = energy[exchange.walkers()]
        swapped = before_walkers.clone()  # every tried pair swapped, whatever the energies
        tried = torch.arange(LADDER.shape[0] - 1) % 2 == (1 - exchange.parity)
        for t in torch.nonzero(tried).flatten().tolist():
            swapped[t], swapped[t + 1] = before_walkers[t + 1], before_walkers[t]
        forced[index] = energy[swapped]
    mean = DOF / 2 * LADDER
    error = LADDER * math.sqrt(DOF / 2) / math.sqrt(rounds)  # standard error of the mean
    assert torch.all((after.mean(dim=0) - mean).abs() < 4 * error), (after.mean(0), mean)
    variance = DOF / 2 * LADDER**2
    assert torch.allclose(after.var(dim=0), variance, rtol=0.05)
    assert torch.any((forced.mean(dim=0) - mean).abs() > 10 * error)
    rate = exchange.accepted.double() / exchange.attempts.double()
    assert torch.all((rate > 0.2) & (rate < 0.95)), rate


def test_bookkeeping_rungs_stay_a_permutation_and_pairs_alternate():
    exchange = ReplicaExchange.start(LADDER.clone(), torch.Generator().manual_seed(3))
    generator = torch.Generator().manual_seed(4)
    for round_ in range(50):
        kT_before = LADDER[exchange.rung]
        velocity_scale = exchange.exchange(canonical_energies(kT_before, generator))
        assert sorted(exchange.rung.tolist()) == list(range(LADDER.shape[0]))
        kT_after = LADDER[exchange.rung]
        torch.testing.assert_close(velocity_scale, torch.sqrt(kT_after / kT_before))
        assert int(exchange.parity) == (round_ + 1) % 2
    # Each pair was tried in every other round.
    assert exchange.attempts.tolist() == [25, 25, 25]


def test_ladders_are_checked():
    with pytest.raises(ValueError, match="ascending"):
        ReplicaExchange.start(torch.tensor([1.0, 0.5], dtype=torch.float64), torch.Generator())
    with pytest.raises(ValueError, match="at least two"):
        ReplicaExchange.start(torch.tensor([1.0], dtype=torch.float64), torch.Generator())
    ladder = geometric_ladder(300.0, 1200.0, 3)
    assert ladder == pytest.approx([300.0, 600.0, 1200.0])


def test_fm_md_runs_replica_exchange_between_replicas():
    import ase.build

    import fastmace as fm

    atoms = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 2, 2))
    ladder = fm.geometric_ladder(300.0, 420.0, 4)
    result = fm.md(
        atoms, model="demo-emt-cu", ensemble="nvt-csvr", temperature_K=ladder, replicas=4,
        exchange_every=5, steps=100, thermo_every=50, seed=3,
    )  # fmt: skip
    assert len(result.structures) == 4
    line = next(line for line in result.report.splitlines() if line.startswith("exchange:"))
    rates = [float(rate) for rate in line.split("pair ")[1].split(" (")[0].split(", ")]
    assert len(rates) == 3 and all(0.0 < rate <= 1.0 for rate in rates), line
    with pytest.raises(ValueError, match="lowest first"):
        fm.md(atoms, model="demo-emt-cu", temperature_K=ladder[::-1], replicas=4,
              exchange_every=5, steps=5)  # fmt: skip
    with pytest.raises(ValueError, match="copies of one structure"):
        fm.md([atoms, atoms[:16]], model="demo-emt-cu", temperature_K=[300, 400],
              exchange_every=5, steps=5)  # fmt: skip


def test_a_resumed_exchange_run_continues_exactly(tmp_path):
    """Killed at step 20 (its restart) and resumed to 40: the same rungs, acceptances,
    final structures and files as one run of 40 steps; the thermo log names each walker's
    rung, and the trajectory by temperature holds at system r the walker at rung r."""
    import csv

    import ase.build
    import ase.io
    import numpy as np
    from conftest import same_trajectory_atol_A

    import fastmace as fm

    atoms = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 2, 2))
    common = dict(
        model="demo-emt-cu", ensemble="nvt", temperature_K=fm.geometric_ladder(300, 500, 4),
        replicas=4, exchange_every=5, thermo_every=5, restart_every=20, trajectory_every=10,
        seed=11,
    )  # fmt: skip
    whole = fm.md(atoms, steps=40, output=tmp_path / "whole", **common)
    fm.md(atoms, steps=20, output=tmp_path / "pieces", **common)
    resumed = fm.md(atoms, steps=40, output=tmp_path / "pieces", resume=True, **common)

    def exchange_line(result):
        return next(line for line in result.report.splitlines() if line.startswith("exchange:"))

    assert exchange_line(resumed) == exchange_line(whole)
    # metadata.json: the ladder, each walker's rung and the statistics, against its schema.
    import json

    import jsonschema

    from fastmace.provenance import SCHEMA

    document = json.loads((tmp_path / "pieces" / "metadata.json").read_text())
    jsonschema.validate(document, json.loads(SCHEMA.read_text()))
    record = document["engine"]["exchange"]
    assert record["every"] == 5 and record["ladder_K"] == pytest.approx(common["temperature_K"])
    assert sorted(record["rung_of_walker"]) == [0, 1, 2, 3]
    assert sum(record["attempts"]) == 12  # 8 exchanges: 2, 1, 2, 1, ... pairs tried
    assert exchange_line(whole).endswith(f"({sum(record['attempts'])} tried)")
    for one, other in zip(whole.structures, resumed.structures, strict=True):
        np.testing.assert_allclose(
            one.positions, other.positions, rtol=0, atol=same_trajectory_atol_A()
        )
    logs = [
        list(csv.DictReader((tmp_path / run / "thermo.csv").open())) for run in ("whole", "pieces")
    ]
    for log in logs:
        for row in log:
            del row["ns_per_day"]  # the speed of the moment: differs between any two runs
    assert [row["rung"] for row in logs[0]] == [row["rung"] for row in logs[1]]
    on_cpu = same_trajectory_atol_A() < 1e-8
    for one, other in zip(*logs, strict=True):
        assert one.keys() == other.keys()
        for key in one:  # equal as text on the CPU; to rounding on a GPU
            if one[key] != other[key]:  # float32 model energies on the H200: 4.8e-7 eV apart
                assert not on_cpu, (key, one[key], other[key])
                assert float(one[key]) == pytest.approx(float(other[key]), rel=1e-5, abs=1e-5)
    rungs = [int(row["rung"]) for row in logs[0]]
    for output in range(0, len(rungs), 4):  # a permutation of the ladder at every output
        assert sorted(rungs[output : output + 4]) == [0, 1, 2, 3]
    assert rungs[-4:] != [0, 1, 2, 3]  # and walkers did move along it
    # The trajectory by temperature: at each frame, its system r is the walker at rung r.
    for run in ("whole", "pieces"):
        walkers = ase.io.read(tmp_path / run / "trajectory.extxyz", ":")
        by_rung = ase.io.read(tmp_path / run / "trajectory-by-temperature.extxyz", ":")
        assert [f.info["step"] for f in by_rung] == [f.info["step"] for f in walkers]
        assert [f.info["step"] for f in walkers][::4] == [0, 10, 20, 30, 40]
        rung_of = {(int(row["step"]), int(row["system"])): int(row["rung"]) for row in logs[0]}
        for frame in walkers:
            rung = rung_of[(frame.info["step"], frame.info["system"])]
            same = next(
                f
                for f in by_rung
                if f.info["step"] == frame.info["step"] and f.info["system"] == rung
            )
            np.testing.assert_array_equal(same.positions, frame.positions)  # one run's frames
            assert same.get_potential_energy() == frame.get_potential_energy()


def test_a_block_redone_after_a_regrowth_exchanges_once(demo):
    """A list far too small overflows in the first block, which is redone with a larger one:
    its exchange (at the block's end, part of the block) must happen once, as without it."""
    import numpy as np
    from conftest import copper, settings

    from fastmace.dynamics.ensembles import ensemble
    from fastmace.dynamics.neighbours import NeighbourList
    from fastmace.simulation import Simulation

    def simulation(tiny_list: bool) -> Simulation:
        ladder = geometric_ladder(300.0, 500.0, 4)
        run = Simulation(
            demo, [copper()] * 4,
            settings(20, ensemble=ensemble("nvt", temperature_K=ladder, friction_per_ps=5.0),
                     exchange_every=5),
            None,
        )  # fmt: skip
        if tiny_list:
            state = run.engine.md.state
            tiny = NeighbourList(state, run.potential.r_max, 0.5, 8)
            run.engine.force_field.neighbours = tiny
            run.engine.force_field.edges = tiny.build(state)
        run.run()
        return run

    roomy, tight = simulation(False), simulation(True)
    assert roomy.engine.regrowths == 0 and tight.engine.regrowths >= 1
    for name in ("rung", "attempts", "accepted", "parity", "steps_since"):
        assert getattr(tight.exchange, name).tolist() == getattr(roomy.exchange, name).tolist()
    assert roomy.exchange.attempts.sum() == 6  # four exchanges: 2, 1, 2 and 1 pairs tried
    np.testing.assert_allclose(
        tight.engine.md.state.positions, roomy.engine.md.state.positions, atol=1e-10
    )


def test_the_command_line_takes_a_ladder_or_one_temperature_per_replica(clean_env, tmp_path):
    from conftest import EXAMPLE, run_fastmace

    common = ["md", str(EXAMPLE), "--model", "demo-emt-cu", "--ensemble", "nvt-csvr",
              "--replicas", "3", "--exchange-every", "5", "--steps", "10"]  # fmt: skip
    ladder = run_fastmace([*common, "--ladder", "300,432", "-o", str(tmp_path / "a")], clean_env)
    assert ladder.returncode == 0, ladder.stderr
    assert "nvt-csvr at 300/360/432 K" in ladder.stdout
    assert "exchange:  every 5 steps" in ladder.stdout
    listed = run_fastmace(
        [*common, "--temperature", "300,360,432", "-o", str(tmp_path / "b")], clean_env
    )
    assert listed.returncode == 0, listed.stderr
    assert "nvt-csvr at 300/360/432 K" in listed.stdout
    both = run_fastmace([*common, "--ladder", "300,432", "--temperature", "300"], clean_env)
    assert both.returncode != 0 and "give --ladder or --temperature, not both" in both.stderr
    alone = run_fastmace(["md", str(EXAMPLE), "--model", "demo-emt-cu", "--ladder", "300,400"],
                         clean_env)  # fmt: skip
    assert alone.returncode != 0 and "--ladder needs --replicas 2 or more" in alone.stderr
