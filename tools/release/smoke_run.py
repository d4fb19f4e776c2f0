"""The clean-install smoke run: the demo model with the prebuilt extension, then a short MD run.

On a GPU it also converts the demo model to the hybrid backend (OpenEquivariance's fused
convolution with cuEquivariance), which fastmace checks against mace-torch's e3nn model at
once (energy and forces within float32 rounding), and requires the extension to have been
loaded from the prebuilt wheel. On the CPU it requires the wheel to have been selected.
Either way the library chosen must be the one built for the running torch's minor version.
"""

from __future__ import annotations

import ase.build
import torch

import fastmace as fm
from fastmace.models.reference import evaluate
from fastmace.oeq import host_extension


def main() -> None:
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    model = fm.load("demo-emt-cu", device=device)
    atoms = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat(2)
    atoms.rattle(0.05, seed=1)
    result = evaluate(model.module, atoms)
    print(f"smoke_run: {model.summary()}; E = {result.energy:.6f} eV for {len(atoms)} atoms")
    record = host_extension.record()
    if record is None or record.method != "prebuilt":
        raise SystemExit(f"smoke_run: the prebuilt extension was not selected: {record}")
    # The wheel holds one library per torch minor: the one chosen must be this torch's.
    minor = ".".join(torch.__version__.split(".")[:2])
    if not (record.built_for_torch or "").startswith(f"{minor}."):
        raise SystemExit(
            f"smoke_run: torch {torch.__version__} got the library built for torch "
            f"{record.built_for_torch}"
        )
    print(f"smoke_run: torch {torch.__version__}: library built for torch {record.built_for_torch}")
    if cuda:
        hybrid = fm.load("demo-emt-cu", backend="hybrid", device="cuda", dtype="float32")
        print(f"smoke_run: {hybrid.summary()}; check {hybrid.conversion_check}")
        if record.how != "prebuilt":
            raise SystemExit(f"smoke_run: the extension was not loaded prebuilt: {record}")
    # A short MD run through the whole engine (hybrid backend and CUDA graphs on a GPU).
    run = fm.md(
        atoms, model="demo-emt-cu", temperature_K=300.0, steps=20, timestep_fs=2.0,
        device=device, backend="hybrid" if cuda else "auto", block_steps=10,
    )  # fmt: skip
    print(f"smoke_run: MD {run.summary()}")
    print(f"smoke_run: oeq_runtime {record.summary()}")


if __name__ == "__main__":
    main()
