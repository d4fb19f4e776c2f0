"""The gate: the model as the engine runs it, checked against mace-torch on the user's structure.

:func:`run_gate` compares (its reference runs in a child process, :mod:`fastmace.gate.child`),
:func:`gate_with_fallback` tries the plan's backends in order until one passes, and
:func:`reduced_structure` picks the part of a large structure to check. This package uses
``models`` and ``md``; the planner only names the candidates.
"""

from fastmace.gate.check import GateError, GateResult, run_gate
from fastmace.gate.fallback import GatedModel, gate_with_fallback
from fastmace.gate.reduce import GateStructure, reduced_structure

__all__ = [
    "GateError",
    "GateResult",
    "GateStructure",
    "GatedModel",
    "gate_with_fallback",
    "reduced_structure",
    "run_gate",
]
