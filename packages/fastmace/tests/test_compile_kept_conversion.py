"""torch.compile over a kept conversion: a process that reads the converted model back (never
building it) traces it as the process that converted it does.

mace-torch registers e3nn's Activation for ``simplify`` when it builds a readout, so a model
that was only unpickled left it to Dynamo, which failed creating a guard on e3nn's ``Irrep``:
the warm compiled start on the H200 (stage 65 of tools/validation/startup_gpu.sh). Dynamo's
"eager" backend traces and guards exactly as the default one and skips Inductor's C++ build.
"""

from __future__ import annotations

from conftest import python_report

COMPILE_DEMO = """
import json
import ase.build, torch
from fastmace.models.load import load
from fastmace.dynamics.neighbours import NeighbourList
from fastmace.dynamics.potential import Potential, _compiled
from fastmace.dynamics.state import State
loaded = load("demo-emt-cu", backend="cueq", device="cpu", dtype=torch.float32)
potential = Potential(loaded.module, [29], compile=True)
potential.ahead_of_time = False  # the CPU's rule; CUDA runs go through torch.compile
atoms = ase.build.bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2)
atoms.rattle(0.02, seed=1)
state = State.from_atoms(atoms)
neighbours = NeighbourList(state, potential.r_max)
edges = neighbours.cutoff_edges(state, neighbours.build(state))
shared = edges.mirrored  # the key Potential compiles under (pair radials or not)
potential._compiled_calls[shared] = _compiled(
    potential.model, share_pair_radials=shared, backend="eager"
)
output = potential(state, edges)
print(json.dumps({"kept": "reused_s" in loaded.timings,
                  "energy": float(output.energy.sum()),
                  "forces": output.forces.tolist()}))
"""


def test_a_kept_conversion_compiles_as_a_fresh_one(clean_env, tmp_path):
    clean_env["FASTMACE_CACHE"] = str(tmp_path / "cache")
    clean_env["XDG_STATE_HOME"] = str(tmp_path / "state")
    converted = python_report(COMPILE_DEMO, clean_env)
    kept = python_report(COMPILE_DEMO, clean_env)  # failed in Dynamo's guards before the fix
    assert (converted["kept"], kept["kept"]) == (False, True)
    assert kept["energy"] == converted["energy"]
    assert kept["forces"] == converted["forces"]
