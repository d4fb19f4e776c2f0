"""Each ensemble is described once (fastmace.ensemble_catalog), and everything that speaks of
ensembles follows the descriptions: the integrators, preflight, the schedules, replica
exchange, the CLI, a run config, the docs. A toy ensemble registered here is accepted by all
of them, as a real one added to the catalog would be."""

from __future__ import annotations

import argparse
import inspect
from pathlib import Path

import ase.build
import pytest
import torch

import fastmace as fm
from fastmace.cli.md import add_parsers, per_system_keys, read_config
from fastmace.dynamics.ensembles import ensemble
from fastmace.dynamics.integrators import (
    Barostatted,
    Thermostatted,
    langevin_init,
    maxwell_boltzmann_velocities,
)
from fastmace.dynamics.integrators.langevin import langevin_step
from fastmace.dynamics.state import ForceResult, State
from fastmace.ensemble_catalog import (
    BUILT_IN,
    TEMPERATURE,
    EnsembleDescriptor,
    EnsembleError,
    Setting,
    descriptor,
    docs_table,
    ensemble_names,
    exchanging,
    offering,
    register_ensemble,
    registered,
    setting_names,
)
from fastmace.preflight.ensemble import check_exchange, check_settings
from fastmace.preflight.values import RequestError
from fastmace.protocol import TemperatureSchedule

DOCS = Path(__file__).resolve().parents[3] / "docs"


def spring(state: State) -> ForceResult:
    """Each atom tied to where it started the test: a potential with a stress, and no model."""
    displacement = state.positions - spring.origin
    energy = torch.zeros(state.n_systems, dtype=state.positions.dtype)
    energy.index_add_(0, state.system, 0.5 * (displacement**2).sum(dim=1))
    stress = torch.zeros(state.n_systems, 3, 3, dtype=state.positions.dtype)
    return ForceResult(energy=energy, forces=-displacement, stress=stress)


def copper(repeat: int = 2) -> ase.Atoms:
    atoms = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat((repeat,) * 3)
    atoms.rattle(0.02, seed=1)
    return atoms


def sensible_settings(known: EnsembleDescriptor) -> dict[str, object]:
    """A value for each setting that is in bounds: its default, else a plain target."""
    chosen: dict[str, object] = {"temperature_K": 300.0, "pressure_GPa": 0.0}
    values = {**chosen, **known.defaults()}
    return {name: values[name] for name in known.setting_names if name in values}


@pytest.mark.parametrize("known", BUILT_IN, ids=lambda known: known.name)
def test_each_description_is_what_its_integrator_takes_and_holds(known):
    """The init takes every setting by name, with the described default, and ``rng`` exactly
    when stochastic; the state it makes holds the tensors of the described targets."""
    bound = ensemble(known.name, **sensible_settings(known))
    init = inspect.signature(_resolved(known.init)).parameters
    for setting in known.settings:
        assert setting.name in init, setting.name
        if setting.default is not None:
            assert init[setting.name].default == setting.default, setting.name
    assert ("rng" in init) == known.stochastic
    state = maxwell_boltzmann_velocities(State.from_atoms([copper()]), 300.0, 0)
    spring.origin = state.positions.clone()
    md = bound.init(state, spring, timestep_fs=1.0, rng=0)
    assert isinstance(md, Thermostatted) == known.thermostat
    assert isinstance(md, Barostatted) == known.barostat
    md = bound.step(md, spring)
    assert torch.isfinite(md.state.positions).all()
    # Preflight passes the same values, and refuses a value out of each numeric bound.
    assert check_settings(known.name, sensible_settings(known), timestep_fs=1.0) == known.name
    for setting in known.settings:
        if setting.numeric and (setting.lower is not None or setting.at_least_timestep):
            below = (setting.lower if setting.lower is not None else 1.0) - 1.0
            with pytest.raises(RequestError, match=setting.name):
                check_settings(known.name, {**sensible_settings(known), setting.name: below}, 1.0)


def _resolved(reference):
    from fastmace.dynamics.ensembles import _function

    return _function(reference)


def test_the_docs_table_is_the_catalogs():
    """docs/md.md's "Ensembles and units" table is docs_table(), so it cannot drift."""
    assert docs_table() in (DOCS / "md.md").read_text()


def test_what_each_entry_point_offers_comes_from_the_descriptions():
    assert offering("temperature") == ("nvt-langevin", "nvt-csvr", "npt")
    assert offering("pressure") == ("npt",)
    assert exchanging() == ("nvt-langevin", "nvt-csvr", "nvt-nose-hoover")
    assert descriptor("NHC").name == "nvt-nose-hoover"
    with pytest.raises(EnsembleError, match="unknown ensemble 'nvq'; choose one of: nve, "):
        descriptor("nvq")
    assert set(per_system_keys()) == {
        "temperature_K", "friction_per_ps", "tau_fs", "pressure_GPa", "pressure_bar",
        "thermostat_tau_fs", "barostat_tau_fs", "compressibility_per_GPa", "charge", "spin",
    }  # fmt: skip


def test_a_description_that_contradicts_itself_is_refused():
    with pytest.raises(ValueError, match="a thermostat takes temperature_K"):
        EnsembleDescriptor("nvt-x", "x", "m:f", "m:g", (), targets=("temperature",))
    with pytest.raises(ValueError, match="only a target it holds"):
        EnsembleDescriptor("nve-x", "x", "m:f", "m:g", (), schedules=("temperature",))
    with pytest.raises(ValueError, match="nvt-y: nvt already names one"):
        register_ensemble(EnsembleDescriptor("nvt-y", "y", "m:f", "m:g", aliases=("nvt",)))
    assert "nvt-y" not in ensemble_names()


# -- a toy ensemble, registered, accepted everywhere --------------------------------------------


def toy_init(state, compute, timestep_fs, temperature_K, damping_per_ps=2.0, rng=None):
    """Langevin under another name, with a setting of its own."""
    return langevin_init(
        state, compute, timestep_fs=timestep_fs, temperature_K=temperature_K,
        friction_per_ps=damping_per_ps, rng=rng,
    )  # fmt: skip


DAMPING = Setting(
    "damping_per_ps", "the toy's damping in 1/ps", "1/ps", 2.0, lower=0.0, flag="--damping"
)
TOY = EnsembleDescriptor(
    "nvt-toy", "Langevin, renamed (a test's)", toy_init, langevin_step, (TEMPERATURE, DAMPING),
    aliases=("toy",), stochastic=True, targets=("temperature",), schedules=("temperature",),
)  # fmt: skip


def test_a_registered_ensemble_is_accepted_everywhere(tmp_path):
    with registered(TOY):
        assert "damping_per_ps" in setting_names() and "toy" in ensemble_names(aliases=True)
        # Preflight: its bound, and replica exchange on its thermostat.
        with pytest.raises(RequestError, match=r"damping_per_ps=-1 1/ps is not allowed"):
            check_settings("toy", {"temperature_K": 300.0, "damping_per_ps": -1.0}, 1.0)
        check_exchange("nvt-toy", {"temperature_K": [300.0, 400.0]}, [copper()] * 2, 5)
        TemperatureSchedule(((0, 300.0), (10, 400.0))).check_ensemble("toy")
        # The command line: --ensemble toy and a flag of its own.
        parser = argparse.ArgumentParser()
        add_parsers(parser.add_subparsers())
        args = parser.parse_args(["md", "cu.xyz", "--ensemble", "toy", "--damping", "3,4"])
        assert args.damping_per_ps == [3.0, 4.0]
        # A run config: a top-level key, and a key of each [[systems]] table.
        copper().write(tmp_path / "cu.xyz")
        config = tmp_path / "run.toml"
        config.write_text(
            'ensemble = "toy"\ntemperature_K = 300\n[[systems]]\nstructure = "cu.xyz"\n'
            'damping_per_ps = 3.0\n[[systems]]\nstructure = "cu.xyz"\ndamping_per_ps = 5.0\n'
        )
        assert read_config(config)["damping_per_ps"] == [3.0, 5.0]
        assert "`nvt-toy`, `toy` | Langevin, renamed (a test's) |" in docs_table()
        # fm.md runs it, following a temperature schedule, and says what ran.
        result = fm.md(
            copper(), model="demo-emt-cu", ensemble="toy", damping_per_ps=3.0, steps=10,
            temperature_schedule=[(0, 300.0), (10, 350.0)], output=tmp_path / "run",
        )  # fmt: skip
        assert result.steps == 10
        assert "nvt-toy (" in result.report and "damping_per_ps=3.0" in result.report
    assert "nvt-toy" not in ensemble_names()
    with pytest.raises(EnsembleError, match="unknown ensemble 'toy'"):
        descriptor("toy")
