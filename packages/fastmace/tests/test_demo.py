"""The main job (``nox -s demo``: ``fastmace run examples/demo.toml``) shows what it says: NVT
at its target temperature, with its plot. The test runs the same file the session runs."""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

from conftest import run_fastmace

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DEMO = Path(__file__).parents[3] / "examples" / "demo.toml"
# Temperatures sampled closer than this are correlated: CSVR's time constant (0.1 ps) and
# copper's slowest phonon periods (~0.2 ps) both set it; 0.1 ps is on the safe side for
# neither exceeding it by much.
CORRELATION_PS = 0.1


def mean_and_bound(thermo_csv: Path, config: dict, n_atoms: int) -> tuple[float, float]:
    """The last half's mean temperature, and how far from the target a canonical run's mean
    may lie: three standard errors."""
    steps, timestep_fs = config["steps"], config["timestep_fs"]
    with thermo_csv.open() as stream:
        rows = [row for row in csv.DictReader(stream) if int(row["step"]) > steps // 2]
    mean = sum(float(row["temperature_K"]) for row in rows) / len(rows)
    # The instantaneous temperature of N atoms (3N - 3 degrees of freedom) spreads by
    # sqrt(2 / (3N - 3)) of the target: 14.7 % for 32 atoms.
    spread = config["temperature_K"] * math.sqrt(2.0 / (3 * n_atoms - 3))
    independent = (steps / 2) * timestep_fs / 1000.0 / (2.0 * CORRELATION_PS)
    return mean, 3.0 * spread / math.sqrt(independent)


def test_the_demo_sits_at_its_target_temperature_and_draws_its_plot(clean_env, tmp_path):
    config = tomllib.loads(DEMO.read_text())
    # As nox -s demo runs it: the config names no output, so the run lands in the directory.
    result = run_fastmace(["run", str(DEMO)], clean_env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    (run,) = tmp_path.glob("md-cu-fcc-32-*")
    mean, bound = mean_and_bound(run / "thermo.csv", config, n_atoms=32)
    # 1 ps of samples: about 5 independent ones, a bound of about 60 K. The old demo (Langevin
    # at 1/ps from 300 K, 800 fs) averaged about 180 K over its second half.
    assert abs(mean - config["temperature_K"]) < bound, (mean, bound)
    assert (run / "thermo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"output:    {run} (plot: thermo.png)" in result.stdout
