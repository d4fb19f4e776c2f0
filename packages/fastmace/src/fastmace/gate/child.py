"""The gate's reference, run in a child process: mace-torch's e3nn model in float64.

``python -m fastmace.gate.child REQUEST.json`` loads the model the request names with
``fm.load(..., backend="e3nn", dtype="float64")``, evaluates the structure with mace-torch's
own data pipeline (:func:`fastmace.models.reference.evaluate`) and writes energy, forces and
stress to the request's ``output`` (``.npz``). A separate process keeps the reference apart
from the plan under test: nothing the plan did to its process (kernels loaded, graphs
captured, variables set) can touch it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import ase.io
import numpy as np


def main(request_path: str) -> None:
    request = json.loads(Path(request_path).read_text(encoding="utf-8"))
    from fastmace.models.load import load
    from fastmace.models.reference import evaluate

    origin = request["model"]
    loaded = load(
        origin["model"],
        head=origin.get("head"),
        checkpoint=origin.get("checkpoint"),
        sha256=origin.get("sha256"),
        trusted=bool(origin.get("trusted", False)),
        seed=int(origin.get("seed", 0)),
        backend="e3nn",
        dtype="float64",
        device=request["device"],
    )
    atoms = ase.io.read(request["structure"])
    result = evaluate(loaded.module, atoms, loaded.head, stress=bool(atoms.pbc.all()))
    arrays = {"energy": np.array(result.energy), "forces": result.forces}
    if result.stress is not None:
        arrays["stress"] = result.stress
    np.savez(request["output"], **arrays)


if __name__ == "__main__":
    main(sys.argv[1])
