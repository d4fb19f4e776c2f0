"""FastMACE's product basis against cuEquivariance's symmetric contraction, on the same inputs
(GPU).

For each size of rock-salt NaCl and each product block of a template model (float32,
cuEquivariance):

* the block's symmetric contraction forward, and forward + backward (what forces need): the
  GPU's kernel time per call (profiler) and the wall time per eager call (CUDA events), for
  cuEquivariance's module and FastMACE's (dynamics/product_basis.py, its kernels generated
  from the basis's terms by product_codegen.py) with the run's elements; on CUDA also our
  kernels alone with tiles of 64, 128 and 256 values (``threads``), kernel time only;
* each one's largest error against the same polynomial in float64, relative to the largest
  value, for the output and for the features' gradient;
* then the whole potential (energy and forces; radial tables as the default path has them)
  with either product basis, captured in a CUDA graph and replayed (ms per evaluation), and
  the forces' difference.

    python benchmarks/product_kernels.py --atoms 216,1728,13824 --out DIR

writes DIR/product_kernels.json (a ``cases`` list as md_speed.py's: model, atoms, path,
variant, status, ms_per_step) and prints a table. ``--device cpu --atoms 64`` smoke-tests the
script. docs/design/product-basis.md says what the kernels do.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
import conv_kernels
from conv_kernels import relative, timed_ms
from profile_step import graph_ms, nacl

from fastmace.dynamics import product_codegen
from fastmace.dynamics.neighbours import NeighbourList
from fastmace.dynamics.potential import Potential
from fastmace.dynamics.product_basis import (
    ProductBasis,
    contract_backward_reference,
    contract_reference,
    derivative_entries,
    polynomial_of,
)
from fastmace.dynamics.state import State


def time_contraction(module: torch.nn.Module, x: torch.Tensor, indices: torch.Tensor) -> dict:
    leaf = x.clone().requires_grad_(True)
    grad = torch.randn_like(module(leaf, indices).detach())

    def forward() -> None:
        with torch.no_grad():
            module(leaf, indices)

    def both() -> None:
        torch.autograd.grad(module(leaf, indices), [leaf], grad)

    out = module(leaf, indices)
    (found,) = torch.autograd.grad(out, [leaf], grad)
    forward_times, both_times = timed_ms(forward), timed_ms(both)
    return {"forward_ms": forward_times["kernel_ms"], "ms": both_times["kernel_ms"],
            "wall_ms": both_times["wall_ms"], "forward_wall_ms": forward_times["wall_ms"],
            "found": [out.detach(), found], "grad": grad}  # fmt: skip


def tile_cases(model_name: str, atoms: int, index: int, ours: ProductBasis, x: torch.Tensor,
               element: torch.Tensor) -> list[dict[str, Any]]:  # fmt: skip
    """Our kernels alone, forward and backward, with tiles of each size: kernel ms per call."""
    features = x.view(atoms, ours.inputs, ours.channels).contiguous()
    rows = ours.rows[element]
    arguments = (ours.key, features, rows, ours.weights, ours.term_coefficients)
    grad = torch.randn_like(product_codegen.forward(*arguments))
    cases = []
    for threads in (64, 128, 256):
        forward = lambda threads=threads: product_codegen.forward(*arguments, threads=threads)  # noqa: E731

        def both(threads: int = threads) -> None:
            product_codegen.forward(*arguments, threads=threads)
            product_codegen.backward(ours.key, grad, *arguments[1:], threads=threads)

        forward_ms, both_ms = timed_ms(forward)["kernel_ms"], timed_ms(both)["kernel_ms"]
        cases.append({
            "model": model_name, "atoms": atoms, "path": "product-basis",
            "variant": f"fastmace-terms-{threads}-block{index}", "status": "ok",
            "ms_per_step": both_ms, "forward_ms": forward_ms, "threads": threads,
        })  # fmt: skip
    return cases


def product_cases(model_name: str, atoms: int, loaded: Any) -> list[dict[str, Any]]:
    device = conv_kernels.DEVICE
    structure = nacl(atoms)
    numbers = [int(z) for z in loaded.module.atomic_numbers]
    element = torch.tensor([numbers.index(int(z)) for z in structure.numbers], device=device)
    columns = sorted(set(element.tolist()))
    generator = torch.Generator(device=device).manual_seed(0)
    cases = []
    for index, block in enumerate(loaded.module.products):
        theirs = block.symmetric_contractions
        polynomial = polynomial_of(theirs, columns)
        x = torch.randn((atoms, theirs.irreps_in.dim), generator=generator, device=device)
        indices = element.to(torch.int32)
        timings = {"cueq": time_contraction(theirs, x, indices)}
        ours = ProductBasis(polynomial, theirs, torch.float32, torch.device(device))
        timings["fastmace-terms"] = time_contraction(ours, x, indices)
        if device == "cuda":
            cases += tile_cases(model_name, atoms, index, ours, x, element)
        rows = polynomial.rows.to(device)[element]
        features = x.double().view(atoms, polynomial.inputs, polynomial.channels)
        coefficients = polynomial.coefficients.to(device)
        entries, offsets = (
            t.to(device) for t in derivative_entries(polynomial.monomials, polynomial.inputs)
        )
        monomials = polynomial.monomials.to(device)
        want_out = contract_reference(features, rows, monomials, coefficients).flatten(1)
        for path, timing in timings.items():
            grad = timing["grad"].double().view(atoms, polynomial.outputs, polynomial.channels)
            want_grad = contract_backward_reference(grad, features, rows, coefficients, entries,
                                                    offsets).flatten(1)  # fmt: skip
            errors = [relative(timing["found"][0], want_out),
                      relative(timing["found"][1], want_grad)]  # fmt: skip
            cases.append({
                "model": model_name, "atoms": atoms, "path": "product-basis",
                "variant": f"{path}-block{index}", "status": "ok",
                "ms_per_step": timing["ms"], "forward_ms": timing["forward_ms"],
                "wall_ms": timing["wall_ms"], "forward_wall_ms": timing["forward_wall_ms"],
                "monomials": int(polynomial.monomials.shape[0]),
                "errors_vs_float64": dict(zip(("output", "features_grad"), errors, strict=True)),
            })  # fmt: skip
    return cases + potential_cases(model_name, atoms, loaded, structure)


def potential_cases(model_name: str, atoms: int, loaded: Any, structure: Any) -> list[dict]:
    device = conv_kernels.DEVICE
    state = State.from_atoms([structure], device=device)
    species = sorted(set(structure.numbers.tolist()))
    found, cases = {}, []
    for path, own in (("cueq", False), ("fastmace-product", True)):
        potential = Potential(loaded.module, species, radial_table=True, product_basis=own)
        neighbours = NeighbourList(state, potential.r_max, 0.5)
        edges = neighbours.cutoff_edges(state, neighbours.build(state))
        evaluate = lambda potential=potential, edges=edges: potential(state, edges)  # noqa: E731
        ms = graph_ms(evaluate) if device == "cuda" else timed_ms(evaluate)["wall_ms"]
        found[path] = potential(state, edges).forces
        cases.append({"model": model_name, "atoms": atoms, "path": "potential",
                      "variant": f"{path}-table", "status": "ok", "ms_per_step": ms})  # fmt: skip
    scale = float(found["cueq"].abs().max())
    difference = float((found["fastmace-product"] - found["cueq"]).abs().max())
    cases[-1]["forces_vs_cueq"] = difference / scale
    return cases


def main() -> None:
    conv_kernels.kernel_benchmark(__doc__, product_cases, "product-basis", "product_kernels.json")


if __name__ == "__main__":
    main()
