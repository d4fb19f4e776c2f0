"""A run imports mace-torch's model code, not its training tools (models/lean_import.py), and
mace-torch's package still offers every name afterwards."""

from __future__ import annotations

import json

from conftest import run_python

# Modules only mace-torch's trainer needs: its training loop and argument parser, and what
# they import (torchmetrics pulls in torchvision and its models).
TRAINING_ONLY = (
    "mace.tools.train", "mace.tools.arg_parser", "mace.tools.finetuning_utils",
    "mace.cli.visualise_train", "torchmetrics", "torch_ema", "torchvision",
)  # fmt: skip

RUN = """
import io, json, sys
import ase.build
import fastmace as fm
atoms = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True).repeat(2)
atoms.rattle(0.02, seed=1)
fm.md(atoms, model="demo-emt-cu", steps=5, temperature_K=300, progress=io.StringIO())
imported = [name for name in {training!r} if name in sys.modules]
# What the trainer's users reach through the package still comes, then and only then.
from mace.tools import build_default_arg_parser, TensorDict
import mace.tools
print(json.dumps({{"imported": imported, "logger": mace.tools.MetricsLogger.__name__,
                  "after": "mace.tools.train" in sys.modules}}))
"""


def test_a_run_imports_no_training_module(clean_env, tmp_path):
    clean_env["FASTMACE_CACHE"] = str(tmp_path / "cache")
    result = run_python(RUN.format(training=TRAINING_ONLY), clean_env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["imported"] == []
    assert report["logger"] == "MetricsLogger" and report["after"] is True


def test_the_package_keeps_working_when_imported_before_fastmace(clean_env, tmp_path):
    """mace-torch already imported whole: nothing is replaced, a run goes on as before."""
    code = "import mace.tools\n" + RUN.format(training=())
    result = run_python(code, clean_env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1])["after"] is True
