"""How far the BF16 tier's forces, energies and stresses are from float64, beside float32's.

For each model (the shipped demo model and templates of each block type, random weights,
seed 0) and a rattled structure of its elements: FastMACE's potential in float32 with
``matmul_precision="float32"`` and ``"bf16"``, against the same weights in float64 (mace-torch's
e3nn model, which FastMACE's float64 potential reproduces to 1e-12). On the CPU the BF16 tier
computes the products of BF16-rounded factors in float32, the numbers a GPU's BF16 tensor
cores give up to the order of the sums (dynamics/reduced_matmul.py).

    python tools/validation/bf16_accuracy.py --out docs/validation/bf16-accuracy.json

Prints one line per model and precision; the JSON holds the same figures.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import ase
import numpy as np
import torch
from ase.build import bulk

from fastmace.dynamics.neighbours import NeighbourList
from fastmace.dynamics.potential import Potential
from fastmace.dynamics.state import State
from fastmace.models import backends
from fastmace.models.load import load
from fastmace.models.templates import template

TEMPLATES = ("tiny", "mp0-small", "mp0-medium", "mp0-large", "mh-1", "off23-medium")


def structure_for(model: torch.nn.Module, seed: int = 0) -> ase.Atoms:
    """Rock salt (NaCl where the model has both, else copper oxide or its first two elements;
    fcc copper for a one-element model), 64 atoms, rattled by 0.1 Å so that no force vanishes
    by symmetry."""
    numbers = [int(z) for z in model.atomic_numbers]
    if len(numbers) == 1:
        atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 2, 4))
        atoms.numbers[:] = numbers[0]
    else:
        pair = next(
            (pair for pair in ((11, 17), (29, 8)) if set(pair) <= set(numbers)), numbers[:2]
        )
        atoms = bulk("NaCl", "rocksalt", a=5.0, cubic=True).repeat(2)
        atoms.numbers = np.where(atoms.numbers == 11, pair[0], pair[1])
    atoms.rattle(0.1, seed=seed)
    return atoms


def evaluate(model: torch.nn.Module, atoms: ase.Atoms, precision: str) -> dict[str, np.ndarray]:
    state = State.from_atoms(atoms, device=next(model.parameters()).device)
    heads = list(getattr(model, "heads", None) or [None])
    head = "omat_pbe" if "omat_pbe" in heads else heads[0]  # MH-1's, as the benchmarks
    potential = Potential(model, state.atomic_numbers, head, matmul_precision=precision)
    neighbours = NeighbourList(state, potential.r_max, 0.0)
    edges = neighbours.cutoff_edges(state, neighbours.build(state))
    out = potential(state, edges, compute_stress=True)
    return {
        "energy": out.energy.detach().double().cpu().numpy().sum(),
        "forces": out.forces.detach().double().cpu().numpy(),
        "stress": out.stress[0].detach().double().cpu().numpy(),
        "layers": len(potential.bf16_layers),
    }


def errors(got: dict, want: dict, atoms: int) -> dict[str, float]:
    force_error = np.abs(got["forces"] - want["forces"])
    largest = float(np.abs(want["forces"]).max())
    return {
        "force_max_eV_per_A": float(force_error.max()),
        "force_rms_eV_per_A": float(np.sqrt(np.mean(force_error**2))),
        "force_max_relative": float(force_error.max()) / largest,
        "largest_force_eV_per_A": largest,
        "energy_per_atom_eV": abs(float(got["energy"] - want["energy"])) / atoms,
        "stress_max_eV_per_A3": float(np.abs(got["stress"] - want["stress"]).max()),
        "largest_stress_eV_per_A3": float(np.abs(want["stress"]).max()),
        "bf16_layers": got["layers"],
    }


def describe(case: dict) -> str:
    return (
        f"{case['model']:13s} {case['backend']:5s} {case['precision']:8s} forces max "
        f"{case['force_max_eV_per_A']:.2e} eV/A ({case['force_max_relative']:.1e} of "
        f"{case['largest_force_eV_per_A']:.2f}), rms {case['force_rms_eV_per_A']:.2e}; energy "
        f"{case['energy_per_atom_eV']:.1e} eV/atom; stress {case['stress_max_eV_per_A3']:.1e} "
        f"eV/A^3 ({case['bf16_layers']} BF16 layers)"
    )


def models(
    names: list[str], device: str
) -> list[tuple[str, str, torch.nn.Module, torch.nn.Module]]:
    """(name, backend, float32 model, float64 e3nn model) for each requested name ("tiny",
    or "tiny@cueq" for the model converted to cuEquivariance)."""
    found = []
    for name in names:
        if name == "demo":
            low = load("demo-emt-cu", dtype="float32", device=device, backend="e3nn").module
            high = load("demo-emt-cu", dtype="float64", device=device, backend="e3nn").module
            found.append((name, "e3nn", low, high))
            continue
        backend = "e3nn"
        if name.endswith("@cueq"):
            name, backend = name.removesuffix("@cueq"), "cueq"
        low = template(name, seed=0, dtype=torch.float32)
        high = copy.deepcopy(low).to(device=device, dtype=torch.float64)  # the same weights
        low = backends.convert(low.to(device), backend, device) if backend != "e3nn" else low
        found.append((name, backend, low.to(device), high))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="demo,tiny,tiny@cueq,mp0-small,mp0-medium,mh-1,"
                        "off23-medium")  # fmt: skip
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=None)
    arguments = parser.parse_args(argv)
    cases = []
    for name, backend, low, high in models(arguments.models.split(","), arguments.device):
        atoms = structure_for(high)
        reference = evaluate(high, atoms, "float32")  # a float64 model: its own dtype
        for precision in ("float32", "bf16"):
            tick = time.perf_counter()
            figures = errors(evaluate(low, atoms, precision), reference, len(atoms))
            case = {"model": name, "backend": backend, "atoms": len(atoms),
                    "formula": atoms.get_chemical_formula(), "precision": precision,
                    "seconds": time.perf_counter() - tick, **figures}  # fmt: skip
            cases.append(case)
            print(describe(case), flush=True)
    if arguments.out is not None:
        device = arguments.device
        if device.startswith("cuda"):
            device = torch.cuda.get_device_name()
        document = {"torch": torch.__version__, "device": device, "cases": cases}
        arguments.out.write_text(json.dumps(document, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
