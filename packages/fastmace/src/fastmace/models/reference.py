"""Evaluating a mace-torch model on an ASE structure the way mace-torch itself feeds it.

This is the reference path, not the hot path: it builds the graph with mace-torch's own data
pipeline (its neighbour list, its one-hot species encoding, its batching), so a result from
here is what mace-torch would compute. Conversion checks and the gate compare against it.
"""

from __future__ import annotations

from dataclasses import dataclass

import ase
import numpy as np
import torch

from fastmace.models.checkpoint import contained, import_mace, model_device, model_dtype
from fastmace.vocabulary import LONG_RANGE_MODEL_TYPES


@dataclass(frozen=True)
class Evaluation:
    """Energy (eV), forces (eV/Å, shape (N, 3)) and stress (eV/Å³, 3x3, or None)."""

    energy: float
    forces: np.ndarray
    stress: np.ndarray | None


def evaluate(
    model: torch.nn.Module, atoms: ase.Atoms, head: str | None = None, stress: bool = True
) -> Evaluation:
    """Energy, forces and (for periodic cells) stress of ``atoms`` with ``model``."""
    import_mace()
    from mace import data as mace_data
    from mace.tools import torch_geometric
    from mace.tools.utils import AtomicNumberTable

    heads = list(getattr(model, "heads", None) or ["Default"])
    head_name = head or heads[0]
    dtype = model_dtype(model)
    with contained():
        torch.set_default_dtype(dtype)  # mace's data pipeline builds tensors in the default dtype
        config = mace_data.config_from_atoms(
            atoms, key_specification=_key_specification(model), head_name=head_name
        )
        graph = mace_data.AtomicData.from_config(
            config,
            z_table=AtomicNumberTable([int(z) for z in model.atomic_numbers]),
            cutoff=float(model.r_max),
            heads=heads,
        )
        batch = torch_geometric.batch.Batch.from_data_list([graph]).to(model_device(model))
        want_stress = stress and bool(atoms.pbc.all())
        output = model(batch.to_dict(), compute_stress=want_stress, training=False)
    forces = output["forces"].detach().to("cpu", torch.float64).numpy()
    energy = float(output["energy"].detach().to("cpu", torch.float64).sum())
    stress_out = None
    if want_stress and output.get("stress") is not None:
        stress_out = output["stress"].detach().to("cpu", torch.float64).numpy().reshape(3, 3)
    return Evaluation(energy, forces, stress_out)


def _key_specification(model: torch.nn.Module) -> object:
    """What mace-torch's data pipeline reads from ``atoms.info``: for a long-range model the
    total charge and spin multiplicity, under the keys mace-torch's calculator reads them."""
    from mace.data import KeySpecification

    if type(model).__name__ not in LONG_RANGE_MODEL_TYPES:
        return KeySpecification()
    return KeySpecification(info_keys={"total_charge": "charge", "total_spin": "spin"})


def check_structure(atomic_numbers: tuple[int, ...], seed: int = 0) -> ase.Atoms:
    """A small periodic structure any model can evaluate: 12 atoms of up to 3 of its species.

    Positions are random but at least 1.9 Å apart, so every model sees ordinary bonds.
    """
    rng = np.random.default_rng(seed)
    species = sorted(set(atomic_numbers))[:3]
    length = 6.2
    positions: list[np.ndarray] = []
    while len(positions) < 12:
        trial = rng.uniform(0.0, length, size=3)
        deltas = [trial - p for p in positions]
        if all(np.linalg.norm(d - length * np.round(d / length)) > 1.9 for d in deltas):
            positions.append(trial)
    numbers = [species[i % len(species)] for i in range(12)]
    return ase.Atoms(numbers=numbers, positions=positions, cell=[length] * 3, pbc=True)
