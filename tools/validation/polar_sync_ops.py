"""Which operations keep MACE-POLAR-1 out of a CUDA graph: the evidence of docs/validation/polar.md.

Runs FastMACE's ``Potential`` on a ``PolarMACE`` (template ``polar-tiny``, random weights) for
energy, forces and stress (forward and backward) under a ``TorchDispatchMode`` that records
every aten operation a CUDA graph capture cannot hold: those that synchronise the device with
the host (``.item()``, ``bool(tensor)``, ``nonzero`` behind a boolean index, a copy to the CPU,
linalg's error check) and those whose output shape depends on tensor values. Each is named
with the innermost frame of FastMACE, mace-torch or graph-longrange that issued it; for an op
of the backward pass, the frame of the forward operation it differentiates (autograd's
anomaly mode records those).

It also runs the potential twice on the same cell with the atoms moved and compares the
shapes of every operation's outputs: a captured graph needs them to stay the same.

Runs on the CPU: what it records are the ops that would synchronise on a GPU, whatever the
device. Usage:
    PYTHONPATH=packages/fastmace/src python tools/validation/polar_sync_ops.py
"""

from __future__ import annotations

import argparse
import collections
import math
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import ase
import torch
from ase.build import bulk, molecule
from torch.utils._python_dispatch import TorchDispatchMode

import fastmace as fm
from fastmace.dynamics.edges import Edges
from fastmace.dynamics.neighbours import NeighbourList
from fastmace.dynamics.polar import long_range_cell
from fastmace.dynamics.potential import Potential
from fastmace.dynamics.state import State

# The packages whose frames name a site, as they appear in a file's path.
PACKAGES = ("fastmace", "mace", "graph_longrange")

# Ops that always read a value back to the host or give a value-dependent shape.
_ALWAYS = {
    "_local_scalar_dense": "reads a value to the host (.item(), bool(), int())",
    "is_nonzero": "reads a value to the host (bool())",
    "equal": "reads a value to the host (torch.equal)",
    "nonzero": "output shape depends on values",
    "masked_select": "output shape depends on values",
    "masked_scatter": "reads the mask's count to the host",
    "unique": "output shape depends on values",
    "_unique": "output shape depends on values",
    "_unique2": "output shape depends on values",
    "unique_dim": "output shape depends on values",
    "unique_consecutive": "output shape depends on values",
    "bincount": "output shape depends on values",
    "_linalg_check_errors": "reads LAPACK's info to the host (error check)",
}


@dataclass(frozen=True)
class Site:
    """One place that issued a capture-blocking op."""

    op: str
    package: str  # fastmace, mace or graph_longrange
    file: str  # path inside the package, e.g. modules/extensions.py
    line: int
    function: str
    backward: bool
    caller: str  # the nearest frame of PACKAGES in another file: who called ``where``

    @property
    def where(self) -> str:
        return f"{self.package}/{self.file}:{self.line} ({self.function})"


def blocking_reason(name: str, args: tuple, kwargs: dict) -> str | None:
    """Why the aten op ``name`` (overload packet name) cannot be captured, or None."""
    if name in _ALWAYS:
        return _ALWAYS[name]
    if name in ("index", "index_put", "index_put_", "_index_put_impl_"):
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        if any(_is_boolean(index) for index in indices):
            return "boolean index: nonzero, a value-dependent shape"
    if name == "repeat_interleave" and _repeats_summed_on_host(args, kwargs):
        return "repeat_interleave without output_size reads its sum to the host"
    if name in ("_to_copy", "to", "copy_") and _to_host(name, args, kwargs):
        return "copies to the host"
    return None


def _repeats_summed_on_host(args: tuple, kwargs: dict) -> bool:
    """Whether a repeat_interleave's repeats are a tensor and its output size is not given."""
    # Overloads: (repeats), (self, repeats: int, dim, output_size), (self, repeats, ...).
    repeats = args[0] if len(args) == 1 else (args[1] if len(args) > 1 else None)
    output_size = args[3] if len(args) > 3 else kwargs.get("output_size")
    return isinstance(repeats, torch.Tensor) and output_size is None


def _is_boolean(index: object) -> bool:
    return isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)


def _to_host(name: str, args: tuple, kwargs: dict) -> bool:
    device = kwargs.get("device")
    if name == "copy_" and len(args) > 1:
        return args[0].device.type == "cpu" and args[1].device.type != "cpu"
    return device is not None and torch.device(device).type == "cpu" and args[0].is_cuda


def _package_frames(frames: list[traceback.FrameSummary]) -> list[traceback.FrameSummary]:
    """The frames in one of PACKAGES, innermost first."""
    return [frame for frame in reversed(frames) if _package_of(frame.filename) is not None]


def _caller(frames: list[traceback.FrameSummary]) -> str:
    """file:line of the first of ``frames`` (innermost first) outside the first one's file."""
    for frame in frames[1:]:
        if frame.filename != frames[0].filename:
            package, path = _package_of(frame.filename)
            return f"{package}/{path}:{frame.lineno}"
    return ""


def _package_of(filename: str) -> tuple[str, str] | None:
    """(package, path inside it) of a file in one of PACKAGES, or None."""
    parts = Path(filename).parts
    for index in range(len(parts) - 1, -1, -1):
        if parts[index] in PACKAGES:
            return parts[index], "/".join(parts[index + 1 :])
    return None


class SyncOpRecorder(TorchDispatchMode):
    """Records the capture-blocking aten ops of the code run under it (``sites``), and the
    names and output shapes of every op (``shapes``), forward and backward.

    Use inside ``torch.autograd.detect_anomaly(check_nan=False)`` to have backward ops named
    by the forward operation they differentiate.
    """

    def __init__(self) -> None:
        super().__init__()
        self.sites: list[Site] = []
        self.shapes: list[tuple[str, tuple[tuple[int, ...], ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        reason = blocking_reason(name, args, kwargs)
        if reason is not None:
            self._record(name)
        out = func(*args, **kwargs)
        self.shapes.append((name, _shapes(out)))
        return out

    def _record(self, name: str) -> None:
        node = torch._C._current_autograd_node()
        backward = node is not None
        # In the backward pass, the forward call stack anomaly mode kept for the node.
        kept = node.metadata.get("traceback_") if backward else None
        frames = _parse_kept(kept) if kept else traceback.extract_stack()
        ours = _package_frames(frames)
        if not ours:
            self.sites.append(Site(name, "other", "?", 0, "?", backward, ""))
            return
        frame = ours[0]
        package, path = _package_of(frame.filename)
        site = Site(name, package, path, frame.lineno, frame.name, backward, _caller(ours))
        self.sites.append(site)


def _parse_kept(kept: list[str]) -> list[traceback.FrameSummary]:
    """Anomaly mode's formatted forward stack back as frames (file, line, function)."""
    frames = []
    for entry in kept:
        head = entry.strip().splitlines()[0] if entry.strip() else ""
        # 'File "/path/x.py", line 12, in name'
        if not head.startswith("File "):
            continue
        file_part, line_part, name_part = head.split(", ", 2)
        frames.append(
            traceback.FrameSummary(
                file_part[len('File "') : -1],
                int(line_part.removeprefix("line ")),
                name_part.removeprefix("in "),
            )
        )
    return frames


def _shapes(out: object) -> tuple[tuple[int, ...], ...]:
    values = out if isinstance(out, (tuple, list)) else (out,)
    return tuple(tuple(v.shape) for v in values if isinstance(v, torch.Tensor))


def copper_oxide() -> ase.Atoms:
    """A rattled 8-atom periodic cell of Cu with two O (as tests/test_polar.py)."""
    atoms = bulk("Cu", "fcc", a=3.7, cubic=True).repeat((2, 1, 1))
    atoms.numbers[[0, 5]] = 8
    atoms.rattle(stdev=0.05, seed=4)
    return atoms


def methanol() -> ase.Atoms:
    atoms = molecule("CH3OH")
    atoms.rattle(stdev=0.05, seed=3)
    return atoms


WARM_UP_CALLS = 2
CASES: dict[str, Callable[[], ase.Atoms]] = {"periodic": copper_oxide, "open": methanol}


@dataclass
class CaseResult:
    """What one structure gave: the blocking sites, and whether shapes held when atoms moved."""

    sites: list[Site]
    same_shapes_after_moving: bool
    shape_changes: list[str]
    k_vectors: tuple[int, int]  # graph-longrange's k-vector count, before and after the move


def record_case(potential: Potential, atoms: ase.Atoms) -> CaseResult:
    """Sites of one energy+forces+stress call, and a shape comparison with moved atoms.

    One neighbour list (one edge capacity) serves both calls, as in the engine. Two calls
    first, not recorded, as the engine's eager warm-up before a capture: TorchScript's
    profiling executor (e3nn's generated code) checks its inputs during its first runs.
    """
    state = State.from_atoms([atoms])
    neighbours = NeighbourList(state, potential.r_max, skin=0.5)
    for _ in range(WARM_UP_CALLS):
        _recorded_call(potential, state, neighbours.build(state))
    first = _recorded_call(potential, state, neighbours.build(state))
    moved = atoms.copy()
    # A move inside the neighbour list's skin: the same cell, other positions (an open
    # molecule's largest coordinate changes too).
    moved.positions += 0.05 * torch.randn(len(atoms), 3, dtype=torch.float64).numpy()
    moved_state = State.from_atoms([moved])
    second = _recorded_call(potential, moved_state, neighbours.build(moved_state))
    changes = _shape_changes(first.shapes, second.shapes)
    counts = (k_vector_count(potential, state), k_vector_count(potential, moved_state))
    return CaseResult(first.sites, not changes, changes, counts)


def k_vector_count(potential: Potential, state: State) -> int:
    """How many k-vectors PolarMACE's k-space grid has for ``state`` (one system): the
    first dimension of graph-longrange's output, a shape that depends on the cell."""
    from graph_longrange.kspace import compute_k_vectors_flat

    cell = long_range_cell(state, potential.r_max)
    reciprocal = 2 * math.pi * torch.linalg.inv(cell.mT)
    cutoff = float(potential.model.kspace_cutoff)
    return int(compute_k_vectors_flat(cutoff, cell, reciprocal)[0].shape[0])


def _recorded_call(potential: Potential, state: State, edges: Edges) -> SyncOpRecorder:
    recorder = SyncOpRecorder()
    stress = bool(state.pbc.all())
    with warnings.catch_warnings():
        # Anomaly mode warns that it is on: it is, on purpose, for this call only.
        warnings.filterwarnings("ignore", "Anomaly Detection", UserWarning)
        with torch.autograd.detect_anomaly(check_nan=False), recorder:
            potential(state, edges, compute_stress=stress)
    return recorder


def _shape_changes(first: list, second: list) -> list[str]:
    """The first few ops whose names or output shapes differ between two calls."""
    if len(first) != len(second):
        return [f"{len(first)} ops, then {len(second)}"]
    changes = []
    for (name_a, shape_a), (name_b, shape_b) in zip(first, second, strict=True):
        if name_a != name_b or shape_a != shape_b:
            changes.append(f"{name_a} {shape_a} -> {name_b} {shape_b}")
    return changes[:5]


def run_all(dtypes: tuple[str, ...] = ("float64", "float32")) -> dict[str, CaseResult]:
    """Every (dtype, case) of the report, keyed ``"float64 periodic"`` etc."""
    results = {}
    for dtype in dtypes:
        loaded = fm.load("template:polar-tiny", dtype=dtype)
        for case, make in CASES.items():
            atoms = make()
            potential = Potential.from_loaded(loaded, atoms.numbers)
            torch.manual_seed(0)
            results[f"{dtype} {case}"] = record_case(potential, atoms)
    return results


class PaddedEdges(torch.nn.Module):
    """A PolarMACE given ``extra`` more edges: self-edges of atom 0 whose vector is
    (2 r_max, 0, 0), beyond the cutoff. What a fixed edge count could pad with, if capture
    became possible upstream: do they leave the results as they are?"""

    def __init__(self, model: torch.nn.Module, extra: int) -> None:
        super().__init__()
        self.model, self.extra = model, extra

    def forward(self, data: dict[str, torch.Tensor], **kwargs: object) -> dict:
        data = dict(data)
        shifts = data["shifts"]
        length = 2.0 * float(self.model.r_max)
        padding = shifts.new_tensor([length, 0.0, 0.0]).expand(self.extra, 3)
        index = data["edge_index"]
        data["edge_index"] = torch.cat([index, index.new_zeros(2, self.extra)], 1)
        data["shifts"] = torch.cat([shifts, padding])
        data["unit_shifts"] = torch.cat([data["unit_shifts"], shifts.new_zeros(self.extra, 3)])
        return self.model(data, **kwargs)


def padding_difference(loaded: fm.LoadedModel, atoms: ase.Atoms, extra: int = 37) -> dict:
    """Largest |padded - plain| of energy, forces and (periodic) stress, and whether equal."""
    state = State.from_atoms([atoms])
    plain = Potential.from_loaded(loaded, atoms.numbers)
    padded = Potential.from_loaded(loaded, atoms.numbers)
    padded.model = PaddedEdges(padded.model, extra)
    edges = NeighbourList(state, plain.r_max, skin=0.5).build(state)
    stress = bool(atoms.pbc.all())
    a, b = plain(state, edges, stress), padded(state, edges, stress)
    names = ("energy", "forces", "stress") if stress else ("energy", "forces")
    pairs = [(getattr(a, name), getattr(b, name)) for name in names]
    result = {name: float((x - y).abs().max()) for name, (x, y) in zip(names, pairs, strict=True)}
    result["equal"] = all(torch.equal(x, y) for x, y in pairs)
    return result


def site_table(results: dict[str, CaseResult]) -> list[tuple[str, str, str, str, int, str]]:
    """(package, op, where, called from, count, cases) rows, FastMACE's first, then by place."""
    counts: dict[tuple[str, str, str, str], collections.Counter] = collections.defaultdict(
        collections.Counter
    )
    for case, result in results.items():
        for site in result.sites:
            op = f"{site.op} (backward)" if site.backward else site.op
            counts[(site.package, op, site.where, site.caller)][case] += 1
    order = {"fastmace": 0, "mace": 1, "graph_longrange": 2}
    rows = []
    for (package, op, where, caller), by_case in counts.items():
        cases = ", ".join(f"{case}: {n}" for case, n in sorted(by_case.items()))
        rows.append((package, op, where, caller, sum(by_case.values()), cases))
    return sorted(rows, key=lambda row: (order.get(row[0], 3), row[2], row[1]))


def distinct_sites(results: dict[str, CaseResult]) -> set[tuple[str, str, str, int]]:
    """(op, package, file, line) of every site, whatever the case: what the docs list."""
    return {
        (site.op, site.package, site.file, site.line)
        for result in results.values()
        for site in result.sites
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    results = run_all()
    print("| package | op | where | called from | count | per case |")
    print("| --- | --- | --- | --- | --- | --- |")
    for package, op, where, caller, count, cases in site_table(results):
        print(f"| {package} | {op} | {where} | {caller} | {count} | {cases} |")
    print()
    for case, result in results.items():
        verdict = "same" if result.same_shapes_after_moving else "CHANGED"
        before, after = result.k_vectors
        print(
            f"{case}: shapes after moving the atoms (same cell): {verdict}; "
            f"k-vectors {before} -> {after}"
        )
        for change in result.shape_changes:
            print(f"    {change}")
    print()
    for dtype in ("float64", "float32"):
        loaded = fm.load("template:polar-tiny", dtype=dtype)
        for case, make in CASES.items():
            print(f"{dtype} {case}: 37 padding edges change", padding_difference(loaded, make()))


if __name__ == "__main__":
    main()
