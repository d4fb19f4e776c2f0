"""OEq's host extension: loader contract, interception, stand-in CUDA home, choice, stale locks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest
from conftest import run_python

from fastmace.oeq import choice, extension_loader, toolchain
from fastmace.oeq.cuda_home import prepare_cuda_home

oeq_installed = pytest.mark.skipif(
    not any(d.metadata["Name"] == "openequivariance" for d in metadata.distributions()),
    reason="openequivariance is not installed",
)


@oeq_installed
def test_openequivariance_loader_is_the_one_we_checked():
    """Fails loudly when a new OpenEquivariance changes what FastMACE relies on."""
    assert metadata.version("openequivariance") == extension_loader.CHECKED_VERSION
    files = metadata.files("openequivariance") or []
    source = next(f for f in files if str(f).endswith("_torch/extlib/__init__.py"))
    text = Path(source.locate()).read_text(encoding="utf-8")
    for needed in (
        "torch.utils.cpp_extension.load(",
        f'"{extension_loader.EXTENSION_NAME}"',
        "_wait_for_torch_build_lock",
        '"OEQ_JIT_EXTENSION"',
    ):
        assert needed in text, f"OpenEquivariance's loader no longer contains {needed}"


def test_interception_answers_one_name_and_restores_the_loader():
    import torch.utils.cpp_extension as cpp_extension

    real = cpp_extension.load
    seen = []

    def provide(real_load, sources, options):
        seen.append((real_load, sources, options))
        return "module"

    with extension_loader.intercepting_extension_load(provide):
        assert cpp_extension.load is not real
        answer = cpp_extension.load("libtorch_tp_jit", ("a.cpp",), extra_cflags=["-O3"])
    assert cpp_extension.load is real
    assert answer == "module"
    assert seen == [(real, ["a.cpp"], {"extra_cflags": ["-O3"]})]


def _prepare(oeq_cache: Path, driver: Path):
    lib_dir = toolchain.nvidia_wheel_lib_dir()
    if lib_dir is None:
        pytest.skip("the CUDA 13 wheels are not installed")
    return prepare_cuda_home(oeq_cache, toolchain.cuda_wheel_include_dirs(), lib_dir, driver)


def test_stand_in_cuda_home_links_the_wheels_and_driver_and_has_no_nvcc(tmp_path):
    driver = tmp_path / "driver" / "libcuda.so.1"
    driver.parent.mkdir()
    driver.write_bytes(b"")
    home = _prepare(tmp_path / "oeq", driver)
    assert home.root.parent == tmp_path / "oeq" / "cuda-runtime"
    assert (home.include / "cuda_runtime_api.h").is_file()
    assert os.readlink(home.lib / "libcuda.so.1") == str(driver)
    assert (home.lib / "libcudart.so").resolve().name == "libcudart.so.13"
    entries = [p for p in home.root.rglob("*") if not p.is_dir() or p.is_symlink()]
    assert [p for p in entries if not p.is_symlink()] == [home.nvcc]  # links, and the stand-in
    call = subprocess.run(
        [str(home.nvcc), "--version"], capture_output=True, text=True, env={"PATH": "/bin"}
    )
    assert call.returncode == 1 and "stand-in" in call.stderr
    assert "nvcc --version" in home.attempts_log.read_text()
    # Prepared again: the same directory, untouched; another driver: another stand-in.
    assert _prepare(tmp_path / "oeq", driver) == home
    other = tmp_path / "other" / "libcuda.so.1"
    other.parent.mkdir()
    other.write_bytes(b"")
    assert _prepare(tmp_path / "oeq", other).root != home.root
    assert not list((tmp_path / "oeq" / "cuda-runtime").glob(".staging-*"))


def test_choice_without_toolchain_or_driver_is_unavailable_with_every_reason(tmp_path):
    environ = {"PATH": str(tmp_path), "FASTMACE_OEQ_PREBUILT": "0", "HOME": str(tmp_path)}
    code = (
        "import json; from fastmace.oeq.choice import choose_host_extension as c; "
        "x = c(); print(json.dumps([x.method, x.reason, x.prebuilt_skipped]))"
    )
    result = run_python(code, {**environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert result.returncode == 0, result.stderr
    method, reason, skipped = json.loads(result.stdout)
    assert method == choice.UNAVAILABLE and skipped == "FASTMACE_OEQ_PREBUILT=0"
    assert "a C++ compiler" in reason and "ninja" in reason


@oeq_installed
def test_stale_lock_in_torch_extensions_dir_does_not_stall_the_import(clean_env, tmp_path):
    """OEq waits 300 s for a lock in torch's extension directory; FastMACE's import does not."""
    import torch

    user_dir = tmp_path / "torch_extensions"
    tag = f"py{sys.version_info.major}{sys.version_info.minor}{sys.abiflags}"
    cuda = f"cu{torch.version.cuda.replace('.', '')}" if torch.version.cuda else "cpu"
    lock = user_dir / f"{tag}_{cuda}" / "libtorch_tp_jit" / "lock"
    lock.parent.mkdir(parents=True)
    lock.write_text("")
    old = time.time() - 7200
    os.utime(lock, (old, old))
    clean_env["TORCH_EXTENSIONS_DIR"] = str(user_dir)
    clean_env["FASTMACE_CACHE"] = str(tmp_path / "cache")
    code = (
        "import json; from fastmace.models.checkpoint import import_mace; import_mace(); "
        "from fastmace.oeq import host_extension as oeq; "
        "print(json.dumps(oeq.record().as_dict()))"
    )
    started = time.monotonic()
    result = run_python(code, clean_env)
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    assert elapsed < 150, f"the import took {elapsed:.0f} s: it waited on the stale lock"
    record = json.loads(result.stdout.strip().splitlines()[-1])
    private = Path(record["variables"]["TORCH_EXTENSIONS_DIR"])
    assert private.parent == tmp_path / "cache" / "oeq"
    assert private.name.startswith("torch-extensions-")
    assert not private.exists(), "the per-process directory outlived its process"
    assert lock.exists(), "the user's lock file is not ours to delete"
    assert not list((tmp_path / "cache").rglob("build.ninja")), "something was compiled"
    if record["how"] == "unavailable":  # no GPU driver here: nothing is built, it says why
        assert "libcuda.so.1" in record["reason"] or "FASTMACE_OEQ_PREBUILT" in record["reason"]
