"""fm.load on real mace-torch models: description, heads, trust, backends, no side effects."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import run_python

import fastmace as fm
from fastmace.models.backends import (
    BackendUnavailableError,
    availability,
    check_conversion,
    convert,
)
from fastmace.models.checkpoint import NotAMaceModelError, content_hash
from fastmace.models.files import ModelFileError
from fastmace.models.label_table import UnknownLabelError
from fastmace.models.reference import check_structure, evaluate
from fastmace.models.templates import template


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "tiny.model"
    torch.save(template("tiny", seed=3), path)
    return path


def test_template_description():
    loaded = fm.load("template:tiny", seed=1)
    d = loaded.description
    assert (d.model_type, d.dtype, d.heads) == ("ScaleShiftMACE", "float64", ("Default",))
    assert d.r_max == 4.0 and d.atomic_numbers == (1, 6, 8, 29) and d.num_interactions == 2
    assert loaded.backend == "e3nn" and loaded.device == "cpu"
    assert "e3nn" in loaded.backend_reason


def test_content_hash_identifies_weights(tiny_file):
    assert content_hash(template("tiny", seed=3)) == content_hash(template("tiny", seed=3))
    assert content_hash(template("tiny", seed=3)) != content_hash(template("tiny", seed=4))
    loaded = fm.load(tiny_file, trusted=True)
    assert loaded.description.content_hash == content_hash(template("tiny", seed=3))


def test_path_needs_trust_or_hash(tiny_file):
    with pytest.raises(ModelFileError, match="trusted=True"):
        fm.load(tiny_file)
    from fastmace.models.files import sha256_of

    loaded = fm.load(tiny_file, sha256=sha256_of(tiny_file))
    assert loaded.file.verified and loaded.licence.startswith("unknown")


def test_not_a_mace_model(tmp_path):
    dict_file = tmp_path / "dict.pt"
    torch.save({"weights": torch.zeros(3)}, dict_file)
    with pytest.raises(NotAMaceModelError, match="holds a dict, not a MACE model"):
        fm.load(dict_file, trusted=True)
    module_file = tmp_path / "linear.pt"
    torch.save(torch.nn.Linear(2, 2), module_file)
    with pytest.raises(NotAMaceModelError, match="Linear is not a MACE model"):
        fm.load(module_file, trusted=True)
    junk = tmp_path / "junk.model"
    junk.write_bytes(b"\x00not a zip or pickle")
    with pytest.raises(NotAMaceModelError, match="not a loadable PyTorch checkpoint"):
        fm.load(junk, trusted=True)


def test_unknown_names():
    with pytest.raises(UnknownLabelError, match="Did you mean"):
        fm.load("mp0-mediun")
    with pytest.raises(UnknownLabelError, match="unknown template"):
        fm.load("template:nope")
    with pytest.raises(ValueError, match="dtype='float16'"):
        fm.load("template:tiny", dtype="float16")
    with pytest.raises(ValueError, match="device='gpu' is not a device"):
        fm.load("template:tiny", device="gpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="torch sees no CUDA GPU here"):
            fm.load("template:tiny", device="cuda")


def test_missing_label_file_is_not_downloaded(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTMACE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelFileError, match="download=True"):
        fm.load("mp0-small")
    assert not (tmp_path / "cache").exists()


def test_multi_head_template_needs_a_head_choice_only_when_ambiguous():
    model = template("tiny")
    model.heads = ["a", "b"]
    from fastmace.models.checkpoint import describe
    from fastmace.models.load import _resolve_head

    description = describe(model)
    with pytest.raises(UnknownLabelError, match=r"2 heads .*choose one with head="):
        _resolve_head(None, description)
    assert _resolve_head("b", description) == "b"
    with pytest.raises(UnknownLabelError, match="no head 'c'"):
        _resolve_head("c", description)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_cueq_on_the_cpu_agrees_with_e3nn(dtype, cache):
    loaded = fm.load("template:tiny", backend="cueq", dtype=dtype)
    check = loaded.conversion_check
    assert check is not None and check.passed and check.dtype == dtype
    assert loaded.backend == "cueq" and loaded.dtype == dtype
    assert set(loaded.timings) == {"read_s", "convert_s", "check_s"}
    assert all(seconds > 0 for seconds in loaded.timings.values())
    # Independently of the built-in check: forces on another structure agree too.
    atoms = check_structure(loaded.description.atomic_numbers, seed=7)
    reference = evaluate(loaded.reference.to(getattr(torch, dtype)), atoms)
    converted = evaluate(loaded.module, atoms)
    tolerance = 1e-10 if dtype == "float64" else 1e-4
    np.testing.assert_allclose(converted.forces, reference.forces, atol=tolerance)


def test_conversion_check_catches_a_wrong_model():
    model = template("tiny")
    converted = convert(model, "cueq", "cpu")
    with torch.no_grad():
        next(converted.interactions[0].parameters()).add_(0.05)
    check = check_conversion(model, converted, "cueq")
    assert not check.passed
    assert check.force_error_ev_per_a > check.force_tolerance_ev_per_a


def test_gpu_only_backends_are_explained_on_the_cpu():
    for backend in ("oeq", "hybrid"):
        found = availability(backend, "cpu")
        assert not found.available and "CUDA" in found.reason
        with pytest.raises(BackendUnavailableError, match=f"the {backend} backend is unavailable"):
            fm.load("template:tiny", backend=backend)
    assert availability("cueq", "cpu").available
    with pytest.raises(ValueError, match="unknown backend 'fast'"):
        availability("fast", "cpu")


def test_load_leaves_no_process_wide_change(clean_env, tiny_file):
    code = f"""
import json, os, warnings
import fastmace as fm
import torch
before = (str(torch.get_default_dtype()), dict(os.environ), repr(warnings.filters))
fm.load("template:tiny", backend="cueq", dtype="float32")
fm.load({str(tiny_file)!r}, trusted=True, dtype="float64")
after = (str(torch.get_default_dtype()), dict(os.environ), repr(warnings.filters))
import mace  # mace-torch itself sets this variable when imported; it must be gone
print(json.dumps({{
    "dtype": [before[0], after[0]],
    "env_changed": sorted(set(before[1].items()) ^ set(after[1].items())),
    "filters_same": before[2] == after[2],
}}))
"""
    result = run_python(code, clean_env)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["dtype"] == ["torch.float32", "torch.float32"]
    assert report["env_changed"] == []
    assert report["filters_same"] is True
