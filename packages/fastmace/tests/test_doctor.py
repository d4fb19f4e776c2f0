"""`fastmace doctor`: order, markers, exit code, fixes, and that it changes nothing."""

from __future__ import annotations

import io
import json
import os
import sys
import time
from importlib import util as importlib_util
from pathlib import Path

import pytest
from conftest import lay_out_prebuilt, run_fastmace, run_python, tree

import fastmace
from fastmace.doctor import (
    CHECKS,
    CheckFailed,
    DoctorCheck,
    DoctorContext,
    check_file_locks,
    check_model_files,
    run_check,
    run_doctor,
)
from fastmace.models.label_table import checkpoints
from fastmace.runtime.compile_costs import CompileIdentity, record_cost_s
from fastmace.runtime.mounts import parse_mount_table
from fastmace.runtime.startup import apply_at_import

ORDER = [
    "GPU and driver", "torch", "MACE", "cuEquivariance", "OpenEquivariance", "Triton", "NVRTC",
    "graph-longrange", "torch-dftd", "environment", "cache root", "file locks", "Inductor locks",
    "start-up cache", "model files",
]  # fmt: skip
NOT_IMPORTED = ("mace", "openequivariance", "cuequivariance_ops_torch", "cuequivariance_torch")


def lines_by_check(stdout: str) -> dict[str, str]:
    result = {}
    for line in stdout.splitlines():
        marker, _, rest = line.partition(" ")
        name, _, detail = rest.strip().partition(": ")
        result[name] = f"{marker} {detail}"
    return result


@pytest.fixture
def doctor_env(clean_env, tmp_path):
    clean_env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    clean_env["FASTMACE_CACHE"] = str(tmp_path / "fm-cache")
    return clean_env


def test_checks_are_in_the_documented_order():
    assert [check.name for check in CHECKS] == ORDER
    required = {check.name for check in CHECKS if check.required}
    assert required == {
        "torch", "MACE", "cuEquivariance", "environment", "cache root", "file locks",
    }  # fmt: skip


def test_doctor_on_this_cpu_machine(doctor_env, tmp_path):
    result = run_fastmace(["doctor"], doctor_env, cwd=tmp_path)
    lines = result.stdout.splitlines()
    assert [lines_by_check(line).popitem()[0] for line in lines] == ORDER
    checks = lines_by_check(result.stdout)
    assert checks["environment"].startswith("[ok]") and "FASTMACE_CACHE" in checks["environment"]
    assert checks["cache root"].startswith("[ok]")
    assert "from FASTMACE_CACHE; will be created on first use" in checks["cache root"]
    assert checks["file locks"].startswith("[ok]") and "soft locks" in checks["file locks"]
    assert checks["torch"].startswith("[ok]") and "CUDA" in checks["torch"]
    assert checks["MACE"] == "[ok] mace-torch 0.3.16"
    assert checks["model files"].startswith("[ok] no checkpoint files in")
    assert checks["start-up cache"].startswith("[ok]")
    assert "no compiled graphs" in checks["start-up cache"]
    assert "no compilation recorded" in checks["start-up cache"]
    if not _has_gpu():
        assert checks["GPU and driver"].startswith("[warn] no CUDA GPU visible to torch")
        assert "any structure and model runs on the CPU, slowly" in checks["GPU and driver"]
        # The CUDA kernels serve only GPU runs: their absence is a warning, and a healthy
        # CPU-only machine passes.
        if importlib_util.find_spec("cuequivariance_ops_torch") is None:
            assert checks["cuEquivariance"].startswith(
                "[warn] cuequivariance_ops_torch is not installed"
            )
            assert "pip install cuequivariance-ops-torch-cu13" in checks["cuEquivariance"]
            assert "this machine has no GPU to use it" in checks["cuEquivariance"]
        assert not any(line.startswith("[FAIL]") for line in lines), result.stdout
        assert result.returncode == 0
    for line in lines:
        if not line.startswith("[ok]"):
            assert ": " in line and any(w in line for w in ("install", "set ", "remove", "GPU"))


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def test_doctor_changes_nothing_and_imports_no_kernel_package(doctor_env, tmp_path):
    assert importlib_util.find_spec("mace") is not None, "the test needs mace-torch installed"
    assert importlib_util.find_spec("openequivariance") is not None, (
        "the test needs openequivariance installed (nox -s tests installs it)"
    )
    # Make the OEq check walk real directories: an old build directory with no lock.
    extensions = tmp_path / "home" / ".cache" / "torch_extensions"
    (extensions / "py311_cu130").mkdir(parents=True)
    doctor_env["TORCH_EXTENSIONS_DIR"] = str(extensions)
    code = (
        "import io, json, sys, fastmace\n"
        "from fastmace.doctor import run_doctor\n"
        "out = io.StringIO(); code = run_doctor(out=out)\n"
        f"print(json.dumps({{'code': code, 'out': out.getvalue(), "
        f"'imported': [m for m in {NOT_IMPORTED!r} if m in sys.modules]}}))\n"
    )
    before = tree(tmp_path)
    result = run_python(code, doctor_env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["imported"] == []
    assert tree(tmp_path) == before
    assert not (tmp_path / "fm-cache").exists()


def test_cache_root_under_a_file_fails(doctor_env, tmp_path):
    (tmp_path / "a-file").write_text("x")
    doctor_env["FASTMACE_CACHE"] = str(tmp_path / "a-file" / "cache")
    result = run_fastmace(["doctor", "--no-hash"], doctor_env)
    line = lines_by_check(result.stdout)["cache root"]
    assert line.startswith("[FAIL]") and "is not writable" in line
    assert "set FASTMACE_CACHE to a writable directory outside the environment" in line
    assert result.returncode == 1


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only directories")
def test_read_only_cache_root_fails(doctor_env, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    doctor_env["FASTMACE_CACHE"] = str(locked / "cache")
    line = lines_by_check(run_fastmace(["doctor"], doctor_env).stdout)["cache root"]
    assert line.startswith("[FAIL]") and "is not writable" in line


def test_cache_root_inside_the_environment_fails(doctor_env):
    doctor_env["FASTMACE_CACHE"] = os.path.join(sys.prefix, "fastmace-cache")
    line = lines_by_check(run_fastmace(["doctor"], doctor_env).stdout)["cache root"]
    assert line.startswith("[FAIL]") and "inside the Python environment" in line


def test_relative_cache_variable_fails_with_its_name(doctor_env):
    doctor_env["FASTMACE_CACHE"] = "relative/cache"
    line = lines_by_check(run_fastmace(["doctor"], doctor_env).stdout)["cache root"]
    assert line.startswith("[FAIL]") and "FASTMACE_CACHE='relative/cache'" in line


def test_stale_lock_is_listed_with_its_removal_command(doctor_env, tmp_path):
    build = tmp_path / "ext" / "py311_cu130" / "libtorch_tp_jit"
    build.mkdir(parents=True)
    lock = build / "lock"
    lock.write_text("")
    old = time.time() - 7200
    os.utime(lock, (old, old))
    fresh = tmp_path / "fm-cache" / "oeq" / "torch-extensions-1" / "x" / "lock"
    fresh.parent.mkdir(parents=True)
    fresh.write_text("")
    doctor_env["TORCH_EXTENSIONS_DIR"] = str(tmp_path / "ext")
    result = run_fastmace(["doctor"], doctor_env)
    line = lines_by_check(result.stdout)["OpenEquivariance"]
    assert line.startswith("[warn]")
    assert "1 stale build lock(s)" in line and f"rm -f {lock}" in line
    assert str(fresh) not in line
    assert lock.exists()


def test_a_stale_inductor_header_lock_is_listed_with_its_removal_command(doctor_env, tmp_path):
    """The lock a killed compilation leaves in Inductor's /tmp directory (a CI run of bee0311
    waited ten minutes on one, twice): listed, with the command, and left in place."""
    doctor_env["TMPDIR"], doctor_env["LOGNAME"] = str(tmp_path), "someone"
    locks = tmp_path / "torchinductor_someone" / "precompiled_headers" / "locks"
    locks.mkdir(parents=True)
    lock = locks / "cn4is32y.lock"
    lock.write_text("")
    old = time.time() - 7200
    os.utime(lock, (old, old))
    (locks / "fresh.lock").write_text("")
    line = lines_by_check(run_fastmace(["doctor"], doctor_env).stdout)["Inductor locks"]
    assert line.startswith("[warn]") and "1 stale lock(s)" in line and f"rm -f {lock}" in line
    assert "fresh.lock" not in line and lock.exists()


def test_stale_inductor_kernel_locks_are_listed_in_both_inductor_directories(doctor_env, tmp_path):
    """Inductor's kernel compilations lock in ``<its cache dir>/locks``: FastMACE's runs use
    ``<cache root>/inductor``, a torch without FastMACE its default directory. Soft-lock files
    a killed process left in either (46 on the development machine stalled the test suite's
    compilations ten minutes each) are listed; the fresh one and other files are not."""
    doctor_env["TMPDIR"], doctor_env["LOGNAME"] = str(tmp_path), "someone"
    old = time.time() - 7200
    stale = []
    for directory in (tmp_path / "fm-cache" / "inductor" / "locks",
                      tmp_path / "torchinductor_someone" / "locks"):  # fmt: skip
        directory.mkdir(parents=True)
        lock = directory / "c3kbn6wq2vhxw.lock"
        lock.write_text("")
        os.utime(lock, (old, old))
        stale.append(lock)
        (directory / "fresh.lock").write_text("")
    kept = tmp_path / "fm-cache" / "inductor" / "locks" / "notes.txt"
    kept.write_text("")
    os.utime(kept, (old, old))
    line = lines_by_check(run_fastmace(["doctor"], doctor_env).stdout)["Inductor locks"]
    assert line.startswith("[warn]") and "2 stale lock(s)" in line, line
    assert all(str(lock) in line for lock in stale)
    assert "fresh.lock" not in line and "notes.txt" not in line


def test_model_files(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    table = checkpoints()
    (models / table[0].file).write_bytes(b"not the released file")
    (models / table[1].file).write_bytes(b"")
    (models / "my-own.model").write_bytes(b"x")
    (models / (table[2].file + ".part")).write_bytes(b"partial")
    ctx = DoctorContext({"FASTMACE_MODELS": str(models), "FASTMACE_CACHE": str(tmp_path / "c")},
                        fastmace.runtime_info())  # fmt: skip
    failed = run_check(DoctorCheck("model files", False, check_model_files), ctx)
    assert failed.marker == "[warn]"
    assert f"{models / table[0].file} does not match its SHA-256" in failed.detail
    assert f"fm.load({table[0].id!r}, download=True)" in failed.detail
    assert (models / table[0].file).exists()

    ctx.hash_models = False
    listed = run_check(DoctorCheck("model files", False, check_model_files), ctx)
    assert listed.ok
    assert "1 checkpoint(s) found, hashes not checked (--no-hash)" in listed.detail
    assert f"{models / table[1].file} (empty, skipped)" in listed.detail
    assert f"not in the label table: {models / 'my-own.model'}" in listed.detail
    assert ".part" not in listed.detail


def test_file_locks_fail_with_kernel_locks_on_nfs(tmp_path):
    mounts = parse_mount_table("overlay / overlay rw 0 0\nsrv:/home /home nfs4 rw 0 0\n")
    environ = {"HOME": "/home/a", "FASTMACE_SOFT_FILE_LOCKS": "0"}
    info = apply_at_import(dict(environ), loaded_modules={"torch"}, mounts=mounts)
    ctx = DoctorContext(environ, info, mounts=mounts)
    with pytest.raises(CheckFailed) as failed:
        check_file_locks(ctx)
    message = str(failed.value)
    assert "kernel file locks" in message and "CUDA driver cache" in message
    assert "import fastmace before torch" in message and "CUDA_CACHE_DISABLE=1" in message
    environ_fixed = {"HOME": "/home/a", "CUDA_CACHE_DISABLE": "1"}
    info = apply_at_import(dict(environ_fixed), loaded_modules=set(), mounts=mounts)
    assert "soft locks" in check_file_locks(DoctorContext(environ_fixed, info, mounts=mounts))


def _cuda_kernels_missing(ctx):
    raise CheckFailed("the CUDA kernels are missing: pip install them", needs_gpu=True)


@pytest.mark.parametrize(("has_gpu", "marker"), [(False, "[warn]"), (True, "[FAIL]")])
def test_what_only_a_gpu_uses_fails_only_where_there_is_a_gpu(has_gpu, marker):
    ctx = DoctorContext({}, fastmace.runtime_info())
    ctx.has_gpu = has_gpu  # what the machine has, as the probe would find it
    result = run_check(DoctorCheck("kernels", True, _cuda_kernels_missing), ctx)
    assert result.marker == marker and result.required == has_gpu
    assert result.detail.startswith("the CUDA kernels are missing: pip install them")
    assert ("no GPU to use it" in result.detail) == (not has_gpu)


def test_crashed_check_is_reported_and_others_still_run():
    def explodes(ctx):
        raise ZeroDivisionError("boom")

    checks = (
        DoctorCheck("first", True, explodes),
        DoctorCheck("second", False, lambda ctx: "fine"),
    )
    out = io.StringIO()
    saved = os.environ.get("CUDA_CACHE_DISABLE")
    try:
        code = run_doctor(out=out, checks=checks)
    finally:
        if saved is None:
            os.environ.pop("CUDA_CACHE_DISABLE", None)
        else:
            os.environ["CUDA_CACHE_DISABLE"] = saved
    first, second = out.getvalue().splitlines()
    assert first.startswith("[FAIL] first: the check crashed (ZeroDivisionError: boom)")
    assert "run fastmace --debug doctor for the traceback" in first
    assert second == "[ok]   second: fine"
    assert code == 1


def test_debug_shows_the_traceback_of_a_crashed_check(doctor_env, tmp_path):
    (tmp_path / "not-a-dir").write_text("")
    doctor_env["FASTMACE_MODELS"] = str(tmp_path / "not-a-dir")
    plain = run_fastmace(["doctor"], doctor_env)
    line = lines_by_check(plain.stdout)["model files"]
    assert line.startswith("[warn] the check crashed (NotADirectoryError")
    assert "fastmace --debug doctor" in line
    assert "Traceback" not in plain.stderr
    debug = run_fastmace(["--debug", "doctor"], doctor_env)
    assert "Traceback (most recent call last)" in debug.stderr
    assert "check_model_files" in debug.stderr


def test_no_hash_skips_hashing(doctor_env, tmp_path):
    models = tmp_path / "fm-cache" / "models"
    models.mkdir(parents=True)
    (models / checkpoints()[0].file).write_bytes(b"wrong")
    hashed = lines_by_check(run_fastmace(["doctor"], doctor_env).stdout)["model files"]
    assert hashed.startswith("[warn]") and "does not match its SHA-256" in hashed
    unhashed = lines_by_check(run_fastmace(["doctor", "--no-hash"], doctor_env).stdout)
    assert unhashed["model files"].startswith("[ok] 1 checkpoint(s) found, hashes not checked")


def test_cuda_cache_is_disabled_in_doctors_process(doctor_env):
    code = (
        "import io, os\nfrom fastmace.doctor import run_doctor\n"
        "run_doctor(out=io.StringIO())\nprint(os.environ['CUDA_CACHE_DISABLE'])"
    )
    doctor_env["CUDA_CACHE_DISABLE"] = "0"
    result = run_python(code, doctor_env)
    assert result.stdout.strip() == "1", result.stderr


def test_the_checkout_is_the_installed_fastmace():
    # The index serves an unrelated project under our name; the tests must run against ours.
    repo = Path(__file__).resolve().parents[3]
    assert Path(fastmace.__file__).resolve().is_relative_to(repo / "packages" / "fastmace")


def test_prebuilt_extension_needs_no_compiler(doctor_env, tmp_path):
    from fastmace.oeq.prebuilt import torch_full_version

    here = torch_full_version()
    libraries = lay_out_prebuilt(tmp_path / "site", ["2.11.0+cu130", here])
    doctor_env["PYTHONPATH"] = str(tmp_path / "site")
    doctor_env["FASTMACE_OEQ_PREBUILT"] = "1"
    line = lines_by_check(run_fastmace(["doctor"], doctor_env).stdout)["OpenEquivariance"]
    minor = ".".join(here.split(".")[:2])
    assert line == (
        "[ok] openequivariance 0.7.0; host extension: prebuilt (fastmace-oeq-ext 0.7.0.post2, "
        f"built for torch {here}, {libraries[minor]}); no compiler needed"
    )


def test_mismatched_prebuilt_extension_is_explained(doctor_env, tmp_path):
    lay_out_prebuilt(tmp_path / "site", ["2.0.0+cu130", "2.1.0+cu130"])
    doctor_env["PYTHONPATH"] = str(tmp_path / "site")
    line = lines_by_check(run_fastmace(["doctor"], doctor_env).stdout)["OpenEquivariance"]
    assert "not used" in line and "it holds libraries for torch 2.0, 2.1, and torch " in line
    doctor_env["FASTMACE_OEQ_PREBUILT"] = "1"
    refused = lines_by_check(run_fastmace(["doctor"], doctor_env).stdout)["OpenEquivariance"]
    assert refused.startswith("[warn]")
    assert "FASTMACE_OEQ_PREBUILT=1 refuses the toolchain build" in refused
    assert "install a torch it was built for (pip install 'torch==2.1.*')" in refused


@pytest.mark.parametrize(
    ("name", "value", "allowed"),
    [("FASTMACE_SOFT_FILE_LOCKS", "yes", "leave it unset, or set it to 1 or 0"),
     ("CUDA_CACHE_PATH", "relative/cache", "give an absolute path")],
)  # fmt: skip
def test_bad_variable_read_at_import_is_a_failed_check(doctor_env, name, value, allowed):
    # Such a value used to make `import fastmace` raise, so doctor itself could not run.
    doctor_env[name] = value
    result = run_fastmace(["doctor"], doctor_env)
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.returncode == 1
    line = lines_by_check(result.stdout)["environment"]
    assert line.startswith(f"[FAIL] {name}={value!r} is not allowed: {allowed}")
    assert "Correct or unset it" in line and "docs/environment.md" in line


def test_bad_prebuilt_setting_is_a_failure_not_a_crash(doctor_env):
    doctor_env["FASTMACE_OEQ_PREBUILT"] = "yes"
    line = lines_by_check(run_fastmace(["doctor"], doctor_env).stdout)["OpenEquivariance"]
    assert line.startswith("[warn] FASTMACE_OEQ_PREBUILT='yes' is not allowed")
    assert "crashed" not in line


def test_graph_longrange_must_be_the_version_mace_torch_can_call(monkeypatch):
    from fastmace import doctor
    from fastmace.vocabulary import GRAPH_LONGRANGE_VERSION

    (check,) = [c for c in CHECKS if c.name == "graph-longrange"]
    monkeypatch.setattr(doctor, "_version", lambda name: "0.4.4")
    with pytest.raises(CheckFailed, match=f"graph-longrange=={GRAPH_LONGRANGE_VERSION}"):
        check.run(None)
    monkeypatch.setattr(doctor, "_version", lambda name: GRAPH_LONGRANGE_VERSION)
    assert check.run(None) == f"graph-longrange {GRAPH_LONGRANGE_VERSION}"


def test_doctor_says_what_the_cache_holds_for_start_up(doctor_env, tmp_path):
    """Compiled code and the compilation records a second run reuses, read without a change."""
    cache = Path(doctor_env["FASTMACE_CACHE"])
    (cache / "inductor" / "fx").mkdir(parents=True)
    (cache / "inductor" / "fx" / "graph").write_bytes(b"x" * 2_000_000)
    identity = CompileIdentity(
        model_hash="ab" * 32, backend="cueq", dtype="float32", n_atoms=13_824,
        gpu="NVIDIA H200", torch="2.11.0+cu130",
    )  # fmt: skip
    assert record_cost_s(identity, 17.94, environ={"FASTMACE_CACHE": str(cache)})
    (cache / "compile" / "costs" / "damaged.json").write_text("{")
    (cache / "compile" / "aot").mkdir(parents=True)
    (cache / "compile" / "aot" / "package.pt2").write_bytes(b"x" * 3_000_000)
    (cache / "compile" / "converted").mkdir(parents=True)
    (cache / "compile" / "converted" / "model.pt").write_bytes(b"x" * 4_000_000)
    before = tree(cache)
    line = lines_by_check(run_fastmace(["doctor", "--no-hash"], doctor_env).stdout)[
        "start-up cache"
    ]
    assert line.startswith("[ok]")
    assert "compiled graphs 2.0 MB (1 files)" in line
    assert "potentials compiled ahead of time 3.0 MB (1 files)" in line
    assert "converted models 4.0 MB (1 files)" in line
    assert "compilations recorded: 13,824 atoms cueq float32 on NVIDIA H200: 17.9 s" in line
    assert tree(cache) == before
