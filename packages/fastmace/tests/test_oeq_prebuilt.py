"""The prebuilt extension's manifest: the library for the installed torch minor is picked and
checked before anything is loaded; every refusal says why."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
from conftest import PYTHON_TAG, lay_out_prebuilt

from fastmace.oeq.prebuilt import (
    InstalledVersions,
    installed_versions,
    prebuilt_extension,
    torch_full_version,
)

BUILT_FOR = ("2.11.0+cu130", "2.14.1+cu130")


def installed(torch: str | None = "2.14.1+cu130", **changes) -> InstalledVersions:
    values = dict(
        torch=torch, openequivariance="0.7.0", python_tag=PYTHON_TAG, platform="linux_x86_64",
        torch_cuda="13.0", torch_cxx11_abi=True,
    )  # fmt: skip
    values.update(changes)
    return InstalledVersions(**values)


@pytest.fixture
def wheel(tmp_path, monkeypatch):
    """An installed fastmace_oeq_ext (files only, libraries for torch 2.11 and 2.14) on sys.path."""
    libraries = lay_out_prebuilt(tmp_path / "site", BUILT_FOR)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    yield tmp_path / "site" / "fastmace_oeq_ext", libraries
    sys.modules.pop("fastmace_oeq_ext", None)


def manifest_of(package):
    return json.loads((package / "manifest.json").read_text())


def write(package, manifest):
    (package / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    ("torch", "minor", "built_for"),
    [("2.14.1+cu130", "2.14", "2.14.1+cu130"), ("2.11.0+cu130", "2.11", "2.11.0+cu130"),
     ("2.14.0+cu130", "2.14", "2.14.1+cu130"), ("2.11.1+cu132", "2.11", "2.11.0+cu130")],
)  # fmt: skip
def test_the_library_for_the_installed_minor_is_picked_without_import(
    wheel, torch, minor, built_for
):
    _, libraries = wheel
    status = prebuilt_extension(installed(torch, torch_cuda="13." + torch[-1]))
    assert status.extension is not None, status.reason
    assert status.extension.library == libraries[minor]
    assert status.extension.built_for_torch == built_for
    assert built_for in status.reason
    assert "fastmace_oeq_ext" not in sys.modules


@pytest.mark.skipif(
    importlib.util.find_spec("fastmace_oeq_ext") is not None,
    reason="fastmace-oeq-ext is installed in this environment",
)
def test_not_installed():
    status = prebuilt_extension(installed())
    assert status.extension is None and status.reason == "fastmace-oeq-ext is not installed"


@pytest.mark.parametrize(
    ("environment", "reason"),
    [
        (
            installed("2.12.0+cu130"),
            "it holds libraries for torch 2.11, 2.14, and torch 2.12.0+cu130 is installed: "
            "install a torch it was built for (pip install 'torch==2.14.*'), or let FastMACE "
            "build the extension with the host toolchain",
        ),
        (
            installed(None),
            "torch is not installed (the wheel holds libraries for torch 2.11, 2.14)",
        ),
        (
            installed("2.14.1+cu128", torch_cuda="12.8"),
            "its torch 2.14 library is built for CUDA 13.0, but torch 2.14.1+cu128 uses CUDA 12.8",
        ),
        (
            installed("2.14.1+cpu", torch_cuda=None),
            "its torch 2.14 library is built for CUDA 13.0, but torch 2.14.1+cpu is built "
            "without CUDA",
        ),
        (
            installed(torch_cxx11_abi=False),
            "its torch 2.14 library uses the C++11 ABI, and torch 2.14.1+cu130 does not",
        ),
        (
            installed(torch_cxx11_abi=None),
            "torch 2.14.1+cu130's C++ ABI cannot be read from its libc10.so",
        ),
        (
            installed(openequivariance=None),
            "it was built for OpenEquivariance 0.7.0, but OpenEquivariance is not installed",
        ),
        (
            installed(python_tag="cp99"),
            f"it was built for CPython {PYTHON_TAG}, but CPython cp99 is installed",
        ),
        (
            installed(platform="linux_aarch64"),
            "it runs on Linux x86_64 only, and this is linux_aarch64",
        ),
    ],
)
def test_each_mismatch_is_named(wheel, environment, reason):
    status = prebuilt_extension(environment)
    assert status.extension is None and status.reason == reason


def test_damaged_library_or_manifest(wheel):
    package, libraries = wheel
    manifest = manifest_of(package)
    libraries["2.14"].write_bytes(b"changed")
    status = prebuilt_extension(installed())
    assert status.extension is None and "not the manifest's" in status.reason
    assert prebuilt_extension(installed("2.11.0+cu130")).extension is not None  # the other one
    libraries["2.14"].unlink()
    assert "is missing" in prebuilt_extension(installed()).reason
    del manifest["libraries"][1]["sha256"]
    write(package, manifest)
    assert prebuilt_extension(installed()).reason.endswith("lacks libraries[1].sha256")
    (package / "manifest.json").write_text("{not json")
    assert "is unreadable" in prebuilt_extension(installed()).reason


def test_a_version_1_manifest_is_refused_with_the_fix(wheel):
    package, _ = wheel
    write(package, {"torch": "2.14.1+cu130", "library": "libtorch_tp_jit.so"})
    reason = prebuilt_extension(installed()).reason
    assert "has version None, and this FastMACE reads version 2" in reason
    assert "install the fastmace-oeq-ext built from this FastMACE's repository" in reason


def test_installed_versions_read_without_import():
    import torch

    found = installed_versions()
    assert torch_full_version() == found.torch == torch.__version__
    assert found.torch_cuda == torch.version.cuda
    assert found.torch_cxx11_abi == torch._C._GLIBCXX_USE_CXX11_ABI
    assert found.python_tag == PYTHON_TAG
