"""`import fastmace`: no torch, no files, soft file locks before torch, FASTMACE_SOFT_FILE_LOCKS."""

from __future__ import annotations

import json

import pytest
from conftest import run_python, tree

REPORT = (
    "import json, sys, filelock, fastmace; info = fastmace.runtime_info(); "
    "print(json.dumps({'info': info.__dict__, 'soft': filelock.FileLock is filelock.SoftFileLock,"
    " 'modules': sorted(m for m in ('torch', 'mace', 'e3nn', 'ase') if m in sys.modules)}))"
)


def report(env: dict[str, str], prelude: str = "") -> dict:
    result = run_python(prelude + REPORT, env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_import_loads_no_heavy_module_and_switches_to_soft_locks(clean_env):
    result = report(clean_env)
    assert result["modules"] == []
    assert result["soft"] is True
    assert result["info"]["lock_mode"] == "soft"
    assert result["info"]["late_switch"] is False
    assert "FASTMACE_SOFT_FILE_LOCKS unset" in result["info"]["lock_reason"]


def test_import_creates_no_file(clean_env, tmp_path):
    clean_env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    before = tree(tmp_path)
    result = run_python("import fastmace, fastmace.cli.main, fastmace.doctor", clean_env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert tree(tmp_path) == before


def test_torch_imported_afterwards_binds_the_soft_lock(clean_env):
    code = (
        "import fastmace, filelock, torch.utils._filelock as tf; "
        "print(issubclass(tf.FileLock, filelock.SoftFileLock))"
    )
    result = run_python(code, clean_env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"


def test_torch_first_keeps_kernel_locks_and_reports_late_switch(clean_env):
    result = report(clean_env, prelude="import torch.utils._filelock; ")
    assert result["soft"] is False
    assert result["info"]["lock_mode"] == "kernel"
    assert result["info"]["late_switch"] is True
    assert "import fastmace first" in result["info"]["lock_reason"]


def test_soft_locks_demanded_after_torch_raises(clean_env):
    clean_env["FASTMACE_SOFT_FILE_LOCKS"] = "1"
    result = run_python("import torch; import fastmace", clean_env)
    assert result.returncode != 0
    assert "RuntimeError" in result.stderr
    assert "FASTMACE_SOFT_FILE_LOCKS=1" in result.stderr
    assert "Import fastmace first" in result.stderr


def test_soft_locks_demanded_before_torch(clean_env):
    clean_env["FASTMACE_SOFT_FILE_LOCKS"] = "1"
    result = report(clean_env)
    assert result["soft"] is True
    assert result["info"]["lock_reason"] == "FASTMACE_SOFT_FILE_LOCKS=1"


def test_kernel_locks_on_request_leave_cuda_cache_alone(clean_env):
    clean_env["FASTMACE_SOFT_FILE_LOCKS"] = "0"
    result = report(clean_env)
    assert result["soft"] is False
    assert result["info"]["lock_mode"] == "kernel"
    assert result["info"]["late_switch"] is False
    assert result["info"]["cuda_cache"] == "left alone"
    assert "FASTMACE_SOFT_FILE_LOCKS=0" in result["info"]["cuda_cache_reason"]


@pytest.mark.parametrize("value", ["yes", "true", "2", " 1"])
def test_bad_soft_lock_setting_does_not_fail_the_import(clean_env, value):
    # The import goes on (as if unset) and says why: runs refuse it, doctor reports it.
    clean_env["FASTMACE_SOFT_FILE_LOCKS"] = value
    info = report(clean_env)["info"]
    assert info["lock_mode"] == "soft"
    assert f"FASTMACE_SOFT_FILE_LOCKS={value!r} is not allowed" in info["lock_reason"]
    assert "1 or 0" in info["lock_reason"] and "taken as unset" in info["lock_reason"]


def test_relative_cuda_cache_path_does_not_fail_the_import(clean_env):
    clean_env["CUDA_CACHE_PATH"] = "relative/cache"
    info = report(clean_env)["info"]
    assert info["cuda_cache"] == "left alone"
    assert "CUDA_CACHE_PATH='relative/cache' is not allowed" in info["cuda_cache_reason"]
    assert "absolute path" in info["cuda_cache_reason"]


def test_runtime_info_is_frozen():
    import dataclasses

    import fastmace

    info = fastmace.runtime_info()
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.lock_mode = "kernel"  # type: ignore[misc]


def test_cuda_cache_left_alone_off_nfs(clean_env):
    result = report(clean_env)
    info = result["info"]
    assert info["cuda_cache"] == "left alone"
    assert info["cuda_cache_path"] == clean_env["HOME"] + "/.nv/ComputeCache"
    assert info["cuda_cache_on_nfs"] is False


def test_fm_md_shows_users_only_their_parameters_and_plain_defaults():
    """Issue 33: the API reference showed internal parameters and a constant's name."""
    import inspect

    import fastmace as fm
    from fastmace.ensemble_catalog import DEFAULT_ENSEMBLE

    parameters = inspect.signature(fm.md).parameters
    assert not [name for name in parameters if name.startswith("_")]
    assert parameters["ensemble"].default == DEFAULT_ENSEMBLE


def test_fm_md_and_its_request_name_the_same_arguments_with_the_same_defaults():
    """fm.md passes each keyword on to MDRequest by name (issue 32: no dict(locals())), and a
    run config's keys are MDRequest's fields: an argument added to one and not the other, or
    with another default, fails here rather than being dropped."""
    import dataclasses
    import inspect

    import fastmace as fm
    from fastmace.cli.md import RUN_KEYS
    from fastmace.runs import MDRequest

    parameters = inspect.signature(fm.md).parameters
    asked = {
        name: parameter.default
        for name, parameter in parameters.items()
        if name not in ("structure", "progress", "runner", "ensemble_settings")
    }
    fields = {f.name: f.default for f in dataclasses.fields(MDRequest)}
    assert fields.pop("ensemble_settings") is dataclasses.MISSING  # a factory: {}
    assert fields == asked
    assert set(RUN_KEYS) == {"structure", *asked} - {"config"}
    request = MDRequest.from_arguments({"steps": 7, "reproducible": True, "tau_fs": 50.0})
    assert request.ensemble_settings == {"tau_fs": 50.0}
    assert MDRequest.from_arguments(request.arguments()) == request


def test_fm_md_hands_each_keyword_to_its_request_under_its_own_name(monkeypatch):
    """A distinct value for every keyword reaches the request's field of the same name (a
    slip such as seed=steps in fm.md's hand-written call fails here). The first stage is
    replaced by one that keeps the request and stops."""
    import inspect

    import fastmace as fm
    from fastmace import api

    class Stop(Exception):
        pass

    kept = {}

    def keep(structure, request, runner, progress):
        kept["request"] = request
        raise Stop

    monkeypatch.setattr(api, "_check_call", keep)
    names = [
        name
        for name in inspect.signature(fm.md).parameters
        if name not in ("structure", "progress", "runner", "ensemble_settings")
    ]
    given = {name: object() for name in [*names, "tau_fs"]}
    with pytest.raises(Stop):
        fm.md(None, **given)
    arguments = kept["request"].arguments()
    assert all(arguments[name] is value for name, value in given.items())
