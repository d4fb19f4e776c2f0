"""Runs say nothing on stderr but their progress: the libraries' warnings about their own code are
silenced where FastMACE raises them (runtime/quiet.py, oeq/host_extension.py), and only there.

Each path the H200 run of 2026-12-01 printed warnings on is exercised on the CPU where it can
be (template models, conversion to cuEquivariance, OpenEquivariance's import with its GPU-side
notice and without package metadata); the GPU runs themselves are marked ``gpu`` (on the GPU
machine: ``. .gpu/setup.sh && PYTHONPATH=$PWD/packages/fastmace/src python3 -m pytest -q -m gpu
packages/fastmace/tests/test_quiet_run.py``, about two minutes).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
import warnings
from pathlib import Path

import pytest
import torch
from conftest import EXAMPLE, run_fastmace, run_python

from fastmace.oeq.stderr_filter import stderr_lines_dropped
from fastmace.runtime.quiet import NOISE, library_noise_silenced

# A Python warning ("...: UserWarning: ...", "warnings.warn(", OEq's printed "Warning: ...")
# or a torch log line ("W1201 ...").
WARNED = re.compile(r"Warning\b|warnings\.warn|^[WE]\d{4} ", re.MULTILINE)

# Each entry of NOISE as its library words it, with the module the warning is attributed to.
LIBRARY_TEXTS = {
    (FutureWarning, "`torch.jit.script` is deprecated. Please switch to `torch.compile` or "
                    "`torch.export`."): "torch.jit._script",
    (DeprecationWarning, "`torch.jit.script` is deprecated. Please switch to `torch.compile` or "
                         "`torch.export`."): "torch.jit._script",
    (UserWarning, "Environment variable TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD detected, since the"
                  "`weights_only` argument was not explicitly passed"): "torch.serialization",
    (UserWarning, "The TorchScript type system doesn't support instance-level annotations on "
                  "empty non-base types in `__init__`."): "ast",
    (UserWarning, "To copy construct from a tensor, it is recommended to use "
                  "sourceTensor.detach().clone()"): "mace.modules.models",
    (UserWarning, "cuequivariance_ops_torch is not available. Falling back to naive "
                  "implementation."): "cuequivariance_torch.primitives.segmented_polynomial",
}  # fmt: skip


def _shown(category: type[Warning], text: str, module: str) -> bool:
    """Whether a warning raised from ``module`` reaches the user (everything shown outside)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with library_noise_silenced():
            warnings.warn_explicit(text, category, f"{module}.py", 1, module=module)
    return bool(caught)


def test_every_silenced_warning_is_one_libraries_message_and_nothing_else():
    assert len(LIBRARY_TEXTS) == len(NOISE)
    for (category, text), module in LIBRARY_TEXTS.items():
        assert not _shown(category, text, module), text
        assert _shown(Warning, text, module), text  # only its category is silenced
    # The generic texts are silenced only where the library raises them.
    copy_construct = next(text for (_, text), m in LIBRARY_TEXTS.items() if m.startswith("mace"))
    assert _shown(UserWarning, copy_construct, "users_script")
    assert _shown(UserWarning, "cuequivariance_ops_torch is not available", "users_script")
    assert _shown(UserWarning, "some other warning of torch", "torch.jit._script")


def test_only_the_libraries_line_is_dropped_from_stderr_and_the_stream_is_put_back():
    stream = io.StringIO()
    with contextlib.redirect_stderr(stream):
        with stderr_lines_dropped("Warning: Could not determine oeq version"):
            print("Warning: Could not determine oeq version: no metadata", file=sys.stderr)
            print("kept", end="", file=sys.stderr)
            print(" line", file=sys.stderr)
            print("unfinished", end="", file=sys.stderr)
        assert sys.stderr is stream
    assert stream.getvalue() == "kept line\nunfinished"


def test_fastmace_md_on_the_cpu_prints_no_warnings(clean_env, tmp_path):
    args = ["md", str(EXAMPLE), "--temperature", "300", "--steps", "4", "-o", str(tmp_path / "r")]
    result = run_fastmace(args, clean_env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert WARNED.search(result.stderr) is None, result.stderr
    assert "done: 4 steps" in result.stderr


def test_a_template_converted_to_cueq_on_the_cpu_prints_no_warnings(clean_env, tmp_path):
    # Template construction (e3nn's scripted codegen), mace's converter (atomic_numbers copy),
    # cuEquivariance's CPU fallback notice and the check against the e3nn copy.
    args = ["md", str(EXAMPLE), "--model", "template:tiny", "--backend", "cueq",
            "--temperature", "300", "--steps", "2", "-o", str(tmp_path / "r")]  # fmt: skip
    result = run_fastmace(args, clean_env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert WARNED.search(result.stderr) is None, result.stderr
    assert "cuEquivariance's PyTorch fallback (CPU)" in result.stdout + result.stderr


def test_noise_stays_silent_when_a_library_resets_the_filters_inside():
    """A library may set ``simplefilter("always")`` while it runs, ahead of FastMACE's filters
    (on the GPU machine torch 2.11's deprecation then reached the user): the block's warnings
    are recorded, and only those that are not noise are shown, once per place."""
    deprecated = NOISE[1]
    text = "`torch.jit.script` is deprecated. Please switch to `torch.compile` or `torch.export`."
    assert deprecated.category is DeprecationWarning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with library_noise_silenced():
            warnings.simplefilter("always")
            warnings.warn_explicit(text, DeprecationWarning, "/site/torch/jit/_script.py", 1488)
            for _ in range(3):
                warnings.warn_explicit("the user should see this", UserWarning, "users.py", 3)
    assert [(w.category, str(w.message)) for w in caught] == [
        (UserWarning, "the user should see this")
    ]


def test_openequivariances_jit_fallback_notice_is_not_shown_whatever_its_reasons(clean_env):
    # On a GPU FastMACE sets OEQ_JIT_EXTENSION=1 for OEq's import, and OEq's notice then starts
    # with that reason: the same notice here, from a user's variable.
    env = {**clean_env, "OEQ_JIT_EXTENSION": "1"}
    code = "import fastmace as fm; fm.load('template:tiny', backend='e3nn')"
    result = run_python(code, env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert WARNED.search(result.stderr) is None, result.stderr


def test_openequivariance_without_package_metadata_is_quiet_and_recorded(clean_env, tmp_path):
    # As on the GPU machine, where OEq runs from a source tree: site-packages without its
    # dist-info (symlinks), and python -S so the real site-packages stays off the path.
    site = Path(torch.__file__).parents[1]
    farm = tmp_path / "site"
    farm.mkdir()
    for entry in site.iterdir():
        if not entry.name.startswith("openequivariance-"):
            (farm / entry.name).symlink_to(entry)
    source = Path(__file__).parents[1] / "src"
    env = {**clean_env, "PYTHONPATH": os.pathsep.join([str(source), str(farm)])}
    code = (
        "import json, fastmace as fm, fastmace.provenance as p\n"
        "fm.load('template:tiny', backend='e3nn')\n"
        "print(json.dumps(p.software()['packages']['openequivariance']))\n"
    )
    result = run_python(code, env, python_options=["-S"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert WARNED.search(result.stderr) is None, result.stderr
    recorded = json.loads(result.stdout.strip().splitlines()[-1])
    assert recorded == f"unknown (no package metadata; {farm / 'openequivariance'})"


def test_the_users_warning_filters_and_stderr_are_left_as_they_were():
    import fastmace as fm

    def calls() -> None:
        fm.md(EXAMPLE, temperature_K=300.0, steps=2)
        fm.load("template:tiny", backend="cueq")

    calls()  # torch's and mace's own imports add filters
    before, stream = list(warnings.filters), sys.stderr
    calls()
    assert warnings.filters == before
    assert sys.stderr is stream


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("backend", ["cueq", "hybrid"])
def test_fastmace_md_on_the_gpu_prints_no_warnings(clean_env, tmp_path, backend):
    # The H200 run of 2026-12-01 printed 18 warnings here. FASTMACE_CACHE is kept so that the
    # hybrid backend reuses the machine's OEq host extension instead of building it.
    env = {**clean_env, **{k: v for k, v in os.environ.items() if k == "FASTMACE_CACHE"}}
    args = ["md", str(EXAMPLE), "--model", "template:mp0-small", "--backend", backend,
            "--dtype", "float32", "--temperature", "300", "--steps", "40",
            "-o", str(tmp_path / "r")]  # fmt: skip
    result = run_fastmace(args, env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert WARNED.search(result.stderr) is None, result.stderr
