"""The build-once cache: one published build per identity, no locks, races resolved by rename.

These tests compile a real (tiny) extension with torch's own builder and the host compiler.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fastmace.oeq import build_cache

PROBE = Path(__file__).with_name("data") / "race_probe.cpp"
pytestmark = pytest.mark.skipif(
    shutil.which("c++") is None or shutil.which("ninja") is None,
    reason="needs a C++ compiler and ninja",
)

CHILD = """
import json, shutil, sys
from pathlib import Path
import torch.utils.cpp_extension as cpp_extension
from fastmace.oeq.build_cache import build_once

result = build_once(
    cpp_extension.load, "fastmace_race_probe", [sys.argv[1]], {"extra_cflags": ["-O0"]},
    extensions_dir=Path(sys.argv[2]), private_dir=Path(sys.argv[3]),
    compiler=shutil.which("c++"),
)
print(json.dumps({"outcome": result.outcome, "answer": result.module.answer(),
                  "library": str(result.library), "key": result.key}))
"""


def _start(tmp_path: Path, index: int, extensions: Path) -> subprocess.Popen:
    private = tmp_path / f"private-{index}"
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(PROBE), str(extensions), str(private)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _finish(process: subprocess.Popen) -> dict:
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_eight_processes_at_once_publish_one_build(tmp_path):
    extensions = tmp_path / "cache" / "oeq" / "extensions"
    results = [_finish(p) for p in [_start(tmp_path, i, extensions) for i in range(8)]]
    outcomes = [r["outcome"] for r in results]
    assert outcomes.count(build_cache.BUILT) == 1, outcomes
    assert set(outcomes) <= {build_cache.BUILT, build_cache.RACED, build_cache.REUSED}
    assert all(r["answer"] == 42 for r in results)  # every process has a working extension
    assert len({r["key"] for r in results}) == 1
    entries = sorted(p.name for p in extensions.iterdir())
    assert entries == [results[0]["key"]]  # one build, no staging leftovers
    entry = extensions / entries[0]
    assert sorted(p.name for p in entry.iterdir()) == [
        "fastmace_race_probe.so", build_cache.IDENTITY_FILE,
    ]  # fmt: skip
    # torch's builder locks only inside each process's private directory, never in the cache.
    assert not list(extensions.rglob("lock")), "a lock file in the shared cache"
    # A later process reuses the published build without compiling.
    later = _finish(_start(tmp_path, 99, extensions))
    assert later["outcome"] == build_cache.REUSED and later["answer"] == 42
    seeded = tmp_path / "private-99" / "fastmace_race_probe"
    assert [p.name for p in seeded.iterdir()] == ["fastmace_race_probe.so"]  # nothing compiled


def test_identity_changes_with_flags_and_sources_not_with_build_directory(tmp_path):
    source = tmp_path / "a.cpp"
    source.write_text("int x;\n")

    def key(options: dict) -> str:
        identity = build_cache.build_identity("probe", [str(source)], options, "c++", {})
        return build_cache.identity_key(identity)

    base = key({"extra_cflags": ["-O3"]})
    assert key({"extra_cflags": ["-O3"]}) == base
    assert key({"extra_cflags": ["-O2"]}) != base
    source.write_text("int y;\n")
    assert key({"extra_cflags": ["-O3"]}) != base
    identity = build_cache.build_identity("probe", [str(source)], {}, "c++", {"CXX": "g++-13"})
    assert identity["variables"]["CXX"] == "g++-13"


def test_publish_reports_a_race_and_leaves_the_winner(tmp_path):
    library = tmp_path / "probe.so"
    library.write_bytes(b"first")
    entry = tmp_path / "extensions" / "key"
    assert build_cache.publish(library, {"n": 1}, entry) == build_cache.BUILT
    library.write_bytes(b"second")
    assert build_cache.publish(library, {"n": 2}, entry) == build_cache.RACED
    assert (entry / "probe.so").read_bytes() == b"first"
    assert [p.name for p in entry.parent.iterdir()] == ["key"]
