"""benchmarks/plot_speed.py: the recorded benchmark runs plot as ms/step against atoms."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[3]
RUN = ROOT / "benchmarks" / "results" / "2026-11-30-h200" / "run4-final.json"


def plot_speed():
    spec = importlib.util.spec_from_file_location(
        "plot_speed", ROOT / "benchmarks" / "plot_speed.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_recorded_run_gives_one_line_per_engine_and_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    module = plot_speed()
    result = json.loads(RUN.read_text())
    lines = module.series(result["cases"])
    cueq = lines["mp0-medium"]["FastMACE cuEq"]
    assert [atoms for atoms, _ in cueq] == [216, 1728, 13824]  # sorted, the cases that ran
    assert all(ms > 0 for _, ms in cueq)
    png = module.plot(result, tmp_path / "speed.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    with pytest.raises(ValueError, match="no case that ran"):
        module.plot({"cases": [{"status": "skipped"}]}, tmp_path / "none.png")
