"""Issue 12's adversarial cases on the CPU with the demo model, where no other test file tries
them (docs/validation/reliability.md lists every case with the test that tries it, here or
elsewhere).

Bad requests to ``fastmace md``, ``fastmace run`` and fm.md end with a message naming the
file or setting and the fix, and leave no file behind. ``kill -9`` of a real ``fastmace md``
at several moments, each followed by ``--resume``, ends bit for bit where an uninterrupted run
ends. Blow-ups exit nonzero naming the bound and the last good restart, with metadata.json
``failed``. A checkpoint swapped on disk while it is loaded never runs. Concurrent starts into
one directory give it one run, over stale lock files that cost no wait.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import ase
import ase.io
import numpy as np
import pytest
from conftest import EXAMPLE, copper, run_fastmace, tree
from helpers.malicious import WritesMarker

import fastmace as fm
from fastmace.io import load_restart, read_trajectory
from fastmace.io.restart import restart_step
from fastmace.models import files

DEMO = Path(files.__file__).parent / "demo" / "demo-emt-cu.model"
SHORT = ["--temperature", "300", "--steps", "2"]


def _with_velocity(value: float) -> ase.Atoms:
    """The example with one velocity component of atom 2 set to ``value`` Å/fs."""
    atoms = ase.io.read(EXAMPLE)
    velocities = np.zeros((len(atoms), 3))
    velocities[2, 1] = value / ase.units.fs
    atoms.set_velocities(velocities)
    return atoms


# Inputs a case may name, written into the test's own directory first.
INPUTS: dict[str, Callable[[], ase.Atoms]] = {
    "nan-velocity.extxyz": lambda: _with_velocity(np.nan),
    "fast.extxyz": lambda: _with_velocity(1e160),
}


# A CIF whose site at (1/2, 1/2, 0) is half copper, half gold (a disordered alloy).
PARTIAL_CIF = """data_cuau
_cell_length_a 3.61
_cell_length_b 3.61
_cell_length_c 3.61
_cell_angle_alpha 90
_cell_angle_beta 90
_cell_angle_gamma 90
_symmetry_space_group_name_H-M 'P 1'
loop_
_atom_site_label
_atom_site_type_symbol
_atom_site_fract_x
_atom_site_fract_y
_atom_site_fract_z
_atom_site_occupancy
Cu1 Cu 0 0 0 1.0
Cu2 Cu 0.5 0.5 0 0.5
Au2 Au 0.5 0.5 0 0.5
Cu3 Cu 0.5 0 0.5 1.0
Cu4 Cu 0 0.5 0.5 1.0
"""


def _write_inputs(directory: Path) -> None:
    for name, make in INPUTS.items():
        ase.io.write(directory / name, make())
    (directory / "partial.cif").write_text(PARTIAL_CIF)
    shutil.copyfile(DEMO, directory / "own.model")
    shutil.copyfile(EXAMPLE, directory / "cu.extxyz")


# ``fastmace md`` requests that must be refused: (arguments after the structure, or the
# structure first when it is one of INPUTS; a part of the message). {run} is the run
# directory, {dir} the test's directory.
CLI_REFUSED = {
    "NaN friction": (["--friction", "nan"], "friction_per_ps=nan is not allowed: give finite"),
    "negative steps": (["--steps", "-5"], "steps=-5 is not allowed: give a whole number >= 0"),
    "zero timestep": (["--timestep", "0"], "timestep_fs=0.0 is not allowed: it must be in (0"),
    "negative restart interval": (["--restart-every", "-1"], "restart_every=-1 is not allowed"),
    "float seed": (["--seed", "1.5"], "argument --seed: invalid int value: '1.5'"),
    "unknown ensemble": (["--ensemble", "nvx"], "unknown ensemble 'nvx'; choose one of"),
    "NPT without a pressure": (
        ["--ensemble", "npt"], "needs exactly one of pressure_GPa or pressure_bar"
    ),
    "float16": (["--dtype", "float16"], "dtype='float16') is not allowed: use one of float32"),
    "unknown backend": (["--backend", "foo"], "backend='foo') is not allowed: use one of e3nn"),
    "unknown guard bound": (["--guard", "max_force=3"], "unknown bound(s) max_force; the bounds"),
    "repeat 0": (["--repeat", "0"], "repeat must be three positive integers"),
    "repeat 1000": (["--repeat", "1000"], "makes 32,000,000,000 atoms (1,000,000,000 copies); "
                    "one run holds at most 10,000,000 (a GPU holds about 215,000 atoms of MP-0 "
                    "medium): choose a smaller repeat (given as --repeat)"),
    "missing model file": (["--model", "{dir}/nope.model"], "model file {dir}/nope.model does"),
    "own model without trust": (["--model", "{dir}/own.model"], "pass sha256="),
    "resume of a missing directory": (["--resume"], "cannot resume {run}: it is not a directory"),
    "NaN velocity in the file": (["{dir}/nan-velocity.extxyz"], "non-finite velocities (atoms"),
    "1e160 Å/fs velocity in the file": (["{dir}/fast.extxyz"], "kinetic temperature inf K"),
    "missing structure file": (["{dir}/absent.xyz"], "{dir}/absent.xyz"),
}  # fmt: skip

# ``fastmace run`` configs that must be refused: (lines added to a good config; a part of the
# message, which also names the config file, or the structure file when that is at fault).
TOML_REFUSED = {
    "negative friction": ("friction_per_ps = -1", "friction_per_ps=-1 1/ps is not allowed"),
    "NaN friction": ("friction_per_ps = nan", "friction_per_ps=nan is not allowed"),
    "tau 0": ('ensemble = "nvt-csvr"\ntau_fs = 0', "tau_fs=0 fs is not allowed: it must be > 0"),
    "unknown cell mode": ('ensemble = "npt"\npressure_GPa = 0\ncell_mode = "weird"',
                          "cell_mode='weird' is not allowed: choose one of isotropic"),
    "chain length 0": ('ensemble = "nhc"\nchain_length = 0', "chain_length=0 is not allowed"),
    "unknown format": ('trajectory_format = "xyz"', "trajectory_format='xyz' is not allowed"),
    "steps as text": ('steps = "many"', "steps='many' is not allowed"),
    "unknown guard bound": ("[guard]\nmax_force = 3", "unknown bound(s) max_force"),
    "repeat too large": ("repeat = [400, 400, 400]", "one run holds at most 10,000,000"),
    "TOML syntax": ("steps = = 3", "is not valid TOML"),
    "missing structure file": ('structure = "absent.xyz"', "absent.xyz"),
    "1e160 Å/fs velocity in the file": ('structure = "fast.extxyz"', "kinetic temperature inf K"),
}  # fmt: skip

# fm.md requests that must be refused: (the structure, keyword arguments, a part of the message).
FM_MD_REFUSED = {
    "NaN velocity": ("nan-velocity.extxyz", {}, "non-finite velocities (atoms [2]"),
    "1e160 Å/fs velocity": ("fast.extxyz", {}, "kinetic temperature inf K"),
    "negative steps": ("cu.extxyz", {"steps": -1}, "steps=-1 is not allowed"),
    "fractional restart interval": ("cu.extxyz", {"restart_every": 2.5}, "restart_every=2.5 is"),
    "infinite timestep": ("cu.extxyz", {"timestep_fs": float("inf")}, "timestep_fs=inf is not"),
    "missing model file": ("cu.extxyz", {"model": "{dir}/nope.model"}, "does not exist"),
    "repeat too large": ("cu.extxyz", {"repeat": (100, 100, 100)}, "makes 32,000,000 atoms"),
    "fractional occupancy": (
        "partial.cif", {}, "has sites of fractional occupancy (site 1: Cu 0.5, Au 0.5"
    ),
}  # fmt: skip


def _fill(text: str, directory: Path) -> str:
    return text.format(dir=directory, run=directory / "run")


@pytest.fixture
def clean_env(clean_env: dict[str, str]) -> dict[str, str]:
    """conftest's, with one thread per child: this file starts several children at once on
    CI's two cores, where more threads only spin."""
    clean_env["OMP_NUM_THREADS"] = "1"
    return clean_env


@pytest.mark.parametrize("case", list(CLI_REFUSED))
def test_fastmace_md_refuses_with_a_clear_message_and_leaves_nothing(case, clean_env, tmp_path):
    _write_inputs(tmp_path)
    arguments, message = CLI_REFUSED[case]
    arguments = [_fill(a, tmp_path) for a in arguments]
    structure = arguments.pop(0) if arguments and arguments[0].endswith("xyz") else str(EXAMPLE)
    before = tree(tmp_path)
    result = run_fastmace(["md", structure, *SHORT, "-o", str(tmp_path / "run"), *arguments],
                          clean_env, cwd=tmp_path)  # fmt: skip
    assert result.returncode != 0
    assert _fill(message, tmp_path) in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert tree(tmp_path) == before, "a refused request left files behind"


@pytest.mark.parametrize("case", list(TOML_REFUSED))
def test_fastmace_run_refuses_with_a_clear_message_and_leaves_nothing(case, clean_env, tmp_path):
    _write_inputs(tmp_path)
    lines, message = TOML_REFUSED[case]
    given = {line.split("=")[0].strip() for line in lines.split("\n")}
    defaults = ['structure = "cu.extxyz"', "temperature_K = 300", "steps = 2", 'output = "run"']
    kept = [line for line in defaults if line.split("=")[0].strip() not in given]
    config = tmp_path / "config.toml"
    config.write_text("\n".join([*kept, lines]) + "\n")  # a [table] last: TOML's rule
    before = tree(tmp_path)
    result = run_fastmace(["run", str(config)], clean_env, cwd=tmp_path)
    assert result.returncode == 1
    assert message in result.stderr, result.stderr[-2000:]
    # The file at fault is named: the config, or the structure file it names.
    assert f"fastmace: error: {config}" in result.stderr or "structure file" in result.stderr
    assert "Traceback" not in result.stderr
    assert tree(tmp_path) == before, "a refused request left files behind"


@pytest.mark.parametrize("case", list(FM_MD_REFUSED))
def test_fm_md_refuses_with_a_clear_message_and_leaves_nothing(case, tmp_path):
    _write_inputs(tmp_path)
    structure, arguments, message = FM_MD_REFUSED[case]
    arguments = {k: _fill(v, tmp_path) if isinstance(v, str) else v for k, v in arguments.items()}
    before = tree(tmp_path)
    with pytest.raises(Exception) as caught:  # its kind varies; the message is what counts
        fm.md(tmp_path / structure, **{"temperature_K": 300.0, "steps": 2,
                                       "output": tmp_path / "run", **arguments})  # fmt: skip
    assert message in str(caught.value)
    assert tree(tmp_path) == before, "a refused request left files behind"


def _snapshot(run: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(run.iterdir())}


def test_a_resume_to_fewer_steps_than_done_is_refused_before_anything_changes(
    demo, clean_env, tmp_path
):
    """A run at step 10 resumed with steps=4: refused up front, the directory unchanged (it
    used to fail after metadata.json was rewritten to ``running``)."""
    from fastmace.dynamics.ensembles import ensemble
    from fastmace.io import OutputSchedule
    from fastmace.resuming import ResumeError
    from fastmace.simulation import RunSettings, Simulation

    run = tmp_path / "run"
    common = dict(temperature_K=300.0, output=run, thermo_every=5, trajectory_every=5,
                  restart_every=10, progress=None)  # fmt: skip
    fm.md(EXAMPLE, steps=10, **common)
    before = _snapshot(run)
    expected = f"cannot resume {run} with steps=4: its restart is at step 10"
    cli = run_fastmace(["md", str(EXAMPLE), "--temperature", "300", "--steps", "4", "-o",
                        str(run), "--resume"], clean_env)  # fmt: skip
    assert cli.returncode == 1 and "Traceback" not in cli.stderr
    assert expected in cli.stderr and "Give steps >= 10" in cli.stderr
    assert "(given as --steps)" in cli.stderr
    config = tmp_path / "config.toml"
    config.write_text(
        f'structure = "{EXAMPLE}"\ntemperature_K = 300\nsteps = 4\noutput = "run"\nresume = true\n'
    )
    toml = run_fastmace(["run", str(config)], clean_env)
    assert toml.returncode == 1 and f"{config}: {expected}" in toml.stderr
    with pytest.raises(ValueError, match=expected):
        fm.md(EXAMPLE, steps=4, resume=True, **common)
    # Simulation itself (no preflight in front of it) refuses before it touches the files.
    settings = RunSettings(ensemble=ensemble("nvt", temperature_K=300.0), steps=4,
                           timestep_fs=1.0, seed=0, schedule=OutputSchedule(5, 5, 10))  # fmt: skip
    with pytest.raises(ResumeError, match=expected):
        Simulation(demo, [ase.io.read(EXAMPLE)], settings, run, resume=True)
    assert _snapshot(run) == before
    assert json.loads((run / "metadata.json").read_text())["status"] == "finished"
    # As many steps as done is no error: the run is complete.
    assert fm.md(EXAMPLE, steps=10, resume=True, **common).steps == 10


# The killed runs: 40 steps of 2 fs, restarts at steps 0, 15, 30 and 40.
KILLED = ["--temperature", "300", "--steps", "40", "--timestep", "2", "--seed", "7",
          "--thermo-every", "5", "--traj-every", "5", "--restart-every", "15"]  # fmt: skip


def _start(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "fastmace", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip


def _kill_when(child: subprocess.Popen, ready: Callable[[], bool]) -> None:
    """SIGKILL ``child`` as soon as ``ready()``; fail if it ends or takes too long first."""
    deadline = time.monotonic() + 240
    try:
        while not ready():
            if child.poll() is not None:
                raise AssertionError(f"the run ended first: {child.stderr.read().decode()[-2000:]}")
            assert time.monotonic() < deadline, "the moment to kill never came"
            time.sleep(0.01)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stderr.close()


def _last_step(run: Path) -> int:
    """The step of thermo.csv's last complete row, -1 before the first."""
    try:
        lines = (run / "thermo.csv").read_text().splitlines()[1:]
    except FileNotFoundError:
        return -1
    complete = [line for line in lines if line.count(",") >= 9]
    return int(complete[-1].split(",")[0]) if complete else -1


def _restart_step(run: Path) -> int:
    try:
        return restart_step(run / "restart.npz")
    except (FileNotFoundError, ValueError):
        return -1


def _thermo_without_timing(run: Path) -> list[dict[str, str]]:
    rows = list(csv.DictReader((run / "thermo.csv").open()))
    for row in rows:
        del row["ns_per_day"]  # wall-clock speed: the one column that may differ
    return rows


def test_fastmace_md_killed_at_several_moments_resumes_bit_for_bit(clean_env, tmp_path):
    straight, run = tmp_path / "straight", tmp_path / "run"
    reference = run_fastmace(["md", str(EXAMPLE), *KILLED, "-o", str(straight)], clean_env)
    assert reference.returncode == 0, reference.stderr[-2000:]
    command = ["md", str(EXAMPLE), *KILLED, "-o", str(run)]
    moments = [
        # Before the first scheduled restart: only step 0's exists.
        ([], lambda: _last_step(run) >= 5, 0),
        # After a restart, mid-way to the next.
        (["--resume"], lambda: _last_step(run) >= 20, 15),
        # The moment a restart is replaced, before or while the block's rows are written.
        (["--resume"], lambda: _restart_step(run) == 30, 30),
    ]
    for extra, ready, restart in moments:
        _kill_when(_start([*command, *extra], clean_env), ready)
        assert load_restart(run / "restart.npz").step == restart
        assert json.loads((run / "metadata.json").read_text())["status"] == "running"
    resumed = run_fastmace([*command, "--resume"], clean_env)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads((run / "metadata.json").read_text())["status"] == "finished"
    rows = [_thermo_without_timing(directory) for directory in (straight, run)]
    assert [int(row["step"]) for row in rows[1]] == list(range(0, 45, 5))
    # Every column digit for digit, the pressure too: the restart keeps the neighbour list
    # (grid, capacities, peaks), so the stress sums over the same slots as in one go.
    assert rows[0] == rows[1]
    ends = [load_restart(directory / "restart.npz") for directory in (straight, run)]
    assert ends[0].step == ends[1].step == 40
    for name in ("state.positions", "state.velocities"):
        assert np.array_equal(ends[0].payload["tensors"][name], ends[1].payload["tensors"][name])
    frames = [read_trajectory(directory / "trajectory.extxyz") for directory in (straight, run)]
    assert len(frames[0]) == len(frames[1]) == 9
    for one, other in zip(*frames, strict=True):
        assert np.array_equal(one.positions, other.positions)
        assert np.array_equal(one.get_velocities(), other.get_velocities())


def test_a_run_killed_before_its_step_zero_restart_says_how_to_go_on(clean_env, tmp_path):
    """Killed while starting (before step 0's restart: minutes on a GPU for a large system),
    nothing can be resumed; neither a resume nor a new run sends the user to the other."""
    run = tmp_path / "run"
    command = ["md", str(EXAMPLE), *KILLED, "-o", str(run)]
    _kill_when(_start(command, clean_env), lambda: (run / "run.json").exists())
    assert not (run / "restart.npz").exists()
    before = _snapshot(run)
    for extra in (["--resume"], []):
        result = run_fastmace([*command, *extra], clean_env)
        assert result.returncode == 1 and "Traceback" not in result.stderr
        assert "wrote no restart yet" in result.stderr and "nothing to resume" in result.stderr
        assert "--resume" not in result.stderr, result.stderr
        assert "remove the directory and start again" in result.stderr
    assert _snapshot(run) == before


def _write_copper(path: Path) -> Path:
    """One cubic cell of rattled copper: 4 atoms, the smallest run that blows up the same."""
    ase.io.write(path, copper((1, 1, 1)))
    return path


def _write_close_pair(path: Path) -> Path:
    """Two atoms 0.6 Å apart in a 7 Å cell: allowed (above 0.5 Å), but no potential holds it."""
    pair = ase.Atoms("Cu2", positions=[[3, 3, 3], [3.6, 3, 3]], cell=[7, 7, 7], pbc=True)
    ase.io.write(path, pair)
    return path


# Issue 12's blow-ups through the command line: (structure, flags, what the message names).
BLOW_UPS = {
    "NVE, two atoms 0.6 Å apart, 10 fs": (
        _write_close_pair, ["--ensemble", "nve", "--timestep", "10"], "system 0's temperature",
    ),
    "NVT at 20,000 K, 10 fs": (
        _write_copper, ["--temperature", "20000", "--timestep", "10"], "system 0's temperature",
    ),
    "NPT at -1e5 GPa": (
        _write_copper, ["--ensemble", "npt", "--temperature", "300", "--pressure=-1e5"],
        "system 0's volume",
    ),
    "NPT at +1e5 GPa": (
        _write_copper, ["--ensemble", "npt", "--temperature", "300", "--pressure=1e5"],
        "the atoms are collapsing",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BLOW_UPS))
def test_a_blow_up_exits_nonzero_naming_the_bound_and_the_last_restart(case, clean_env, tmp_path):
    write, flags, named = BLOW_UPS[case]
    structure, run = write(tmp_path / "start.extxyz"), tmp_path / "run"
    started = time.monotonic()
    result = run_fastmace(["md", str(structure), *flags, "--steps", "200", "--restart-every",
                           "10", "--thermo-every", "10", "--traj-every", "0", "-o", str(run)],
                          clean_env)  # fmt: skip
    assert time.monotonic() - started < 120
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert named in result.stderr and "above the bound of" in result.stderr, result.stderr[-2000:]
    last = load_restart(run / "restart.npz").step
    assert last < 200
    assert f"The last good restart is {run / 'restart.npz'} at step {last} " in result.stderr
    assert "--resume" in result.stderr
    metadata = json.loads((run / "metadata.json").read_text())
    assert metadata["status"] == "failed" and named in metadata["error"]


def test_a_checkpoint_swapped_back_and_forth_while_it_is_loaded_never_runs(clean_env, tmp_path):
    """No mock: a thread swaps the file between the demo model and a malicious pickle every
    millisecond while fm.load, fm.md and ``fastmace md`` load it by its SHA-256. Each load
    gives the checked model or refuses the file; the malicious code (which does run when
    trusted: test_model_trust) never runs."""
    import torch

    from fastmace.models.files import ChecksumMismatchError

    marker, path = tmp_path / "marker", tmp_path / "own.model"
    good, bad = tmp_path / "good", tmp_path / "bad"
    shutil.copyfile(DEMO, good)
    torch.save({"payload": WritesMarker(marker)}, bad)
    sha = hashlib.sha256(good.read_bytes()).hexdigest()
    shutil.copyfile(good, path)
    stop, swaps = threading.Event(), [0]

    def swap() -> None:
        staged = tmp_path / "staged"
        while not stop.is_set():
            shutil.copyfile(bad if swaps[0] % 2 == 0 else good, staged)
            os.replace(staged, path)  # atomic: a reader sees one file or the other
            swaps[0] += 1
            time.sleep(0.001)

    outcomes: list[str] = []
    swapper = threading.Thread(target=swap)
    swapper.start()
    try:
        for attempt in range(10):
            try:
                if attempt < 8:
                    assert fm.load(path, sha256=sha).file.sha256 == sha
                else:
                    fm.md(EXAMPLE, model=path, sha256=sha, temperature_K=300.0, steps=2,
                          output=tmp_path / f"run{attempt}", progress=None)  # fmt: skip
                outcomes.append("loaded")
            except ChecksumMismatchError:
                outcomes.append("refused")
        cli = run_fastmace(["md", str(EXAMPLE), "--model", str(path), "--sha256", sha, *SHORT,
                            "-o", str(tmp_path / "cli")], clean_env)  # fmt: skip
    finally:
        stop.set()
        swapper.join()
    assert cli.returncode == 0 or "SHA-256" in cli.stderr, cli.stderr[-2000:]
    assert "Traceback" not in cli.stderr
    assert swaps[0] > 20 and len(outcomes) == 10
    assert not marker.exists(), "the swapped-in pickle ran its code"


def _stale(path: Path) -> Path:
    """A lock file two hours old, held by no process: what a killed build leaves."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")
    old = time.time() - 7200
    os.utime(path, (old, old))
    return path


def test_concurrent_starts_into_one_directory_give_it_one_run_over_stale_locks(clean_env, tmp_path):
    """Two ``fastmace md`` into one directory and one into another, at once, with a cold
    cache of their own that holds stale lock files: one run takes the shared directory, the
    others are refused with the occupied-directory message, and nobody waits on a lock."""
    from fastmace.runtime.stale_locks import find_stale_locks

    clean_env["FASTMACE_CACHE"] = str(tmp_path / "cache")
    extensions = Path(clean_env["TORCH_EXTENSIONS_DIR"])
    locks = [
        _stale(extensions / "oeq_host" / "lock"),
        _stale(tmp_path / "cache" / "oeq" / "b.lock"),
    ]
    shared, alone = tmp_path / "shared", tmp_path / "alone"
    args = ["md", str(EXAMPLE), "--temperature", "300", "--steps", "10", "--thermo-every", "5",
            "--traj-every", "5"]  # fmt: skip
    children = [_start([*args, "-o", str(shared)], clean_env) for _ in range(2)]
    children.append(_start([*args, "-o", str(alone)], clean_env))
    # A wait on a lock file would be endless (torch's build lock) or ten minutes (a soft lock).
    errors = [child.communicate(timeout=600)[1].decode() for child in children]
    codes = [child.returncode for child in children]
    assert codes[2] == 0, errors[2][-2000:]
    assert sorted(codes[:2]) == [0, 1], errors
    for code, error in zip(codes[:2], errors[:2], strict=True):
        if code == 1:
            # Which refusal the loser meets depends on when it looks: the directory already
            # holding output, or its run.lock held by the winner (then naming its process).
            held = f"run directory {shared} already holds output" in error
            locked = f"run directory {shared} is in use by process" in error
            assert held or locked, error
            assert "Traceback" not in error
    for directory in (shared, alone):
        rows = list(csv.DictReader((directory / "thermo.csv").open()))
        assert [int(row["step"]) for row in rows] == [0, 5, 10]
        assert json.loads((directory / "metadata.json").read_text())["status"] == "finished"
        assert not [name for name in os.listdir(directory) if name.startswith(".")]
    found = find_stale_locks([extensions, tmp_path / "cache" / "oeq"])
    assert sorted(lock.path for lock in found) == sorted(locks)  # none waited on, none removed
