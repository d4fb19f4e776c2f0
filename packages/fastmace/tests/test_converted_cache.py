"""Converted models kept in the cache root (fastmace.models.converted_cache): a later process
reuses the conversion and its check without importing mace-torch's trainer; other weights,
heads or library versions never get a kept entry that is not theirs; an entry this user did not
write, or one damaged since, is converted again and runs no code."""

from __future__ import annotations

import copy
import json
import pickle
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_python

from fastmace.models import backends, converted_cache
from fastmace.models.load import LoadedModel, load
from fastmace.runtime import vouched

# The shipped demo model on cuEquivariance (its PyTorch fallback on the CPU), as a run loads it.
LOAD = """
import json, sys
import torch
from fastmace.models.load import load
loaded = load("demo-emt-cu", backend="cueq", device="cpu")
reference_read = "reference" in vars(loaded)  # before anything asks for it
state = loaded.module.state_dict()
# What a compiled run prepares before its first call (compilation itself waits for that call).
from fastmace.dynamics.potential import _compiled
_compiled(loaded.module)
print(json.dumps({
    "timings": loaded.timings,
    "check": loaded.conversion_check.force_error_ev_per_a,
    "trainer_imported": "mace.tools.train" in sys.modules,
    "weights": {name: tensor.double().sum().item() for name, tensor in state.items()},
    "reference_read": reference_read,
    "reference_weights": sum(p.double().sum().item() for p in loaded.reference.parameters()),
    "description": str(loaded.description),
}))
"""


# The same on CUDA: the MP-0-small template's energy and forces on rattled rock salt.
LOAD_CUDA = """
import json, sys
import ase.build, torch
from fastmace.models.load import load
from fastmace.models.reference import evaluate
loaded = load("template:mp0-small", backend="cueq", device="cuda", seed=0)
atoms = ase.build.bulk("NaCl", "rocksalt", a=5.64, cubic=True).repeat(2)
atoms.rattle(0.05, seed=3)
result = evaluate(loaded.module, atoms, loaded.head, stress=False)
print(json.dumps({"timings": loaded.timings, "energy": result.energy,
                  "forces": result.forces.tolist(),
                  "devices": sorted({str(t.device) for t in loaded.module.state_dict().values()})}))
"""


def _load_in_child(env: dict[str, str], code: str = LOAD) -> dict:
    result = run_python(code, env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _kept(cache: Path) -> list[Path]:
    folder = cache / "compile" / "converted"
    return sorted(folder.glob("*.pt")) if folder.exists() else []


@dataclass(frozen=True)
class _Converted:
    """A model loaded once for the module, and the cache root its conversion was kept in."""

    cache: Path
    loaded: LoadedModel


def _converted_once(
    factory: pytest.TempPathFactory, name: str, model: str, **options: object
) -> _Converted:
    """``model`` loaded on cuEquivariance (CPU) into a fresh cache root of its own, once per
    module: the tests that only read the conversion, a copy of its module or a copy of its
    cache root share it instead of each converting the same weights again."""
    cache = factory.mktemp(name) / "cache"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FASTMACE_CACHE", str(cache))
        # The digests' store of conftest's _private_state, which a module fixture precedes.
        patch.setenv("XDG_STATE_HOME", str(factory.getbasetemp() / "state"))
        loaded = load(model, backend="cueq", device="cpu", **options)
    return _Converted(cache, loaded)


@pytest.fixture(scope="module")
def demo_cueq(tmp_path_factory: pytest.TempPathFactory) -> _Converted:
    return _converted_once(tmp_path_factory, "demo-cueq", "demo-emt-cu")


# The template of the tests of template sources. What is kept, and when it is served, does not
# depend on the shapes: the tiny one converts in about 1 s on two cores, MP-0-small in 13 s
# (and takes 10 s to read back).
TEMPLATE = "template:tiny"


@pytest.fixture(scope="module")
def template_seed_0(tmp_path_factory: pytest.TempPathFactory) -> _Converted:
    return _converted_once(tmp_path_factory, "template", TEMPLATE, seed=0)


def _own_copy(shared: _Converted, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of ``shared``'s cache root for a test that changes it, made this process's cache
    root. Vouched records name an entry's path, so each file this user wrote there is vouched
    for again at its new path: the copy holds what a first load here would have left."""
    cache = tmp_path / "cache"
    shutil.copytree(shared.cache, cache)
    for original in shared.cache.rglob("*"):
        data = vouched.read_vouched(original) if original.is_file() else None
        if data is not None:
            assert vouched.vouch(cache / original.relative_to(shared.cache), data)
    monkeypatch.setenv("FASTMACE_CACHE", str(cache))
    return cache


def test_a_later_process_reuses_the_conversion_without_the_trainer(clean_env, tmp_path):
    clean_env["FASTMACE_CACHE"] = str(tmp_path / "cache")
    clean_env["XDG_STATE_HOME"] = str(tmp_path / "state")
    first, second = _load_in_child(clean_env), _load_in_child(clean_env)
    assert "reused_s" not in first["timings"] and first["timings"]["convert_s"] > 0
    assert first["trainer_imported"]  # mace-torch's converter imports it
    assert "reused_s" in second["timings"] and "convert_s" not in second["timings"]
    assert not second["trainer_imported"]  # neither by the load nor by compile's preparation
    # The checkpoint itself was not unpickled until asked for, and then gave the same model.
    assert first["reference_read"] and not second["reference_read"]
    assert second["reference_weights"] == first["reference_weights"]
    assert second["description"] == first["description"]
    assert second["weights"] == first["weights"]
    assert second["check"] == first["check"]  # the check made with the conversion, kept
    assert len(_kept(tmp_path / "cache")) == 1


def test_a_forward_replaced_by_mace_is_replaced_again_when_read(cache, demo_cueq):
    """On CUDA mace-torch replaces the convolution's forward on the instance
    (``with_cueq_conv_fusion``), which cuEquivariance's pickling drops (stage 61, 2026-12-04).
    Here a polynomial of the CPU conversion gets mace-torch's other such wrapper."""
    # Imported after the load (the fixture's), which imports mace-torch as FastMACE does: a
    # bare first import of it builds OpenEquivariance's extension, or waits on a stale lock.
    from mace.modules.wrapper_ops import with_scatter_sum

    module = copy.deepcopy(demo_cueq.loaded.module)  # the shared one stays as converted
    with_scatter_sum(module.get_submodule("interactions.0.conv_tp.f"))
    wrapped = converted_cache.instance_forwards(module)
    assert wrapped == {"interactions.0.conv_tp.f": "with_scatter_sum.<locals>.forward"}
    key = converted_cache.entry_key("wrapped", "default", "cueq", "cpu", "float32")
    assert converted_cache.write(key, module, demo_cueq.loaded.conversion_check) is not None
    kept = converted_cache.read(key, "cpu")
    assert converted_cache.instance_forwards(kept.module) == wrapped


def test_a_forward_replaced_by_unknown_code_is_not_kept(cache, demo_cueq):
    module = copy.deepcopy(demo_cueq.loaded.module)  # the shared one stays as converted
    polynomial = module.get_submodule("interactions.0.conv_tp.f")
    polynomial.forward = lambda *inputs: inputs  # pickles silently, would be lost
    key = converted_cache.entry_key("unknown", "default", "cueq", "cpu", "float32")
    assert converted_cache.write(key, module, demo_cueq.loaded.conversion_check) is None
    assert converted_cache.read(key, "cpu") is None


@pytest.mark.gpu
def test_a_kept_conversion_runs_on_cuda_as_the_conversion_did(clean_env, tmp_path):
    clean_env["FASTMACE_CACHE"] = str(tmp_path / "cache")
    clean_env["XDG_STATE_HOME"] = str(tmp_path / "state")
    first = _load_in_child(clean_env, LOAD_CUDA)
    second = _load_in_child(clean_env, LOAD_CUDA)
    assert "reused_s" not in first["timings"] and "reused_s" in second["timings"]
    assert second["devices"] == ["cuda:0"]
    assert second["energy"] == first["energy"]
    # cuEquivariance's backward sums with atomics: the order, and so the last bits, vary
    # between evaluations of the same module (2e-18 eV/Å apart on 2026-12-04, stage 63).
    difference = abs(np.asarray(second["forces"]) - np.asarray(first["forces"])).max()
    assert difference < 1e-9


def test_other_weights_heads_dtypes_and_versions_have_their_own_entries(cache, monkeypatch):
    key = converted_cache.entry_key("weights-a", "default", "cueq", "cpu", "float32")
    assert key == converted_cache.entry_key("weights-a", "default", "cueq", "cpu", "float32")
    others = {
        converted_cache.entry_key("weights-b", "default", "cueq", "cpu", "float32"),
        converted_cache.entry_key("weights-a", "omat_pbe", "cueq", "cpu", "float32"),
        converted_cache.entry_key("weights-a", "default", "cueq", "cpu", "float64"),
    }
    monkeypatch.setattr(torch, "__version__", "2.99.0")
    others.add(converted_cache.entry_key("weights-a", "default", "cueq", "cpu", "float32"))
    monkeypatch.undo()
    monkeypatch.setattr(converted_cache, "_version", lambda package: f"{package}-9.9")
    others.add(converted_cache.entry_key("weights-a", "default", "cueq", "cpu", "float32"))
    assert key not in others and len(others) == 5


def test_a_template_of_other_weights_is_converted_not_served_the_kept_one(
    template_seed_0, tmp_path, monkeypatch
):
    cache = _own_copy(template_seed_0, tmp_path, monkeypatch)  # seed 0 converted and kept there
    first = template_seed_0.loaded
    other = load(TEMPLATE, backend="cueq", device="cpu", seed=1)
    again = load(TEMPLATE, backend="cueq", device="cpu", seed=0)
    assert "reused_s" not in other.timings  # new weights: converted and checked
    assert "reused_s" in again.timings
    assert len(_kept(cache)) == 2
    for name, tensor in again.module.state_dict().items():
        assert torch.equal(tensor, first.module.state_dict()[name]), name
    # The kept module still agrees with the e3nn model it was converted from.
    check = backends.check_conversion(again.reference, again.module, "cueq", again.head)
    assert check.passed, check.errors()


class _WritesMarker:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_source_record_is_used_only_as_written_and_only_with_its_entry(
    template_seed_0, tmp_path, monkeypatch
):
    cache = _own_copy(template_seed_0, tmp_path, monkeypatch)  # edited below
    first = template_seed_0.loaded
    [record] = sorted((cache / "compile" / "converted").glob("*.source.json"))
    again = load(TEMPLATE, backend="cueq", device="cpu", seed=0)
    assert "reference" not in vars(again)  # the template was not built again
    assert "reused_s" in again.timings and again.description == first.description
    # The template is built when asked for, with the same weights.
    for name, tensor in again.reference.state_dict().items():
        assert torch.equal(tensor, first.reference.state_dict()[name]), name
    # Edited by someone else: not followed (the template is built and converted again).
    text = json.loads(record.read_text())
    record.write_text(json.dumps(text | {"head": "other"}))
    edited = load(TEMPLATE, backend="cueq", device="cpu", seed=0)
    assert "reference" in vars(edited) and edited.head == first.head
    # Its entry gone: the record alone serves nothing.
    for entry in _kept(cache):
        entry.unlink()
    assert converted_cache.read_source(record.name.removesuffix(".source.json")) is None


@pytest.mark.parametrize("damage", ["planted", "truncated"])
def test_an_entry_not_written_by_this_user_or_damaged_is_converted_again(
    template_seed_0, tmp_path, monkeypatch, damage
):
    cache = _own_copy(template_seed_0, tmp_path, monkeypatch)  # damaged below
    first = template_seed_0.loaded  # the default seed, 0
    [entry] = _kept(cache)
    marker = tmp_path / "marker"
    if damage == "planted":  # what another user of a shared cache root could write there
        entry.write_bytes(pickle.dumps({"module": _WritesMarker(marker)}))
    else:
        entry.write_bytes(entry.read_bytes()[: entry.stat().st_size // 2])
    again = load(TEMPLATE, backend="cueq", device="cpu")
    assert not marker.exists()  # none of the planted pickle's code ran
    assert "reused_s" not in again.timings and again.conversion_check.passed
    assert converted_cache.read(entry.stem, "cpu") is not None  # written and vouched anew
    assert type(again.module) is type(first.module)


def test_backends_that_hold_native_handles_are_not_kept(cache):
    load("demo-emt-cu", backend="e3nn", device="cpu")
    assert _kept(cache) == []


def test_conversions_to_cueq_are_kept_on_cpu_and_cuda_only():
    assert converted_cache.kept_for("cueq", "cpu")
    assert converted_cache.kept_for("cueq", "cuda")
    assert converted_cache.kept_for("cueq", "cuda:1")
    assert not converted_cache.kept_for("hybrid", "cpu")
    assert not converted_cache.kept_for("cueq", "mps")


def test_a_kept_module_is_read_back_whole_on_the_device_asked_for(demo_cueq, monkeypatch):
    """cuEquivariance's polynomials unpickle by calling their constructor, which makes their
    coefficient buffers on the CPU; read for another device, none may stay behind. The meta
    device stands in for CUDA here: it is a device the module was not built on."""
    monkeypatch.setenv("FASTMACE_CACHE", str(demo_cueq.cache))  # only read
    [entry] = _kept(demo_cueq.cache)
    kept = converted_cache.read(entry.stem, "meta")
    assert kept is not None
    tensors = dict(kept.module.named_parameters()) | dict(kept.module.named_buffers())
    assert any("polynomial" in name or ".m." in name for name in tensors), sorted(tensors)[:20]
    elsewhere = {name: str(t.device) for name, t in tensors.items() if t.device.type != "meta"}
    assert elsewhere == {}
