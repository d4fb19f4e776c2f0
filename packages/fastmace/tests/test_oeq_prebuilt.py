"""The prebuilt extension's manifest check: accepted only on an exact match, else a reason."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys

import pytest

from fastmace.oeq.prebuilt import (
    InstalledVersions,
    installed_versions,
    prebuilt_extension,
    torch_full_version,
)

HERE = InstalledVersions("2.14.1+cu130", "0.7.0", "cp311", "linux_x86_64")
LIBRARY = b"\x7fELF stands in for the compiled library in this test"


@pytest.fixture
def wheel(tmp_path, monkeypatch):
    """An installed fastmace_oeq_ext package directory (files only) on sys.path."""
    package = tmp_path / "site" / "fastmace_oeq_ext"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
    (package / "libtorch_tp_jit.so").write_bytes(LIBRARY)
    manifest = {
        "torch": "2.14.1+cu130", "cuda": "13.0", "openequivariance": "0.7.0",
        "pybind11": "3.1.0", "python_tag": "cp311", "platform_tag": "manylinux_2_28_x86_64",
        "library": "libtorch_tp_jit.so", "sha256": hashlib.sha256(LIBRARY).hexdigest(),
        "compiler": "g++ 12.2.0", "glibc_max": "2.34",
    }  # fmt: skip
    (package / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    yield package, manifest
    sys.modules.pop("fastmace_oeq_ext", None)


def write(package, manifest):
    (package / "manifest.json").write_text(json.dumps(manifest))


def test_matching_manifest_is_accepted_without_import(wheel):
    package, _ = wheel
    status = prebuilt_extension(HERE)
    assert status.extension is not None
    assert status.extension.library == package / "libtorch_tp_jit.so"
    assert "fastmace_oeq_ext" not in sys.modules


@pytest.mark.skipif(
    importlib.util.find_spec("fastmace_oeq_ext") is not None,
    reason="fastmace-oeq-ext is installed in this environment",
)
def test_not_installed():
    status = prebuilt_extension(HERE)
    assert status.extension is None and status.reason == "fastmace-oeq-ext is not installed"


@pytest.mark.parametrize(
    ("installed", "reason"),
    [
        (
            InstalledVersions("2.14.1+cu128", "0.7.0", "cp311", "linux_x86_64"),
            "it was built for torch 2.14.1+cu130, but torch 2.14.1+cu128 is installed",
        ),
        (
            InstalledVersions("2.11.0+cu130", "0.7.0", "cp311", "linux_x86_64"),
            "it was built for torch 2.14.1+cu130, but torch 2.11.0+cu130 is installed",
        ),
        (
            InstalledVersions("2.14.1+cu130", None, "cp311", "linux_x86_64"),
            "it was built for OpenEquivariance 0.7.0, but OpenEquivariance is not installed",
        ),
        (
            InstalledVersions("2.14.1+cu130", "0.7.0", "cp312", "linux_x86_64"),
            "it was built for CPython cp311, but CPython cp312 is installed",
        ),
        (
            InstalledVersions("2.14.1+cu130", "0.7.0", "cp311", "linux_aarch64"),
            "it runs on Linux x86_64 only, and this is linux_aarch64",
        ),
    ],
)
def test_each_mismatch_is_named(wheel, installed, reason):
    status = prebuilt_extension(installed)
    assert status.extension is None and status.reason == reason


def test_damaged_library_or_manifest(wheel):
    package, manifest = wheel
    (package / "libtorch_tp_jit.so").write_bytes(LIBRARY + b"!")
    status = prebuilt_extension(HERE)
    assert status.extension is None and "not the manifest's" in status.reason
    (package / "libtorch_tp_jit.so").unlink()
    assert "is missing" in prebuilt_extension(HERE).reason
    write(package, {k: v for k, v in manifest.items() if k != "glibc_max"})
    assert prebuilt_extension(HERE).reason.endswith("lacks glibc_max")
    (package / "manifest.json").write_text("{not json")
    assert "is unreadable" in prebuilt_extension(HERE).reason


def test_installed_versions_read_without_import():
    import torch

    assert torch_full_version() == torch.__version__
    assert installed_versions().python_tag == f"cp{sys.version_info[0]}{sys.version_info[1]}"
