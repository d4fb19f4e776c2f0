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
    from fastmace.models.files import ModelFileError
    from fastmace.models.load import load
    from fastmace.models.reference import evaluate

    origin = request["model"]
    try:
        loaded = load(
            **_same_bytes(origin),
            head=origin.get("head"),
            seed=int(origin.get("seed", 0)),
            backend="e3nn",
            dtype="float64",
            device=request["device"],
        )
    except ModelFileError as error:
        # A message for the parent's GateError, not this process's traceback.
        sys.exit(f"the gate's reference refused the model file: {error}")
    atoms = ase.io.read(request["structure"])
    result = evaluate(loaded.module, atoms, loaded.head, stress=bool(atoms.pbc.all()))
    arrays = {"energy": np.array(result.energy), "forces": result.forces}
    if result.stress is not None:
        arrays["stress"] = result.stress
    np.savez(request["output"], **arrays)


def _same_bytes(origin: dict) -> dict:
    """What to load: the file the parent loaded, held to the SHA-256 of the bytes the parent
    read (never ``trusted``: a file swapped since, even one the user trusted, is refused
    before it is unpickled). A template has no file and is built as the parent built it."""
    if origin.get("checkpoint") and origin.get("sha256"):
        return {"model": origin["checkpoint"], "sha256": origin["sha256"]}
    return {"model": origin["model"]}


if __name__ == "__main__":
    main(sys.argv[1])
