"""Does the order of the edges change the speed of cuEquivariance's kernels?

The issue's levers include "edges sorted by receiver": the convolution gathers each edge's
sender features and adds its message into the receiver's row, so the order of the edges
decides how scattered those reads and writes are. This measures it before anything is built
on it: mace-torch's own model (MP-0-medium template, converted to cuEq, float32) on rattled
NaCl, its graph from mace-torch's own data pipeline, then the same edges (edge_index and
shifts permuted together, so the energy is the same up to rounding) in other orders:

- ``mace``: as mace-torch's neighbour list gives them (grouped by sender);
- ``receiver``: sorted by receiver (stable);
- ``mirrored``: FastMACE's layout, each pair once with sender < receiver, then reversed;
- ``random``: a random permutation (the worst case for locality).

Each order: energy and forces (one forward and backward pass, mace-torch's ``compute_force``)
timed over ``--calls`` calls after warm-up, CUDA-synchronised, and the kernel time of
cuEquivariance's operations from torch.profiler.

    python benchmarks/edge_order.py --atoms 13824 --out $OUT/edge-order
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import ase.build
import torch

import fastmace as fm
from fastmace.models.checkpoint import contained, import_mace


def nacl(atoms: int) -> ase.Atoms:
    repeat = round((atoms / 8) ** (1 / 3))
    structure = ase.build.bulk("NaCl", "rocksalt", a=5.64, cubic=True).repeat(repeat)
    structure.rattle(0.05, seed=1)
    return structure


def mace_graph(model: torch.nn.Module, atoms: ase.Atoms, device: str) -> dict[str, torch.Tensor]:
    """mace-torch's input dictionary for ``atoms``, built by its own data pipeline."""
    import_mace()
    from mace import data as mace_data
    from mace.tools import torch_geometric
    from mace.tools.utils import AtomicNumberTable

    with contained():
        torch.set_default_dtype(torch.float32)
        config = mace_data.config_from_atoms(atoms, head_name="Default")
        graph = mace_data.AtomicData.from_config(
            config,
            z_table=AtomicNumberTable([int(z) for z in model.atomic_numbers]),
            cutoff=float(model.r_max),
            heads=["Default"],
        )
        batch = torch_geometric.batch.Batch.from_data_list([graph]).to(device)
    return batch.to_dict()


def orders(edge_index: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each order's permutation of the edges."""
    sender, receiver = edge_index
    count, device = edge_index.shape[1], edge_index.device
    first = torch.nonzero(sender < receiver).squeeze(1)
    # Each pair's reverse edge: sort both directions by (min, max) and pair them up.
    key_forward = sender * (receiver.max() + 1) + receiver
    key_reverse = receiver * (receiver.max() + 1) + sender
    reverse_of = torch.empty_like(sender)
    reverse_of[torch.argsort(key_forward)] = torch.argsort(key_reverse)
    # (In a cell smaller than twice the cutoff an atom sees its own images, i == j: such
    # edges have no place in this layout, which is then left out.)
    mirrored = torch.cat([first, reverse_of[first]])
    generator = torch.Generator(device=device).manual_seed(0)
    found = {
        "mace": torch.arange(count, device=device),
        "receiver": torch.argsort(receiver, stable=True),
        "mirrored": mirrored,
        "random": torch.randperm(count, device=device, generator=generator),
    }
    if mirrored.shape[0] != count:
        del found["mirrored"]
    return found


def permuted(data: dict[str, torch.Tensor], order: torch.Tensor) -> dict[str, torch.Tensor]:
    result = dict(data)
    result["edge_index"] = data["edge_index"][:, order].contiguous()
    result["shifts"] = data["shifts"][order].contiguous()
    result["unit_shifts"] = data["unit_shifts"][order].contiguous()
    return result


def timed(model: torch.nn.Module, data: dict[str, torch.Tensor], calls: int) -> dict[str, float]:
    def call() -> dict[str, torch.Tensor]:
        return model(dict(data), compute_force=True, training=False)

    cuda = data["positions"].is_cuda
    for _ in range(3):
        call()
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        output = call()
    if cuda:
        torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - start) / calls * 1e3
    if not cuda:  # a dry run on the CPU: no kernel times
        return {"ms_per_call": round(wall_ms, 3), "energy_eV": float(output["energy"].sum())}
    activities = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profile:
        for _ in range(5):
            call()
        torch.cuda.synchronize()
    cueq_us = sum(
        event.self_device_time_total
        for event in profile.key_averages()
        if "segmented_polynomial" in event.key
    )
    total_us = sum(event.self_device_time_total for event in profile.key_averages())
    return {
        "ms_per_call": round(wall_ms, 3),
        "cueq_kernel_ms": round(cueq_us / 5 / 1e3, 3),
        "kernel_ms": round(total_us / 5 / 1e3, 3),
        "energy_eV": float(output["energy"].sum()),
        "forces_sum_abs": float(output["forces"].abs().sum()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--atoms", type=int, default=13824)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of the script")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    loaded = fm.load("template:mp0-medium", backend="cueq", device=args.device, dtype="float32")
    model = loaded.module
    atoms = nacl(args.atoms)
    data = mace_graph(model, atoms, args.device)
    results = {}
    with contained():
        torch.set_default_dtype(torch.float32)
        for name, order in orders(data["edge_index"]).items():
            results[name] = timed(model, permuted(data, order), args.calls)
            print(name, results[name], flush=True)
    summary = {
        "atoms": args.atoms,
        "edges": int(data["edge_index"].shape[1]),
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "model": "template:mp0-medium, cuEq, float32",
        "orders": results,
    }
    (args.out / "edge_order.json").write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
