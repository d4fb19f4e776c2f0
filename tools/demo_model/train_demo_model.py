"""Train the small MACE model for copper that ships with FastMACE as its offline demo model.

The reference data come from ASE's EMT calculator, so nothing is downloaded. The script
generates Cu configurations (strained bulk cells, snapshots of EMT molecular dynamics from
100 K to 1200 K, single vacancies, (100) and (111) slabs), labels them with EMT energies,
forces and stresses, splits them 80/10/10 into training, validation and held-out test sets,
builds a small ``mace.modules.ScaleShiftMACE``, trains it in float64 with Adam and writes the
whole module with ``torch.save`` as released MACE checkpoints are written. It then prints the
held-out test errors. Everything is seeded, so a given ``--seed`` gives the same data, split
and model on the same software and thread count.

Run it from the repository root (about ten minutes on two CPU cores):

    python tools/demo_model/train_demo_model.py --seed 0

Options: ``--out DIR`` (default: packages/fastmace/src/fastmace/models/demo), ``--epochs N``
and ``--metrics FILE`` (also write the data counts and test errors as JSON).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from ase import Atoms, units
from ase.build import bulk, fcc100, fcc111
from ase.calculators.emt import EMT
from ase.md.langevin import Langevin
from ase.md.velocitydistribution import MaxwellBoltzmannDistribution
from mace import data as mace_data
from mace import modules
from mace.tools.torch_geometric.batch import Batch
from mace.tools.torch_geometric.dataloader import DataLoader
from mace.tools.utils import AtomicNumberTable

from fastmace.models.checkpoint import default_dtype

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO_ROOT / "packages" / "fastmace" / "src" / "fastmace" / "models" / "demo"
MODEL_FILE = "demo-emt-cu.model"

LATTICE = 3.61  # Å, the fcc Cu lattice constant used throughout
CU = 29
R_MAX = 5.0  # Å: between the third (4.42 Å) and fourth (5.11 Å) neighbour shells, past EMT's cutoff
TEMPERATURES = (100.0, 300.0, 600.0, 900.0, 1200.0)  # K
MD_STEP = 2.0 * units.fs
MD_FRICTION = 0.02 / units.fs  # strong coupling so that a short run reaches its temperature
EQUILIBRATION_STEPS = 150
EV_PER_A3_TO_GPA = 1.0 / units.GPa

# Keys under which the labels are stored; "REF_" keeps ASE from mistaking them for results.
KEYS = mace_data.KeySpecification(
    info_keys={"energy": "REF_energy", "stress": "REF_stress"},
    arrays_keys={"forces": "REF_forces"},
)

# Loss weights on (energy per atom in eV)^2, (force component in eV/Å)^2 and
# (stress component in eV/Å^3)^2. The energy weight rises for the last quarter of the epochs,
# as in mace-torch's second training stage, to pull down the per-atom energy offsets.
WEIGHTS_FIRST = {"energy": 10.0, "forces": 1.0, "stress": 100.0}
WEIGHTS_LAST = {"energy": 100.0, "forces": 1.0, "stress": 100.0}


# ----------------------------------------------------------------------------- data


def labelled(atoms: Atoms, kind: str) -> Atoms:
    """A clean copy of ``atoms`` with EMT energy, forces and stress attached as labels."""
    clean = Atoms(numbers=atoms.numbers, positions=atoms.positions, cell=atoms.cell, pbc=atoms.pbc)
    clean.calc = EMT()
    energy = clean.get_potential_energy()
    forces = clean.get_forces()
    stress = clean.get_stress(voigt=True)
    clean.calc = None
    clean.info = {"config_type": kind, "REF_energy": energy, "REF_stress": stress}
    clean.arrays["REF_forces"] = forces
    return clean


def strained(atoms: Atoms, strain: np.ndarray) -> Atoms:
    """``atoms`` with its cell (and the atoms with it) deformed by the symmetric ``strain``."""
    out = atoms.copy()
    out.set_cell(atoms.cell.array @ (np.eye(3) + strain).T, scale_atoms=True)
    return out


def isotropic(epsilon: float) -> np.ndarray:
    """The strain tensor of a uniform linear strain ``epsilon``."""
    return epsilon * np.eye(3)


def random_strain(rng: np.random.Generator, size: float) -> np.ndarray:
    """A random symmetric strain with normal and shear components up to ``size``."""
    a = rng.uniform(-size, size, (3, 3))
    return 0.5 * (a + a.T)


def md_snapshots(
    atoms: Atoms, temperature: float, count: int, interval: int, rng: np.random.Generator
) -> list[Atoms]:
    """``count`` snapshots, ``interval`` steps apart, of an EMT Langevin run at ``temperature``.

    Thermal displacements from real dynamics have the right correlations between neighbours,
    which random rattling lacks.
    """
    system = atoms.copy()
    system.calc = EMT()
    MaxwellBoltzmannDistribution(system, temperature_K=temperature, rng=rng)
    dynamics = Langevin(
        system,
        MD_STEP,
        temperature_K=temperature,
        friction=MD_FRICTION,
        fixcm=False,
        rng=rng,
    )
    dynamics.run(EQUILIBRATION_STEPS)
    snapshots = []
    for _ in range(count):
        dynamics.run(interval)
        snapshots.append(system.copy())
    return snapshots


def cubic_cell(repeat: int) -> Atoms:
    """The conventional fcc Cu cell repeated ``repeat`` times along each axis."""
    return bulk("Cu", "fcc", a=LATTICE, cubic=True) * (repeat, repeat, repeat)


def slab(surface: str) -> Atoms:
    """A 2x2, six-layer Cu slab with 6 Å of vacuum on each side, periodic in all directions.

    Full periodicity keeps the stress well defined; 12 Å of vacuum is more than twice r_max.
    """
    build = fcc100 if surface == "100" else fcc111
    atoms = build("Cu", size=(2, 2, 6), a=LATTICE, vacuum=6.0)
    atoms.pbc = True
    return atoms


def generate_configurations(rng: np.random.Generator) -> list[Atoms]:
    """Every labelled configuration of the data set, in a fixed order for a given ``rng``."""
    configs: list[Atoms] = []

    # Perfect crystals under uniform strain: the energy-volume curve and the bulk modulus.
    cells = [
        bulk("Cu", "fcc", a=LATTICE),
        bulk("Cu", "fcc", a=LATTICE, cubic=True),
        cubic_cell(2),
    ]
    for cell in cells:
        for epsilon in np.linspace(-0.04, 0.04, 9):
            configs.append(labelled(strained(cell, isotropic(epsilon)), "bulk_strain"))

    # General (normal and shear) strains with a small rattle: the elastic constants.
    shear_cells = [
        bulk("Cu", "fcc", a=LATTICE),
        bulk("Cu", "fcc", a=LATTICE, cubic=True),
        bulk("Cu", "fcc", a=LATTICE) * (2, 2, 2),
        cubic_cell(2),
    ]
    for cell in shear_cells:
        for _ in range(10):
            atoms = strained(cell, random_strain(rng, 0.04))
            atoms.positions += rng.normal(0.0, 0.03, atoms.positions.shape)
            configs.append(labelled(atoms, "bulk_shear"))

    # Thermal disorder: an 8-atom cell, a 32-atom cell at the nominal lattice constant and at
    # a random volume (thermal expansion and pressure), and the 108-atom cell of the MD check.
    for temperature in TEMPERATURES:
        primitive = bulk("Cu", "fcc", a=LATTICE) * (2, 2, 2)
        for atoms in md_snapshots(primitive, temperature, 6, 20, rng):
            configs.append(labelled(atoms, "bulk_md"))
        for epsilon in (0.0, rng.uniform(-0.015, 0.025)):
            start = strained(cubic_cell(2), isotropic(epsilon))
            for atoms in md_snapshots(start, temperature, 6, 20, rng):
                configs.append(labelled(atoms, "bulk_md"))
        for atoms in md_snapshots(cubic_cell(3), temperature, 1, 20, rng):
            configs.append(labelled(atoms, "bulk_md"))

    # Single vacancies, unrelaxed and at temperature.
    small = cubic_cell(2)
    del small[0]
    configs.append(labelled(small, "vacancy"))
    for temperature in TEMPERATURES[1:]:
        for atoms in md_snapshots(small, temperature, 5, 20, rng):
            configs.append(labelled(atoms, "vacancy"))

    # Surfaces: ideal (100) and (111) slabs and their thermal snapshots.
    for surface in ("100", "111"):
        atoms = slab(surface)
        configs.append(labelled(atoms, "surface"))
        for temperature in (300.0, 600.0, 900.0):
            for snapshot in md_snapshots(atoms, temperature, 6, 20, rng):
                configs.append(labelled(snapshot, "surface"))
    return configs


def split(
    configs: Sequence[Atoms], rng: np.random.Generator
) -> tuple[list[Atoms], list[Atoms], list[Atoms]]:
    """Training, validation and test sets, 80/10/10 within each kind of configuration.

    Splitting within each kind keeps every kind represented in the held-out test set.
    """
    train: list[Atoms] = []
    valid: list[Atoms] = []
    test: list[Atoms] = []
    kinds = sorted({atoms.info["config_type"] for atoms in configs})
    for kind in kinds:
        members = [atoms for atoms in configs if atoms.info["config_type"] == kind]
        order = rng.permutation(len(members))
        n_test = max(1, round(0.1 * len(members)))
        n_valid = max(1, round(0.1 * len(members)))
        test += [members[i] for i in order[:n_test]]
        valid += [members[i] for i in order[n_test : n_test + n_valid]]
        train += [members[i] for i in order[n_test + n_valid :]]
    return train, valid, test


def to_graphs(configs: Sequence[Atoms], z_table: AtomicNumberTable) -> list[mace_data.AtomicData]:
    """mace-torch's graph data (``AtomicData``) of each configuration, in the default dtype."""
    return [
        mace_data.AtomicData.from_config(
            mace_data.config_from_atoms(atoms, key_specification=KEYS),
            z_table=z_table,
            cutoff=R_MAX,
        )
        for atoms in configs
    ]


# ----------------------------------------------------------------------------- model


def fit_atomic_energies(configs: Sequence[Atoms], zs: Sequence[int]) -> np.ndarray:
    """Per-element reference energies from a least-squares fit of total energies to counts."""
    counts = np.array([[np.sum(atoms.numbers == z) for z in zs] for atoms in configs], float)
    energies = np.array([atoms.info["REF_energy"] for atoms in configs])
    solution, *_ = np.linalg.lstsq(counts, energies, rcond=None)
    return solution


def average_neighbours(graphs: Sequence[mace_data.AtomicData]) -> float:
    """The mean number of neighbours within r_max, which normalises MACE's message sums."""
    edges = sum(graph.edge_index.shape[1] for graph in graphs)
    nodes = sum(graph.num_nodes for graph in graphs)
    return edges / nodes


def build_model(
    atomic_energies: np.ndarray, avg_num_neighbors: float, shift: float, scale: float
) -> modules.ScaleShiftMACE:
    """The demo architecture: 2 interactions, 16x0e+16x1o features, l_max 2, correlation 2.

    Chosen to stay well under 1 MB on disk while fitting EMT copper to a few meV/atom.
    """
    # e3nn is imported after mace: importing mace lets e3nn load its constants file under
    # torch's weights-only default for torch.load.
    from e3nn import o3

    interaction = modules.interaction_classes["RealAgnosticResidualInteractionBlock"]
    return modules.ScaleShiftMACE(
        r_max=R_MAX,
        num_bessel=8,
        num_polynomial_cutoff=5,
        max_ell=2,
        interaction_cls=interaction,
        interaction_cls_first=interaction,
        num_interactions=2,
        num_elements=1,
        hidden_irreps=o3.Irreps("16x0e+16x1o"),
        MLP_irreps=o3.Irreps("16x0e"),
        atomic_energies=atomic_energies,
        avg_num_neighbors=avg_num_neighbors,
        atomic_numbers=[CU],
        correlation=2,
        gate=torch.nn.functional.silu,
        radial_MLP=[32, 32, 32],
        atomic_inter_scale=scale,
        atomic_inter_shift=shift,
    )


# ----------------------------------------------------------------------------- training


def predict(model: torch.nn.Module, batch: Batch, training: bool) -> dict[str, torch.Tensor]:
    """Energy, forces and stress of a batch; ``training`` keeps the graph for the loss."""
    return model(batch.to_dict(), training=training, compute_force=True, compute_stress=True)


def loss_of(
    output: dict[str, torch.Tensor], batch: Batch, weights: dict[str, float]
) -> torch.Tensor:
    """Weighted mean squared errors of energy per atom, force and stress components."""
    atoms_per_graph = (batch.ptr[1:] - batch.ptr[:-1]).to(output["energy"].dtype)
    energy = (output["energy"] - batch.energy) / atoms_per_graph
    forces = output["forces"] - batch.forces
    stress = output["stress"] - batch.stress
    return (
        weights["energy"] * energy.square().mean()
        + weights["forces"] * forces.square().mean()
        + weights["stress"] * stress.square().mean()
    )


def errors(model: torch.nn.Module, graphs: Sequence[mace_data.AtomicData]) -> dict[str, float]:
    """Mean absolute and root-mean-square errors of a model on some graphs."""
    loader = DataLoader(graphs, batch_size=16, shuffle=False)
    energy, forces, stress = [], [], []
    for batch in loader:
        output = predict(model, batch, training=False)
        atoms_per_graph = (batch.ptr[1:] - batch.ptr[:-1]).to(batch.energy.dtype)
        energy.append(((output["energy"] - batch.energy) / atoms_per_graph).detach())
        forces.append((output["forces"] - batch.forces).detach().flatten())
        stress.append((output["stress"] - batch.stress).detach().flatten())
    e, f, s = torch.cat(energy), torch.cat(forces), torch.cat(stress)
    return {
        "energy_mae_mev_per_atom": 1000 * e.abs().mean().item(),
        "energy_rmse_mev_per_atom": 1000 * e.square().mean().sqrt().item(),
        "forces_mae_mev_per_a": 1000 * f.abs().mean().item(),
        "forces_rmse_mev_per_a": 1000 * f.square().mean().sqrt().item(),
        "stress_mae_gpa": EV_PER_A3_TO_GPA * s.abs().mean().item(),
        "stress_rmse_gpa": EV_PER_A3_TO_GPA * s.square().mean().sqrt().item(),
    }


def train(
    model: torch.nn.Module,
    train_graphs: Sequence[mace_data.AtomicData],
    valid_graphs: Sequence[mace_data.AtomicData],
    epochs: int,
    seed: int,
    log: Callable[[str], None],
) -> torch.nn.Module:
    """Fit ``model`` with Adam; return the model state that did best on the validation set."""
    generator = torch.Generator().manual_seed(seed)
    loader = DataLoader(
        train_graphs, batch_size=8, shuffle=True, drop_last=False, generator=generator
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, amsgrad=True)
    # Cosine decay to 1% of the starting rate: large early steps, fine convergence at the end.
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, epochs, eta_min=1e-4)
    last_stage = (3 * epochs) // 4
    best_loss, best_state = float("inf"), copy.deepcopy(model.state_dict())
    start = time.perf_counter()
    for epoch in range(epochs):
        weights = WEIGHTS_FIRST if epoch < last_stage else WEIGHTS_LAST
        model.train()
        total, batches = 0.0, 0
        for batch in loader:
            optimizer.zero_grad(set_to_none=True)
            loss = loss_of(predict(model, batch, training=True), batch, weights)
            loss.backward()
            # Clipping guards the first epochs, whose force errors are large.
            torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
            optimizer.step()
            total += loss.item()
            batches += 1
        schedule.step()
        model.eval()
        valid_loss = 0.0
        for batch in DataLoader(valid_graphs, batch_size=16, shuffle=False):
            # Judged with the last stage's weights so that epochs compare on one scale.
            valid_loss += loss_of(predict(model, batch, False), batch, WEIGHTS_LAST).item()
        if valid_loss < best_loss:
            best_loss, best_state = valid_loss, copy.deepcopy(model.state_dict())
        if epoch % 5 == 0 or epoch == epochs - 1:
            valid = errors(model, valid_graphs)
            log(
                f"epoch {epoch:4d}  train loss {total / batches:.3e}  "
                f"valid E {valid['energy_mae_mev_per_atom']:6.2f} meV/atom  "
                f"F {valid['forces_mae_mev_per_a']:6.1f} meV/Å  "
                f"S {valid['stress_mae_gpa']:6.3f} GPa  "
                f"lr {schedule.get_last_lr()[0]:.1e}  {time.perf_counter() - start:6.0f} s"
            )
    model.load_state_dict(best_state)
    return model


def sha256_of(path: Path) -> str:
    """The SHA-256 of a file."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv: Sequence[str] | None = None) -> int:
    """Generate the data, train, save and evaluate the demo model."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="seed of data, split and model")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    parser.add_argument("--epochs", type=int, default=40, help="training epochs")
    parser.add_argument("--metrics", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)

    def log(message: str) -> None:
        print(message, flush=True)

    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)

    start = time.perf_counter()
    configs = generate_configurations(rng)
    train_set, valid_set, test_set = split(configs, rng)
    generation_s = time.perf_counter() - start
    counts: dict[str, dict[str, int]] = {}
    for name, subset in (("train", train_set), ("valid", valid_set), ("test", test_set)):
        for atoms in subset:
            row = counts.setdefault(atoms.info["config_type"], {"train": 0, "valid": 0, "test": 0})
            row[name] += 1
    log(f"{len(configs)} configurations in {generation_s:.0f} s: {counts}")

    with default_dtype(torch.float64):
        z_table = AtomicNumberTable([CU])
        train_graphs = to_graphs(train_set, z_table)
        valid_graphs = to_graphs(valid_set, z_table)
        test_graphs = to_graphs(test_set, z_table)

        atomic_energies = fit_atomic_energies(train_set, z_table.zs)
        e0 = float(atomic_energies[0])
        residual = [(a.info["REF_energy"] - len(a) * e0) / len(a) for a in train_set]
        forces = np.concatenate([a.arrays["REF_forces"].ravel() for a in train_set])
        shift = float(np.mean(residual))
        scale = float(np.sqrt(np.mean(forces**2)))
        avg_num_neighbors = average_neighbours(train_graphs)
        log(
            f"E0 {e0:.4f} eV, shift {shift:.4f} eV, scale {scale:.4f} eV/Å, "
            f"avg neighbours {avg_num_neighbors:.2f}"
        )

        model = build_model(atomic_energies, avg_num_neighbors, shift, scale)
        parameters = sum(p.numel() for p in model.parameters())
        log(f"{parameters} parameters; training for {args.epochs} epochs")
        train_start = time.perf_counter()
        model = train(model, train_graphs, valid_graphs, args.epochs, args.seed, log)
        training_s = time.perf_counter() - train_start

        model.eval()
        model = model.cpu()
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / MODEL_FILE
        torch.save(model, path)
        test = errors(model, test_graphs)
        kinds = [atoms.info["config_type"] for atoms in test_set]
        by_kind = {
            kind: errors(model, [g for g, k in zip(test_graphs, kinds, strict=True) if k == kind])
            for kind in counts
        }

    results = {
        "command": "python " + " ".join([sys.argv[0], *(argv or sys.argv[1:])]),
        "seed": args.seed,
        "epochs": args.epochs,
        "counts": counts,
        "atoms": {
            "train": sum(len(a) for a in train_set),
            "valid": sum(len(a) for a in valid_set),
            "test": sum(len(a) for a in test_set),
        },
        "generation_s": generation_s,
        "training_s": training_s,
        "parameters": parameters,
        "model_bytes": path.stat().st_size,
        "model_sha256": sha256_of(path),
        "e0_ev": e0,
        "avg_num_neighbors": avg_num_neighbors,
        "test": test,
        "test_by_kind": by_kind,
    }
    log(json.dumps(results, indent=2))
    if args.metrics is not None:
        args.metrics.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
