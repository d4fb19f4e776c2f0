"""Thermodynamic observables of a batch, computed on the host once per output step."""

from __future__ import annotations

from collections.abc import Callable

import torch

from fastmace.dynamics.integrators import MDState
from fastmace.dynamics.integrators.common import cell_volume, kinetic_tensor
from fastmace.dynamics.state import State
from fastmace.vocabulary import EV_PER_A3_IN_GPA


def thermo_rows(
    md: MDState, stress_at: Callable[[State], torch.Tensor], step: int, time_fs: float
) -> list[dict[str, float | int | None]]:
    """One thermo row per system at ``md``.

    The pressure needs the stress, which the integrators only compute under a barostat: for
    the others it is evaluated here by ``stress_at`` (the force field's: every energy term's),
    once per output step, outside the captured block. It is
    the virial pressure ``(tr(sum m v v^T) - tr(stress) V) / 3V`` of periodic systems (ASE's sign
    convention for the stress); other systems get no pressure or volume.
    """
    state = md.state
    stress = md.stress
    if stress is None:
        stress = stress_at(state)
    periodic = state.pbc.all(dim=1)
    volume = cell_volume(state.cell)
    kinetic = kinetic_tensor(state).diagonal(dim1=1, dim2=2).sum(dim=1)
    safe_volume = torch.where(periodic, volume, torch.ones_like(volume))
    pressure = (kinetic - stress.diagonal(dim1=1, dim2=2).sum(dim=1) * safe_volume) / (
        3.0 * safe_volume
    )
    conserved = getattr(md, "conserved_energy", None)
    columns = {
        "potential_energy_eV": md.energy,
        "kinetic_energy_eV": md.kinetic_energy(),
        "total_energy_eV": md.total_energy(),
        "temperature_K": md.temperature(),
        "pressure_GPa": pressure * EV_PER_A3_IN_GPA,
        "volume_A3": volume,
        "periodic": periodic.to(torch.float64),
    }
    if conserved is not None:
        columns["conserved_energy_eV"] = conserved()
    host = {
        name: values.detach().to("cpu", torch.float64).tolist() for name, values in columns.items()
    }
    rows = []
    for index in range(state.n_systems):
        row: dict[str, float | int | None] = {"step": step, "time_fs": time_fs}
        if state.n_systems > 1:
            row["system"] = index
        for name, values in host.items():
            if name != "periodic":
                row[name] = values[index]
        if not host["periodic"][index]:
            row["pressure_GPa"] = row["volume_A3"] = None
        rows.append(row)
    return rows
