"""Every variable's parsing, its error message, and the rules for setting variables."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastmace.runtime import environment as ev
from fastmace.runtime.environment import EnvironmentVariableError

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("reader", "name"),
    [(ev.soft_file_locks, "FASTMACE_SOFT_FILE_LOCKS"), (ev.oeq_prebuilt, "FASTMACE_OEQ_PREBUILT")],
)
def test_switches(reader, name):
    assert reader({}) is None
    assert reader({name: ""}) is None
    assert reader({name: "1"}) is True
    assert reader({name: "0"}) is False
    for bad in ("yes", "TRUE", "01", "-1"):
        with pytest.raises(EnvironmentVariableError) as raised:
            reader({name: bad})
        assert isinstance(raised.value, ValueError)
        assert f"{name}={bad!r}" in str(raised.value)
        assert "unset, or set it to 1 or 0" in str(raised.value)


@pytest.mark.parametrize(
    ("reader", "name"),
    [
        (ev.cache_override, "FASTMACE_CACHE"),
        (ev.models_directory, "FASTMACE_MODELS"),
        (ev.cuda_driver_library, "OEQ_CUDA_DRIVER_LIBRARY"),
    ],
)
def test_paths(reader, name):
    assert reader({}) is None
    assert reader({name: "/abs/dir"}) == Path("/abs/dir")
    assert reader({name: "~/x", "HOME": "/home/bob"}) == Path("/home/bob/x")
    with pytest.raises(EnvironmentVariableError, match=f"{name}='relative/dir'.*absolute path"):
        reader({name: "relative/dir"})


def test_max_jobs():
    assert ev.max_jobs({}) == 4
    assert ev.max_jobs({"MAX_JOBS": "12"}) == 12
    for bad in ("0", "-2", "four", "1.5"):
        with pytest.raises(EnvironmentVariableError, match=f"MAX_JOBS={bad!r}.*positive integer"):
            ev.max_jobs({"MAX_JOBS": bad})


def test_xdg_cache_home_and_home():
    assert ev.xdg_cache_home({"HOME": "/h"}) == Path("/h/.cache")
    assert ev.xdg_cache_home({"HOME": "/h", "XDG_CACHE_HOME": "/x"}) == Path("/x")
    # The XDG spec says a relative value is to be ignored.
    assert ev.xdg_cache_home({"HOME": "/h", "XDG_CACHE_HOME": "rel"}) == Path("/h/.cache")


def test_torch_extensions_dir():
    assert ev.torch_extensions_dir({"HOME": "/h"}) == Path("/h/.cache/torch_extensions")
    assert ev.torch_extensions_dir({"HOME": "/h", "XDG_CACHE_HOME": "/x"}) == Path(
        "/x/torch_extensions"
    )
    assert ev.torch_extensions_dir({"TORCH_EXTENSIONS_DIR": "/t"}) == Path("/t")


def test_cuda_cache_variables():
    assert ev.cuda_cache_path({"HOME": "/h"}) == Path("/h/.nv/ComputeCache")
    assert ev.cuda_cache_path({"HOME": "/h", "CUDA_CACHE_PATH": "/c"}) == Path("/c")
    assert ev.cuda_cache_disable({}) is None
    assert ev.cuda_cache_disable({"CUDA_CACHE_DISABLE": "0"}) == "0"


def test_set_if_unset_keeps_the_users_value():
    env = {"A": "mine"}
    assert ev.set_if_unset("A", "ours", "test", env) is False
    assert env["A"] == "mine"
    assert ev.set_if_unset("B", "ours", "test", env) is True
    assert env["B"] == "ours"
    names = [(c.name, c.after) for c in ev.changes()[-2:]]
    assert names == [("A", "mine"), ("B", "ours")]


def test_compile_caches_where_unset(tmp_path):
    env: dict[str, str] = {}
    values = ev.configure_compile_caches(tmp_path, env)
    assert values == {
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
        "TRITON_CACHE_DIR": str(tmp_path / "triton"),
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
        "ENABLE_AOT_AUTOGRAD_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
    }


def test_compile_caches_keep_users_values(tmp_path):
    env = {
        "TORCHINDUCTOR_CACHE_DIR": "/mine/ind",
        "TRITON_CACHE_DIR": "/mine/tri",
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "0",
    }
    values = ev.configure_compile_caches(tmp_path, env)
    assert values["TORCHINDUCTOR_CACHE_DIR"] == "/mine/ind"
    assert values["TRITON_CACHE_DIR"] == "/mine/tri"
    assert values["TORCHINDUCTOR_FX_GRAPH_CACHE"] == "0"
    assert values["ENABLE_AOT_AUTOGRAD_CACHE"] == "1"


def test_inductor_default_counts_as_unset(tmp_path):
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    assert ev.inductor_default_cache_dir() == default_cache_dir()
    env = {"TORCHINDUCTOR_CACHE_DIR": default_cache_dir()}
    values = ev.configure_compile_caches(tmp_path, env)
    assert values["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor")


def test_doctor_looks_where_compilations_keep_their_files(tmp_path):
    """The doctor's lock check and start-up cache check read the directory the compile caches
    are configured to, Inductor's default counting as unset there too."""
    from fastmace.doctor import inductor_lock_directories

    for given in ({}, {"TORCHINDUCTOR_CACHE_DIR": ev.inductor_default_cache_dir()},
                  {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "mine")}):  # fmt: skip
        env = {"FASTMACE_CACHE": str(tmp_path / "root"), **given}
        looked = ev.compiled_graphs_directory(tmp_path / "root", env)
        configured = ev.configure_compile_caches(tmp_path / "root", dict(env))
        assert str(looked) == configured["TORCHINDUCTOR_CACHE_DIR"]
        assert looked / "locks" in inductor_lock_directories(env)


def test_cueq_kernel_cache_in_the_cache_root_unless_the_user_chose(tmp_path):
    env: dict[str, str] = {}
    assert ev.configure_cueq_kernel_cache(tmp_path, env) == str(tmp_path / "cueq-nvrtc")
    assert env["CUEQUIVARIANCE_OPS_NVRTC_CACHE_DIR"] == str(tmp_path / "cueq-nvrtc")
    env = {"CUEQUIVARIANCE_OPS_NVRTC_CACHE_DIR": "/mine/kernels"}
    assert ev.configure_cueq_kernel_cache(tmp_path, env) == "/mine/kernels"


def test_allocator():
    env: dict[str, str] = {}
    assert ev.configure_allocator(False, env) is None
    assert ev.configure_allocator(True, env) == "expandable_segments:True"
    env = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}
    assert ev.configure_allocator(True, env) == "max_split_size_mb:128"


def test_fp64_emulation():
    env: dict[str, str] = {"CUBLAS_EMULATION_STRATEGY": "performant"}
    values = ev.configure_fp64_emulation(None, env)
    assert values == {
        "CUBLAS_EMULATE_DOUBLE_PRECISION": "1",
        "CUBLAS_EMULATION_STRATEGY": "performant",
    }
    values = ev.configure_fp64_emulation(55, env)
    assert values["CUBLAS_FIXEDPOINT_EMULATION_MANTISSA_BIT_COUNT"] == "55"
    with pytest.raises(ValueError, match="fp64_emulation_mantissa_bits=0"):
        ev.configure_fp64_emulation(0, {})


def test_reproducible_overwrites():
    env = {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}
    ev.configure_reproducible(env)
    assert env == {
        "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
        "TORCHINDUCTOR_DETERMINISTIC": "1",
        "CUEQUIVARIANCE_OPS_U1D_ALGOS": "1,1",
    }


def test_docs_name_every_variable():
    text = (REPO / "docs" / "environment.md").read_text()
    names = {variable.name for variable in ev.READ} | set(ev.SET)
    missing = sorted(name for name in names if f"`{name}`" not in text)
    assert missing == []
