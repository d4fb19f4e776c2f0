"""A user's own model file runs through fm.md, ``fastmace md`` and ``fastmace run`` with the
trust options of fm.load: ``sha256`` (checked before loading) or ``trusted``."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from conftest import EXAMPLE, run_fastmace

import fastmace as fm
from fastmace.models import files
from fastmace.models.files import ChecksumMismatchError, ModelFileError

DEMO = Path(files.__file__).parent / "demo" / "demo-emt-cu.model"
WRONG = "0" * 64
SHORT = dict(ensemble="nve", steps=4, timestep_fs=1.0, initial_temperature_K=100.0,
             thermo_every=2, trajectory_every=0, block_steps=2)  # fmt: skip


@pytest.fixture
def own_model(tmp_path) -> tuple[Path, str]:
    """The demo model saved as a user's own file, and its SHA-256."""
    path = tmp_path / "my-model.model"
    shutil.copyfile(DEMO, path)
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def test_md_runs_an_own_file_with_its_sha256(own_model, tmp_path):
    path, sha = own_model
    result = fm.md(EXAMPLE, model=path, sha256=sha, output=tmp_path / "run", **SHORT)
    assert (tmp_path / "run" / "thermo.csv").is_file()
    assert result.steps == 4 and result.model == str(path)
    trusted = fm.md(EXAMPLE, model=path, trusted=True, **SHORT)
    assert trusted.steps == 4


def test_md_subprocess_child_gets_the_trust_options(own_model, tmp_path):
    path, sha = own_model
    runner = fm.RunnerConfig(subprocess=True)
    result = fm.md(EXAMPLE, model=path, sha256=sha, runner=runner, output=tmp_path / "r", **SHORT)
    assert (tmp_path / "r" / "thermo.csv").is_file() and result.steps == 4


def test_md_refuses_a_path_without_trust_and_a_wrong_hash_before_anything(own_model, tmp_path):
    path, _ = own_model
    with pytest.raises(ModelFileError, match="trusted=True"):
        fm.md(EXAMPLE, model=path, output=tmp_path / "a", **SHORT)
    with pytest.raises(ChecksumMismatchError, match=WRONG):
        fm.md(EXAMPLE, model=path, sha256=WRONG, output=tmp_path / "b", **SHORT)
    with pytest.raises(ValueError, match="'abc' is not a SHA-256"):
        fm.md(EXAMPLE, model=path, sha256="abc", output=tmp_path / "c", **SHORT)
    with pytest.raises(TypeError, match="trusted='yes' must be True or False"):
        fm.md(EXAMPLE, model=path, trusted="yes", output=tmp_path / "d", **SHORT)
    assert not any((tmp_path / name).exists() for name in "abcd")


def _cli(path: Path, *extra: str) -> list[str]:
    return ["md", str(EXAMPLE), "--model", str(path), "--steps", "4",
            "--thermo-every", "2", "--traj-every", "0", "--temperature", "100", *extra]  # fmt: skip


def test_cli_md_sha256_and_trusted(own_model, clean_env, tmp_path):
    path, sha = own_model
    ran = run_fastmace(_cli(path, "--sha256", sha, "--output", str(tmp_path / "run")), clean_env)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert (tmp_path / "run" / "thermo.csv").is_file()
    wrong = run_fastmace(_cli(path, "--sha256", WRONG, "--output", str(tmp_path / "w")), clean_env)
    assert wrong.returncode == 1 and "SHA-256" in wrong.stderr and "Traceback" not in wrong.stderr
    assert not (tmp_path / "w").exists()
    bad = run_fastmace(_cli(path, "--sha256", "xyz", "--output", str(tmp_path / "x")), clean_env)
    assert bad.returncode == 1 and "'xyz' is not a SHA-256" in bad.stderr
    trusted = run_fastmace(_cli(path, "--trusted", "--output", str(tmp_path / "t")), clean_env)
    assert trusted.returncode == 0, trusted.stderr[-2000:]


def test_run_config_sha256_and_bad_trust_values(own_model, clean_env, tmp_path):
    path, sha = own_model
    common = (
        f'structure = "{EXAMPLE}"\nmodel = "{path.name}"\nensemble = "nve"\nsteps = 4\n'
        "initial_temperature_K = 100\nthermo_every = 2\ntrajectory_every = 0\n"
    )
    good = tmp_path / "good.toml"
    good.write_text(common + f'output = "out"\nsha256 = "{sha}"\n')
    ran = run_fastmace(["run", str(good)], clean_env, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert (tmp_path / "out" / "thermo.csv").is_file()
    for name, line, message in [
        ("wrong", f'sha256 = "{WRONG}"', "SHA-256"),
        ("short", 'sha256 = "abc"', "'abc' is not a SHA-256"),
        ("number", "sha256 = 7", "sha256 = 7 must be a string"),
        ("word", 'trusted = "yes"', "trusted = 'yes' must be true or false"),
    ]:
        config = tmp_path / f"{name}.toml"
        config.write_text(common + f'output = "{name}-out"\n{line}\n')
        refused = run_fastmace(["run", str(config)], clean_env, cwd=tmp_path)
        assert refused.returncode == 1 and message in refused.stderr, refused.stderr[-2000:]
        assert not (tmp_path / f"{name}-out").exists()
