"""Template models built once per process, and the potential's agreement checks against
mace-torch (100 machine epsilons of the quantity's scale) and between two of its own results
(4 epsilons: what "the same result" means for padding)."""

from __future__ import annotations

from collections.abc import Sequence

import ase
import numpy as np
import torch

from fastmace.dynamics.potential import Potential
from fastmace.dynamics.state import PotentialOutput, State
from fastmace.models.reference import evaluate
from fastmace.models.templates import template
from helpers.structures import ase_edges

_MODELS: dict[tuple[str, torch.dtype], torch.nn.Module] = {}


def model_of(name: str, dtype: torch.dtype) -> torch.nn.Module:
    """A template model, built once per test session."""
    if (name, dtype) not in _MODELS:
        _MODELS[name, dtype] = template(name, seed=0, dtype=dtype)
    return _MODELS[name, dtype]


def run(potential: Potential, structures: Sequence[ase.Atoms], factor: float = 1.5, **kwargs):
    state = State.from_atoms(list(structures))
    return state, potential(state, ase_edges(state, potential.r_max, factor), **kwargs)


def scale_tolerance(dtype: torch.dtype, scale: float, epsilons: float = 100) -> float:
    return epsilons * torch.finfo(dtype).eps * scale


def assert_matches_reference(
    model: torch.nn.Module,
    structures: Sequence[ase.Atoms],
    output: PotentialOutput,
    state: State,
    head: str | None = None,
    epsilons: float = 100,
) -> None:
    """Each system of ``output`` equals mace-torch's result for it alone, to ``epsilons``
    machine epsilons of each quantity's scale."""
    dtype = next(model.parameters()).dtype
    for index, atoms in enumerate(structures):
        expected = evaluate(model, atoms, head=head)
        rows = (state.system == index).numpy()
        energy = float(output.energy[index])
        forces = output.forces.numpy()[rows]
        assert abs(energy - expected.energy) <= scale_tolerance(
            dtype, max(abs(expected.energy), len(atoms))
        ), (index, energy, expected.energy)
        np.testing.assert_allclose(
            forces,
            expected.forces,
            rtol=0,
            atol=scale_tolerance(dtype, max(np.abs(expected.forces).max(), 1.0), epsilons),
        )
        stress = output.stress[index].numpy()
        if expected.stress is None:  # no cell: mace-torch gives no stress, we give zero
            assert not atoms.pbc.any() and not stress.any()
        else:
            np.testing.assert_allclose(
                stress,
                expected.stress,
                rtol=0,
                atol=scale_tolerance(dtype, max(np.abs(expected.stress).max(), 0.01), epsilons),
            )


def assert_same(
    first: PotentialOutput, second: PotentialOutput, dtype: torch.dtype, epsilons: float = 4
) -> None:
    """Equal to ``epsilons`` (4: what "the same result" means for padding) of the scale."""
    for name, floor in (("energy", float(first.forces.shape[0])), ("forces", 1.0)):
        a, b = getattr(first, name), getattr(second, name)
        scale = max(float(a.abs().max()), floor)
        assert float((a - b).abs().max()) <= scale_tolerance(dtype, scale, epsilons), name
    if first.stress is not None:
        scale = max(float(first.stress.abs().max()), 0.01)
        error = float((first.stress - second.stress).abs().max())
        assert error <= scale_tolerance(dtype, scale, epsilons), "stress"


def on_cpu(output: PotentialOutput) -> PotentialOutput:
    return PotentialOutput(*(None if t is None else t.to("cpu") for t in vars(output).values()))
