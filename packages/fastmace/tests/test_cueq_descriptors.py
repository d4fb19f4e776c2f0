"""cuEquivariance's symmetric-contraction descriptors kept in the cache root
(fastmace.models.cueq_descriptors): a later process reads what an earlier one built, gets the
same descriptor, and a damaged entry or an unchecked library version costs only time."""

from __future__ import annotations

import dataclasses
import json

import cuequivariance as cue
import pytest
from conftest import run_python

from fastmace.models import cueq_descriptors
from fastmace.models.checkpoint import import_mace
from fastmace.models.cueq_descriptors import descriptors_cached_on_disk


@pytest.fixture(autouse=True)
def _mace_imported_as_fastmace_does() -> None:
    """mace-torch changes the process when imported (a variable, warning filters): import it
    the contained way first, as fm.load does before any conversion."""
    import_mace()


# A small product block: builds in a fraction of a second.
BUILD = """
import json
import numpy as np
import cuequivariance as cue
from cuequivariance.group_theory.experimental.mace import symmetric_contractions as library
from fastmace.models.cueq_descriptors import descriptors_cached_on_disk
with descriptors_cached_on_disk():
    result = library.symmetric_contraction(
        cue.Irreps("O3", "4x0e+4x1o+4x2e"), cue.Irreps("O3", "4x0e+4x1o"), [1, 2, 3]
    )
# What the descriptor computes on fixed inputs, and its projection: the same descriptor gives
# the same numbers (its pickle's bytes may differ from process to process).
polynomial, projection = result[0].polynomial, result[1]
inputs = [np.random.default_rng(0).standard_normal(o.size) for o in polynomial.inputs]
print(json.dumps({
    "built_here": library._symmetric_contraction_cached.cache_info().misses,
    "values": [float(v) for v in polynomial(*inputs)[0]],
    "projection": projection.tolist(),
}))
"""


def _build(env: dict[str, str]) -> dict[str, object]:
    result = run_python(BUILD, env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_later_process_reads_the_descriptor_an_earlier_one_built(clean_env, tmp_path):
    clean_env["FASTMACE_CACHE"] = str(tmp_path / "cache")
    first, second = _build(clean_env), _build(clean_env)
    assert first["built_here"] == 1 and second["built_here"] == 0
    assert first["values"] == second["values"]  # the same descriptor, read back
    assert first["projection"] == second["projection"]
    kept = list((tmp_path / "cache" / "compile" / "cueq").iterdir())
    assert [entry.name.startswith("symmetric-contraction-cached-") for entry in kept] == [True]


def test_a_damaged_entry_is_built_again_and_replaced(monkeypatch, tmp_path):
    monkeypatch.setenv("FASTMACE_CACHE", str(tmp_path / "cache"))
    irreps_in, irreps_out = cue.Irreps("O3", "2x0e+2x1o"), cue.Irreps("O3", "2x0e")
    builder = cueq_descriptors.BUILDERS[0]
    version = cueq_descriptors._version(builder.package)
    path = cueq_descriptors.entry_path(builder, version, irreps_in, irreps_out, (1, 2))
    path.write_bytes(b"not a pickle")
    module = cueq_descriptors._module(builder.module)
    with descriptors_cached_on_disk():
        built = module._symmetric_contraction_cached(irreps_in, irreps_out, (1, 2))
    assert cueq_descriptors._read(path) is not None
    assert len(built) == 2


def test_an_entry_this_user_did_not_write_is_not_unpickled(monkeypatch, tmp_path):
    """A pickle planted in a shared cache root (or a kept one changed since) runs no code:
    it is ignored and built again (issue 33)."""
    monkeypatch.setenv("FASTMACE_CACHE", str(tmp_path / "cache"))
    irreps_in, irreps_out = cue.Irreps("O3", "2x0e+2x1o"), cue.Irreps("O3", "2x0e")
    builder = cueq_descriptors.BUILDERS[0]
    version = cueq_descriptors._version(builder.package)
    path = cueq_descriptors.entry_path(builder, version, irreps_in, irreps_out, (1, 2))
    module = cueq_descriptors._module(builder.module)
    with descriptors_cached_on_disk():
        module._symmetric_contraction_cached(irreps_in, irreps_out, (1, 2))
    assert cueq_descriptors._read(path) is not None  # written and vouched for here
    planted = tmp_path / "planted"
    # Unpickling this would create the file: the sign that code ran.
    path.write_bytes(_pickle_that_calls(planted.touch))
    assert cueq_descriptors._read(path) is None
    assert not planted.exists()


def _pickle_that_calls(function) -> bytes:
    import pickle

    class Planted:
        def __reduce__(self):
            return (function, ())

    return pickle.dumps(Planted())


def test_the_libraries_are_given_back_and_unchecked_versions_are_left_alone(monkeypatch):
    for index, builder in enumerate(cueq_descriptors.BUILDERS):
        module = cueq_descriptors._module(builder.module)
        original = getattr(module, builder.function)
        with descriptors_cached_on_disk():
            assert getattr(module, builder.function) is not original
        assert getattr(module, builder.function) is original
        unchecked = dataclasses.replace(builder, checked_versions=("99.",))
        others = [b for i, b in enumerate(cueq_descriptors.BUILDERS) if i != index]
        monkeypatch.setattr(cueq_descriptors, "BUILDERS", (unchecked, *others))
        with descriptors_cached_on_disk():
            assert getattr(module, builder.function) is original
        monkeypatch.undo()


@pytest.mark.parametrize("backend", ["cueq"])
def test_a_model_converted_from_kept_descriptors_is_the_same(clean_env, tmp_path, backend):
    clean_env["FASTMACE_CACHE"] = str(tmp_path / "cache")
    code = (
        "import fastmace as fm\n"
        "from fastmace.models.checkpoint import content_hash\n"
        f"loaded = fm.load('template:tiny', backend='{backend}')\n"
        "print(content_hash(loaded.module), loaded.conversion_check.passed)\n"
    )
    runs = [run_python(code, clean_env) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
    lines = [run.stdout.strip().splitlines()[-1] for run in runs]
    assert lines[0] == lines[1] and lines[0].endswith("True")
    assert any((tmp_path / "cache" / "compile" / "cueq").iterdir())


def test_a_float64_model_is_not_converted_from_a_float32_models_descriptors(monkeypatch, tmp_path):
    """mace-torch builds its coupling matrices in torch's default dtype: a projection kept
    while a float32 model was converted is too coarse for float64, whose conversion check
    (float64 rounding) then failed."""
    from fastmace.models.load import load

    monkeypatch.setenv("FASTMACE_CACHE", str(tmp_path / "cache"))
    kept = tmp_path / "cache" / "compile" / "cueq"
    load("template:tiny", backend="cueq", dtype="float32")
    float32_entries = set(kept.iterdir())
    loaded = load("template:tiny", backend="cueq", dtype="float64")  # raises if it disagrees
    assert loaded.conversion_check.passed
    assert len(set(kept.iterdir()) - float32_entries) == len(float32_entries)  # its own
