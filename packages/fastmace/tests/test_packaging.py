"""The fastmace wheel built from this checkout: its files and its declared dependencies."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from fastmace.vocabulary import GRAPH_LONGRANGE_VERSION

CORE = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(CORE)],
        check=True, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    (built,) = out.glob("fastmace-*.whl")
    return built


def test_wheel_carries_the_data_files(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "fastmace/models/label_table.json" in names
    assert "fastmace/models/demo/demo-emt-cu.model" in names
    assert not any(name.startswith(("tests/", "fastmace/tests/")) for name in names)


def test_declared_dependencies(wheel):
    archive = zipfile.ZipFile(wheel)
    (metadata_name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
    metadata = Parser().parsestr(archive.read(metadata_name).decode())
    assert metadata["Name"] == "fastmace"
    assert metadata["Requires-Python"] == "<3.14,>=3.10"
    # Markers are compared with one quoting style, whatever the build backend writes.
    requires = [r.replace("'", '"') for r in metadata.get_all("Requires-Dist")]
    assert "mace-torch==0.3.16" in requires
    assert any(r.startswith("torch<3,>=") for r in requires), requires  # a range, not a pin
    for name in ("ase", "cuequivariance-torch", "numpy", "filelock"):
        assert any(r.startswith(name) for r in requires), name
    # `fastmace run` imports tomli where the standard library has no tomllib.
    assert any(r.startswith("tomli") and 'python_version < "3.11"' in r for r in requires)
    oeq = [r for r in requires if 'extra == "oeq"' in r]
    assert any(r.startswith("openequivariance==0.7.0") for r in oeq)
    assert any(
        r.startswith("fastmace-oeq-ext")
        and 'platform_machine == "x86_64"' in r
        and 'python_version < "3.14"' in r
        for r in oeq
    )
    # Pinned: the graph-longrange that mace-torch 0.3.16's PolarMACE can call (pyproject.toml).
    pin = f"graph-longrange=={GRAPH_LONGRANGE_VERSION}"  # the version fastmace doctor checks
    assert any('extra == "polar"' in r and r.startswith(pin) for r in requires)
    dev = [r for r in requires if 'extra == "dev"' in r]
    assert any(r.startswith(pin) for r in dev)  # CI runs test_polar
    assert any('extra == "d3"' in r and r.startswith("torch-dftd") for r in requires)
