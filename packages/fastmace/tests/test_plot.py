"""The run's plot: thermo.png at the end of a real run, ``fastmace plot``, and without
matplotlib a hint instead of a plot."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from conftest import run_fastmace, run_python

from fastmace.io.plot import plot_thermo, read_series
from fastmace.io.thermo import ThermoLog

EXAMPLE = Path(__file__).parents[3] / "examples" / "cu-fcc-32.extxyz"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """Width and height of a whole PNG file (signature, header chunk first, end chunk last)."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR", f"{path} is not a PNG"
    assert data[-8:-4] == b"IEND", f"{path} is cut short"
    assert len(data) > 20_000, f"{path} has {len(data)} bytes: too few for six panels"
    return struct.unpack(">II", data[16:24])


def test_a_run_ends_with_its_plot_and_fastmace_plot_draws_it_again(clean_env, tmp_path):
    run = tmp_path / "run"
    args = ["md", str(EXAMPLE), "--model", "demo-emt-cu", "--temperature", "300",
            "--steps", "20", "--timestep", "2", "--thermo-every", "5", "--traj-every", "0",
            "-o", str(run)]  # fmt: skip
    result = run_fastmace(args, clean_env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"output:    {run} (plot: thermo.png)" in result.stdout
    assert png_size(run / "thermo.png") == (1000, 800)

    again = run_fastmace(["plot", str(run), "-o", str(tmp_path / "again.png")], clean_env)
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.strip() == f"wrote {tmp_path / 'again.png'}"
    assert png_size(tmp_path / "again.png") == (1000, 800)


@pytest.mark.parametrize("made", [True, False])
def test_plot_of_a_directory_without_thermo_csv_names_the_file(clean_env, tmp_path, made):
    where = tmp_path / "not-a-run"
    if made:
        where.mkdir()
    result = run_fastmace(["plot", str(where)], clean_env)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    named = str(where / "thermo.csv") if made else f"{where} is not a directory"
    assert f"fastmace: error: {named}" in result.stderr
    assert not (where / "thermo.png").exists()


def test_a_batch_has_one_line_per_system(tmp_path):
    log = ThermoLog(tmp_path / "thermo.csv", n_systems=2)
    rows = [
        {"step": step, "system": system, "time_fs": 2.0 * step, "temperature_K": 300.0 + system,
         "potential_energy_eV": -1.0, "kinetic_energy_eV": 0.5, "total_energy_eV": -0.5,
         "pressure_GPa": None, "volume_A3": 100.0}
        for step in (0, 10, 20) for system in (0, 1)
    ]  # fmt: skip
    log.write(rows)
    log.close()
    series = read_series(tmp_path / "thermo.csv")
    assert sorted(series) == [0, 1]
    assert series[1]["time_ps"] == [0.0, 0.02, 0.04]
    assert series[1]["temperature_K"] == [301.0] * 3
    assert all(value != value for value in series[0]["pressure_GPa"])  # empty cells: NaN
    assert png_size(plot_thermo(tmp_path / "thermo.csv", tmp_path / "batch.png")) == (1000, 800)


def test_without_matplotlib_a_run_says_how_to_get_the_plot(clean_env, tmp_path):
    code = f"""
import sys
import fastmace as fm
from fastmace.cli.main import main

# mace-torch's imports (torchmetrics) import matplotlib where it is installed; after them,
# sys.modules[name] = None, Python's own switch, makes it missing for the rest of the process.
fm.load("demo-emt-cu")
sys.modules["matplotlib"] = None

result = fm.md({str(EXAMPLE)!r}, model="demo-emt-cu", temperature_K=300, steps=10,
               timestep_fs=2, thermo_every=5, trajectory_every=0, output={str(tmp_path / "run")!r})
print(result.report)
sys.exit(main(["plot", {str(tmp_path / "run")!r}]))
"""
    result = run_python(code, clean_env)
    assert result.returncode == 1, result.stderr[-2000:]
    hint = 'pip install "fastmace[plot]"'
    run = tmp_path / "run"
    assert f"output:    {run} (no plot: matplotlib is not installed; {hint})" in result.stdout
    assert not (run / "thermo.png").exists() and (run / "thermo.csv").is_file()
    assert f"fastmace: error: plotting needs matplotlib: {hint}" in result.stderr
    assert "warn" not in result.stderr.lower()


def test_the_plot_leaves_pyplot_alone(clean_env, tmp_path):
    # pyplot holds the process's figures and backend: drawing our PNG must not bring it in.
    (tmp_path / "thermo.csv").write_text(
        "step,time_fs,potential_energy_eV,kinetic_energy_eV,total_energy_eV,temperature_K,"
        "pressure_GPa,volume_A3,ns_per_day\n0,0.0,-1.0,0.5,-0.5,300.0,0.1,100.0,\n"
        "10,20.0,-0.9,0.4,-0.5,250.0,0.2,100.0,3.0\n"
    )
    code = (
        "import sys\nfrom fastmace.io.plot import plot_thermo\n"
        f"plot_thermo({str(tmp_path / 'thermo.csv')!r}, {str(tmp_path / 'one.png')!r})\n"
        "print(sorted(m for m in sys.modules if m.startswith('matplotlib.pyplot')))"
    )
    result = run_python(code, clean_env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"
    assert png_size(tmp_path / "one.png") == (1000, 800)


def test_fastmace_plot_draws_a_relaxation_from_its_relax_csv(clean_env, tmp_path):
    """A relaxation's directory has relax.csv, no thermo.csv: its own plot, not a hint about
    --thermo-every."""
    rattled = tmp_path / "rattled.extxyz"
    write = f"import ase.io; a = ase.io.read({str(EXAMPLE)!r}); a.rattle(0.1, seed=2); "
    run_python(write + f"ase.io.write({str(rattled)!r}, a)", clean_env)
    run = tmp_path / "relax"
    relaxed = run_fastmace(["relax", str(rattled), "-o", str(run)], clean_env)
    assert relaxed.returncode == 0, relaxed.stderr[-2000:]
    result = run_fastmace(["plot", str(run)], clean_env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == f"wrote {run / 'relax.png'}"
    assert png_size(run / "relax.png") == (1000, 600)
    assert not (run / "thermo.png").exists()


def test_the_targets_come_from_the_runs_metadata(tmp_path):
    import json

    from fastmace.io.plot import run_settings, run_targets

    def settings(ensemble_settings, **more):
        path = tmp_path / "metadata.json"
        path.write_text(json.dumps({"settings": {"ensemble_settings": ensemble_settings,
                                                 "timestep_fs": 2.0, **more}}))  # fmt: skip
        return run_settings(path)

    assert run_targets(settings({"temperature_K": 300.0})) == {"temperature_K": 300.0}
    ladder = settings({"temperature_K": [300.0, 350.0]})
    assert run_targets(ladder) == {"temperature_K": [300.0, 350.0]}
    npt = settings({"temperature_K": 300.0, "pressure_bar": 1e4})
    assert run_targets(npt) == {"temperature_K": 300.0, "pressure_GPa": 1.0}
    anneal = {"points": [[0, 300.0], [100, 600.0]], "mode": "linear"}
    scheduled = settings({"temperature_K": 300.0}, temperature_schedule=anneal)
    assert run_targets(scheduled) == {"temperature_K": anneal}
    assert run_settings(tmp_path / "missing.json") == {}


def test_a_target_is_a_dashed_line_and_a_schedule_follows_its_points():
    from matplotlib.figure import Figure

    from fastmace.io.plot import _draw_target

    ax = Figure().subplots()
    _draw_target(ax, [300.0, 350.0, 300.0], timestep_fs=2.0)
    assert sorted(line.get_ydata()[0] for line in ax.lines) == [300.0, 350.0]
    assert {line.get_linestyle() for line in ax.lines} == {"--"}
    ax = Figure().subplots()
    _draw_target(ax, {"points": [[0, 300.0], [500, 600.0]], "mode": "linear"}, timestep_fs=2.0)
    (line,) = ax.lines
    assert list(line.get_xdata()) == [0.0, 1.0] and list(line.get_ydata()) == [300.0, 600.0]


def test_a_real_run_plots_its_target_and_conserved_energy(tmp_path):
    import io

    import ase.io

    import fastmace as fm
    from fastmace.io.plot import read_series

    fm.md(ase.io.read(EXAMPLE), steps=10, temperature_K=300.0, thermo_every=5,
          output=tmp_path / "run", progress=io.StringIO())  # fmt: skip
    series = read_series(tmp_path / "run" / "thermo.csv")[0]
    assert len(series["conserved_energy_eV"]) == 3  # Langevin's, read for the plot
    assert png_size(tmp_path / "run" / "thermo.png") == (1000, 800)
