"""fm.md's environment variables hold for the run only, and a run that comes too late says so."""

from __future__ import annotations

import json
import os

import ase.build
import pytest
import torch

import fastmace as fm
from fastmace.runtime import environment


def copper():
    atoms = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 2, 1))
    atoms.rattle(0.02, seed=5)
    return atoms


def test_fm_md_gives_the_users_environment_back(tmp_path, monkeypatch) -> None:
    for name in environment.REPRODUCIBLE:
        monkeypatch.delenv(name, raising=False)  # monkeypatch restores whatever was there
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # the user's own value
    fm.md(
        copper(), model="demo-emt-cu", temperature_K=300.0, steps=2, reproducible=True,
        output=tmp_path / "run",
    )  # fmt: skip
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    for name in set(environment.REPRODUCIBLE) - {"CUBLAS_WORKSPACE_CONFIG"}:
        assert name not in os.environ, name
    # During the run the plan's values were in force, and the run's record says so.
    document = json.loads((tmp_path / "run" / "metadata.json").read_text())
    during = {c["name"]: c["after"] for c in document["environment"]["changes"]}
    assert during["CUBLAS_WORKSPACE_CONFIG"] == environment.REPRODUCIBLE["CUBLAS_WORKSPACE_CONFIG"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_plan_that_comes_after_cuda_started_says_so() -> None:
    torch.zeros(1, device="cuda")  # CUDA starts in this process
    with pytest.warns(UserWarning, match="CUDA has already started"):
        fm.md(copper(), model="demo-emt-cu", temperature_K=300.0, steps=2, reproducible=True)
