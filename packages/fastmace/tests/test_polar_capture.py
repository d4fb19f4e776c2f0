"""Why MACE-POLAR-1 runs eagerly: the capture-blocking ops, as docs/validation/polar.md lists them.

``tools/validation/polar_sync_ops.py`` records, under a TorchDispatchMode, every aten op of a
``Potential`` call on a PolarMACE (forward and backward) that synchronises the device with the
host or has a value-dependent shape. These tests keep its list and the "Capture" section of
docs/validation/polar.md the same: when mace-torch or graph-longrange change, or FastMACE's
own graph does, the list changes and so must the doc (and perhaps the planner's rule).
"""

from __future__ import annotations

import importlib.util
import re
import sys
import traceback
from importlib import metadata
from pathlib import Path

import pytest
import torch

pytest.importorskip(
    "graph_longrange",
    reason="MACE-POLAR-1 needs graph-longrange: pip install 'fastmace[polar]'",
)

ROOT = Path(__file__).parents[3]
DOC = ROOT / "docs" / "validation" / "polar.md"

# The versions the list below was read from; another version may move or remove a site.
MACE_VERSION, GRAPH_LONGRANGE_VERSION = "0.3.16", "0.4.0"

# (op, file in the package, line) of mace-torch's and graph-longrange's blocking sites.
UPSTREAM_SITES = {
    ("index_put_", "mace", "tools/scatter.py", 106),
    ("_local_scalar_dense", "mace", "tools/scatter.py", 44),
    ("index", "graph_longrange", "energy.py", 143),
    ("index_put_", "graph_longrange", "energy.py", 143),
    ("_local_scalar_dense", "graph_longrange", "energy.py", 83),
    ("_local_scalar_dense", "graph_longrange", "features.py", 418),
    ("_local_scalar_dense", "graph_longrange", "features.py", 475),
    ("index", "graph_longrange", "features.py", 591),
    ("index_put_", "graph_longrange", "features.py", 591),
    ("index_put_", "graph_longrange", "features.py", 593),
    ("index", "graph_longrange", "kspace.py", 106),
    ("index", "graph_longrange", "kspace.py", 107),
    ("_local_scalar_dense", "graph_longrange", "kspace.py", 63),
    ("_local_scalar_dense", "graph_longrange", "kspace.py", 64),
    ("_local_scalar_dense", "graph_longrange", "kspace.py", 65),
    ("_local_scalar_dense", "graph_longrange", "kspace.py", 70),
    ("_local_scalar_dense", "graph_longrange", "kspace.py", 71),
    ("_local_scalar_dense", "graph_longrange", "kspace.py", 77),
    ("_local_scalar_dense", "graph_longrange", "realspace_electrostatics.py", 34),
    ("nonzero", "graph_longrange", "realspace_electrostatics.py", 40),
    ("index", "graph_longrange", "realspace_electrostatics.py", 50),
    ("index", "graph_longrange", "realspace_electrostatics.py", 51),
    ("index", "graph_longrange", "realspace_electrostatics.py", 54),
    ("_local_scalar_dense", "graph_longrange", "slabs.py", 35),
}

# FastMACE's own (op, file, function): named by function, so editing polar.py moves no test.
FASTMACE_SITES = {
    ("index", "dynamics/polar.py", "polar_graph"),
    ("index_put_", "dynamics/polar.py", "polar_graph"),
    ("_linalg_check_errors", "dynamics/polar.py", "polar_graph"),
}


def sync_ops_tool():
    spec = importlib.util.spec_from_file_location(
        "polar_sync_ops", ROOT / "tools" / "validation" / "polar_sync_ops.py"
    )
    module = importlib.util.module_from_spec(spec)
    # dataclasses look their module up while the class is made; not left registered after.
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


@pytest.fixture(scope="module")
def tool():
    return sync_ops_tool()


@pytest.fixture(scope="module")
def results(tool):
    return tool.run_all()


def test_the_recorder_catches_syncs_forward_and_backward_and_passes_static_ops(tool) -> None:
    x = torch.linspace(-1.0, 1.0, 8, dtype=torch.float64, requires_grad=True)
    recorder = tool.SyncOpRecorder()
    with torch.autograd.detect_anomaly(check_nan=False), recorder:
        static = torch.where(x > 0, x, 0.0).sum() + x.index_select(0, torch.arange(3)).sum()
        static = static + torch.sort(x).values[0]
        dynamic = x[x > 0].sum()  # a boolean index: backward puts through the same mask
        torch.autograd.grad(static + dynamic, x)
        _ = float(dynamic)  # .item()
    found = {(site.op, site.backward) for site in recorder.sites}
    assert found == {("index", False), ("index_put", True), ("_local_scalar_dense", False)}


def test_a_backward_op_is_named_by_the_forward_frames_anomaly_mode_kept(tool) -> None:
    # Anomaly mode keeps traceback.format_stack() of the forward op; the recorder reads it back.
    formatted, frames = traceback.format_stack(), traceback.extract_stack()
    parsed = tool._parse_kept(formatted)
    assert [(f.filename, f.name) for f in parsed] == [(f.filename, f.name) for f in frames]
    assert [f.lineno for f in parsed[:-1]] == [f.lineno for f in frames[:-1]]


def test_the_blocking_sites_are_the_documented_ones(tool, results) -> None:
    installed = (metadata.version("mace-torch"), metadata.version("graph-longrange"))
    if installed != (MACE_VERSION, GRAPH_LONGRANGE_VERSION):
        pytest.skip("the sites were read from mace-torch 0.3.16 and graph-longrange 0.4.0")
    sites = [site for result in results.values() for site in result.sites]
    upstream = {(s.op, s.package, s.file, s.line) for s in sites if s.package != "fastmace"}
    ours = {(s.op, s.file, s.function) for s in sites if s.package == "fastmace"}
    assert upstream == UPSTREAM_SITES
    assert ours == FASTMACE_SITES
    # None comes from the backward pass: forces add no blocking op of their own.
    assert not any(site.backward for site in sites)
    for op, package, file, line in UPSTREAM_SITES:
        assert documented(package, file, line), f"{op} at {file}:{line} is not in {DOC.name}"


def documented(package: str, file: str, line: int) -> bool:
    """Whether a row of the doc names ``package/file:`` and the line (``:63``, ``:64``...)."""
    rows = [row for row in DOC.read_text().splitlines() if f"{package}/{file}:" in row]
    return any(re.search(rf":{line}(?!\d)", row) for row in rows)


def test_a_periodic_cell_keeps_its_shapes_and_an_open_molecule_does_not(results) -> None:
    # A fixed cell fixes graph-longrange's k-vectors; an open molecule's cell grows with
    # its largest coordinate (mace-torch's long axis), and its k-space grid with it.
    for dtype in ("float64", "float32"):
        periodic, open_ = results[f"{dtype} periodic"], results[f"{dtype} open"]
        assert periodic.same_shapes_after_moving
        assert periodic.k_vectors[0] == periodic.k_vectors[1]
        assert not open_.same_shapes_after_moving
        assert open_.k_vectors[0] != open_.k_vectors[1]


@pytest.mark.parametrize("case", ["periodic", "open"])
def test_padding_self_edges_beyond_the_cutoff_change_nothing_but_rounding(tool, case) -> None:
    # FastMACE's half of a capturable step, if graph-longrange allowed one: a fixed edge count
    # padded with self-edges of atom 0 at 2 r_max, where mace's cutoff (applied to the edge
    # features every PolarMACE block reads) is exactly zero.
    import fastmace as fm

    loaded = fm.load("template:polar-tiny", dtype="float64")
    difference = tool.padding_difference(loaded, tool.CASES[case]())
    eps = torch.finfo(torch.float64).eps
    assert difference["energy"] <= 1000 * eps * 50  # |E| < 50 eV here
    assert difference["forces"] <= 1000 * eps * 10  # |F| < 10 eV/Å here
    assert difference.get("stress", 0.0) <= 1000 * eps * 0.1
