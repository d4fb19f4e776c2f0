"""The checked file is the loaded file: a checkpoint is read once, hashed, and those bytes are
unpickled; a file swapped on disk after the read is never loaded."""

from __future__ import annotations

import hashlib
import io
import shutil
from pathlib import Path

import pytest
import torch
from helpers.malicious import WritesMarker

import fastmace as fm
from fastmace.models import files
from fastmace.models.checkpoint import NotAMaceModelError, content_hash
from fastmace.models.label_table import find_checkpoint

DEMO = Path(files.__file__).parent / "demo" / "demo-emt-cu.model"


@pytest.fixture
def malicious(tmp_path):
    """A checkpoint-shaped file whose unpickling writes ``marker``; both in tmp_path."""
    marker = tmp_path / "marker"
    path = tmp_path / "malicious.model"
    torch.save({"payload": WritesMarker(marker)}, path)
    return path, marker


def test_the_malicious_file_runs_its_code_when_trusted(malicious):
    # The replacement used below is really malicious: loading it runs its code.
    path, marker = malicious
    with pytest.raises(NotAMaceModelError):
        fm.load(path, trusted=True)
    assert marker.exists()


@pytest.mark.parametrize("route", ["path with sha256", "label with checkpoint="])
def test_a_file_swapped_after_reading_is_not_loaded(route, malicious, tmp_path, monkeypatch):
    bad, marker = malicious
    original = tmp_path / "own.model"
    shutil.copyfile(DEMO, original)
    sha = hashlib.sha256(original.read_bytes()).hexdigest()
    read = files.read_checkpoint_bytes
    reads = []

    def read_then_swap(path: Path) -> bytes:
        content = read(path)
        reads.append(path)
        shutil.copyfile(bad, path)  # the swap, right after the bytes were read
        return content

    monkeypatch.setattr(files, "read_checkpoint_bytes", read_then_swap)
    if route == "path with sha256":
        loaded = fm.load(original, sha256=sha)
    else:
        loaded = fm.load("demo-emt-cu", checkpoint=original)
    assert reads == [original]
    assert original.read_bytes() == bad.read_bytes()  # the file on disk was replaced
    assert not marker.exists()  # and none of its code ran
    assert loaded.file.sha256 == sha and loaded.file.verified
    expected = torch.load(DEMO, map_location="cpu", weights_only=False)
    assert loaded.description.content_hash == content_hash(expected)


def test_the_loaded_model_is_made_of_the_verified_bytes(monkeypatch):
    # The shipped demo model (its hash pinned in the label table): the bytes that were read
    # are the bytes whose hash was checked and the bytes the model was unpickled from.
    read = files.read_checkpoint_bytes
    seen: list[bytes] = []

    def recording(path: Path) -> bytes:
        seen.append(read(path))
        return seen[-1]

    monkeypatch.setattr(files, "read_checkpoint_bytes", recording)
    loaded = fm.load("demo-emt-cu")
    assert len(seen) == 1
    assert hashlib.sha256(seen[0]).hexdigest() == find_checkpoint("demo-emt-cu").sha256
    assert loaded.file.sha256 == find_checkpoint("demo-emt-cu").sha256
    from_bytes = torch.load(io.BytesIO(seen[0]), map_location="cpu", weights_only=False)
    assert loaded.description.content_hash == content_hash(from_bytes)
    assert loaded.file.content == b""  # the bytes are not kept alive with the model
