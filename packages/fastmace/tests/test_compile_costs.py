"""The cache's record of what each compilation cost (runtime.compile_costs): keyed by everything
the compilation depends on, data only, and never trusted when damaged or written for another key.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from fastmace.runtime.compile_costs import (
    CompileIdentity,
    compiled_code_kept,
    record_cost_s,
    recorded_cost_s,
    warm_cost_s,
)

IDENTITY = CompileIdentity(
    model_hash="0" * 64, backend="cueq", dtype="float32", n_atoms=13_824, gpu="NVIDIA H200",
    torch="2.11.0+cu130",
)  # fmt: skip


def _record_file(cache: Path) -> Path:
    files = list((cache / "compile" / "costs").glob("*.json"))
    assert len(files) == 1, files
    return files[0]


def test_a_recorded_cost_is_read_back_for_its_identity_alone(cache: Path) -> None:
    assert recorded_cost_s(IDENTITY) is None  # nothing created by looking
    assert not cache.exists()
    assert record_cost_s(IDENTITY, 12.3456)
    assert recorded_cost_s(IDENTITY) == 12.346
    # A changed model, backend, dtype, size, GPU or torch is never served this record.
    for field, other in (
        ("model_hash", "1" * 64), ("backend", "hybrid"), ("dtype", "float64"),
        ("n_atoms", 216), ("gpu", "NVIDIA H100"), ("torch", "2.14.1+cu130"),
    ):  # fmt: skip
        changed = dataclasses.replace(IDENTITY, **{field: other})
        assert changed.key() != IDENTITY.key(), field
        assert recorded_cost_s(changed) is None, field
    # A later compilation replaces the figure; no temporary file is left behind.
    assert record_cost_s(IDENTITY, 4.0)
    assert recorded_cost_s(IDENTITY) == 4.0
    assert [path.name for path in (cache / "compile" / "costs").iterdir()] == [
        f"{IDENTITY.key()}.json"
    ]


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        "",
        '{"format": 1, "seconds": 3.0}',  # no identity
        '{"format": 2, "identity": null, "seconds": 3.0}',
        "[1, 2]",
    ],
)
def test_a_damaged_record_counts_as_none(cache: Path, content: str) -> None:
    assert record_cost_s(IDENTITY, 3.0)
    _record_file(cache).write_text(content)
    assert recorded_cost_s(IDENTITY) is None


@pytest.mark.parametrize("seconds", [-1.0, float("nan"), float("inf"), "3", True, None])
def test_a_record_with_bad_seconds_counts_as_none(cache: Path, seconds: object) -> None:
    assert record_cost_s(IDENTITY, 3.0)
    path = _record_file(cache)
    data = json.loads(path.read_text())
    data["seconds"] = seconds
    path.write_text(json.dumps(data))
    assert recorded_cost_s(IDENTITY) is None


def test_a_record_planted_for_another_identity_is_not_read(cache: Path) -> None:
    """A file under this identity's name that describes another compilation is ignored."""
    other = dataclasses.replace(IDENTITY, n_atoms=216)
    assert record_cost_s(other, 1.0)
    planted = _record_file(cache)
    planted.rename(planted.with_name(f"{IDENTITY.key()}.json"))
    assert recorded_cost_s(IDENTITY) is None


def test_recording_refuses_impossible_seconds(cache: Path) -> None:
    for seconds in (-0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite seconds >= 0"):
            record_cost_s(IDENTITY, seconds)


def test_an_unwritable_cache_is_no_error(cache: Path) -> None:
    """A cache whose compile directory cannot be made: the run goes on, nothing is recorded."""
    cache.mkdir()
    (cache / "compile").write_text("a file where the directory would be")
    assert record_cost_s(IDENTITY, 3.0) is False
    assert recorded_cost_s(IDENTITY) is None


def test_a_record_is_a_warm_figure_only_while_compiled_code_is_kept(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The planner reads a record (one compile worker, the warm cost) only while the files it
    was measured with are there: Inductor's graphs, or a package compiled ahead of time."""
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    assert record_cost_s(IDENTITY, 7.7)
    assert recorded_cost_s(IDENTITY) == 7.7
    assert not compiled_code_kept() and warm_cost_s(IDENTITY) is None  # emptied by hand
    (cache / "inductor" / "fxgraph" / "ab").mkdir(parents=True)
    assert warm_cost_s(IDENTITY) is None  # directories alone hold nothing
    (cache / "inductor" / "fxgraph" / "ab" / "entry").write_bytes(b"graph")
    assert compiled_code_kept() and warm_cost_s(IDENTITY) == 7.7
    shutil.rmtree(cache / "inductor")
    (cache / "compile" / "aot").mkdir(parents=True)
    (cache / "compile" / "aot" / "model.pt2").write_bytes(b"package")
    assert warm_cost_s(IDENTITY) == 7.7
    # Inductor pointed elsewhere by the user: its graphs are looked for there.
    elsewhere = cache.parent / "elsewhere"
    (elsewhere / "fxgraph" / "cd").mkdir(parents=True)
    (elsewhere / "fxgraph" / "cd" / "entry").write_bytes(b"graph")
    (cache / "compile" / "aot" / "model.pt2").unlink()
    assert warm_cost_s(IDENTITY) is None
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(elsewhere))
    assert warm_cost_s(IDENTITY) == 7.7
