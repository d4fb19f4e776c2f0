"""A run request is checked whole before anything is created or loaded, and every refusal
names the file or setting and the fix: fm.md, ``fastmace md`` and ``fastmace run`` in child
processes, with the demo model, as users run them."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import ase
import ase.build
import pytest
from conftest import EXAMPLE, run_fastmace, run_python, tree

from fastmace.structures import chemical_formula

SHORT = ["--temperature", "300", "--steps", "2"]

# Requests fm.md must refuse before it loads a model or creates the run directory: each case
# is (keyword arguments, a part of the message). Run in one child process (see below).
REFUSED = {
    "negative friction": ({"friction_per_ps": -1.0}, "friction_per_ps=-1 1/ps is not allowed"),
    "NaN friction": ({"friction_per_ps": float("nan")}, "friction_per_ps=nan is not allowed"),
    "tau 0": ({"ensemble": "nvt-csvr", "tau_fs": 0}, "tau_fs=0 fs is not allowed: it must be > 0"),
    "unknown cell mode": (
        {"ensemble": "npt", "pressure_GPa": 0.0, "cell_mode": "weird"},
        "cell_mode='weird' is not allowed: choose one of isotropic, per_axis, full",
    ),
    "chain length 0": (
        {"ensemble": "nhc", "chain_length": 0},
        "chain_length=0 is not allowed: give a whole number >= 1",
    ),
    "two pressures": (
        {"ensemble": "npt", "pressure_GPa": 0.0, "pressure_bar": 1.0},
        "exactly one of pressure_GPa or pressure_bar",
    ),
    "unknown format": ({"trajectory_format": "xyz"}, "trajectory_format='xyz' is not allowed"),
    "float seed": ({"seed": 1.5}, "seed=1.5 is not allowed: give a whole number"),
    "seed beyond 64 bits": (
        {"seed": 2**64},
        "seed=18446744073709551616 is not allowed: give a whole number from "
        "-9223372036854775808 to 9223372036854775807",
    ),
    "string resume": ({"resume": "no"}, "resume='no' is not allowed: give True or False"),
    "bad initial temperature": (
        {"initial_temperature_K": -5.0},
        "initial_temperature_K=-5 K is not allowed",
    ),
    "string temperature": ({"temperature_K": "hot"}, "temperature_K='hot' is not allowed"),
    "model of the wrong kind": ({"model": 7}, "model=7 is not allowed: give a label"),
    "missing model file": ({"model": "mh-1"}, "fetch it once"),
    "cold rescaling start": (
        {"ensemble": "nvt-csvr", "initial_temperature_K": 0.0},
        "cannot heat system 0 from rest",
    ),
    "a single atom thermostatted": ({"structure": "single atom"}, "at least 2 atoms per system"),
    "a zero mass": (
        {"structure": "zero mass"},
        "masses that are not positive and finite (atom 3: 0",
    ),
    "exchange under NPT": (
        {
            "ensemble": "npt",
            "pressure_GPa": 0.0,
            "replicas": 2,
            "temperature_K": [300.0, 350.0],
            "exchange_every": 10,
        },
        "replica exchange is not offered under npt: a swap between walkers at different volumes",
    ),
    "exchange without a thermostat": (
        {"ensemble": "nve", "replicas": 2, "temperature_K": None, "exchange_every": 10},
        "the nve ensemble has no thermostat",
    ),
    "exchange ladder descending": (
        {"replicas": 2, "temperature_K": [400.0, 300.0], "exchange_every": 10},
        "strictly ascending, lowest first; got [400.0, 300.0]",
    ),
    "exchange with one temperature": (
        {"replicas": 2, "exchange_every": 10},
        "needs one temperature per replica (2 replicas, 1 temperatures)",
    ),
    "negative exchange interval": (
        {"exchange_every": -1},
        "exchange_every=-1 is not allowed: give a whole number >= 0",
    ),
}

_REFUSALS = """
import json, sys
import ase
import ase.io
import fastmace as fm

cases = json.loads(sys.argv[1])
example, out = sys.argv[2], sys.argv[3]
seen = {}
for name, (arguments, _) in cases.items():
    kind = arguments.pop("structure", None)
    structure = example
    if kind == "single atom":
        structure = ase.Atoms("Cu", cell=[5, 5, 5], pbc=True)
    elif kind == "zero mass":
        structure = ase.io.read(example)
        masses = structure.get_masses()
        masses[3] = 0.0
        structure.set_masses(masses)
    arguments = {"temperature_K": 300.0, "steps": 2, "output": f"{out}/{len(seen)}", **arguments}
    try:
        fm.md(structure, **arguments)
    except Exception as error:
        seen[name] = [type(error).__name__, str(error)]
    else:
        seen[name] = ["ran", ""]
seen["heavy modules"] = sorted(m for m in ("torch", "mace", "e3nn") if m in sys.modules)
print(json.dumps(seen))
"""


def test_every_refusal_comes_before_a_model_is_loaded_or_a_file_created(clean_env, tmp_path):
    out = tmp_path / "runs"
    out.mkdir()
    cases = json.dumps(REFUSED)
    result = subprocess.run(
        [sys.executable, "-c", _REFUSALS, cases, str(EXAMPLE), str(out)],
        env=clean_env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout)
    for name, (_, message) in REFUSED.items():
        kind, text = seen[name]
        assert kind != "ran", f"{name}: fm.md ran"
        assert message in text, f"{name}: {kind}: {text}"
    # Structural proof that nothing was loaded: torch was never even imported.
    assert seen["heavy modules"] == []
    assert tree(out) == set(), "a refused request left files behind"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--friction", "-1"], "friction_per_ps=-1 1/ps is not allowed: it must be >= 0 1/ps "
                               "(given as --friction)"),
        (["--ensemble", "csvr", "--tau", "0"], "tau_fs=0 fs is not allowed"),
        (["--ensemble", "npt", "--pressure", "0", "--cell-mode", "weird"],
         "cell_mode='weird' is not allowed"),
        (["--format", "xyz"], "trajectory_format='xyz' is not allowed"),
        (["--temperature", "-3"], "temperature_K=-3 K is not allowed: it must be >= 0 K "
                                  "(given as --temperature)"),
    ],
)  # fmt: skip
def test_fastmace_md_refuses_bad_ensemble_settings_leaving_no_directory(
    clean_env, tmp_path, args, message
):
    run = tmp_path / "run"
    result = run_fastmace(["md", str(EXAMPLE), *SHORT, "-o", str(run), *args], clean_env)
    assert result.returncode == 1
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not run.exists()


def test_format_none_runs_and_writes_no_trajectory(clean_env, tmp_path):
    run = tmp_path / "run"
    args = ["md", str(EXAMPLE), *SHORT, "--traj-every", "1", "--format", "none", "-o", str(run)]
    result = run_fastmace(args, clean_env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (run / "thermo.csv").is_file() and not list(run.glob("trajectory.*"))


def _config(tmp_path: Path, *lines: str) -> Path:
    (tmp_path / "cu.extxyz").write_text(EXAMPLE.read_text())
    given = {line.split("=")[0].strip() for line in lines}
    defaults = ['structure = "cu.extxyz"', "temperature_K = 300", "steps = 2", 'output = "run"']
    kept = [line for line in defaults if line.split("=")[0].strip() not in given]
    path = tmp_path / "config.toml"
    path.write_text("\n".join([*kept, *lines]) + "\n")
    return path


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('temperature_K = "hot"', "temperature_K='hot' is not allowed: give a number (K)"),
        ("model = 7", "model=7 is not allowed: give a label"),
        ("structure = 42", "structure = 42 is not allowed: give the path of a structure file"),
        ('resume = "no"', "resume='no' is not allowed: give True or False (true or false in TOML)"),
        ("seed = 1.5", "seed=1.5 is not allowed: give a whole number"),
        ("initial_temperature_K = -5", "initial_temperature_K=-5 K is not allowed"),
        ("chain_length = 0", "the nvt-langevin ensemble does not take chain_length"),
        ('pressure_bar = 1\npressure_GPa = 0\nensemble = "npt"', "exactly one of pressure_GPa"),
    ],
)
def test_run_config_values_of_the_wrong_kind_name_the_file_and_the_key(
    clean_env, tmp_path, line, message
):
    config = _config(tmp_path, *line.split("\n"))
    result = run_fastmace(["run", str(config)], clean_env)
    assert result.returncode == 1
    assert f"fastmace: error: {config}: " in result.stderr and message in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("structure.abc", b"hello\n", "ASE does not know the format of '.abc' files"),
        ("structure.xyz", bytes(range(128, 256)) * 8, "holds bytes that are not text"),
        ("structure.cif", bytes(range(256)) * 8, "ASE's reader of '.cif' files failed"),
        ("empty.xyz", b"0\n\n", "holds no atoms"),
        ("zero.xyz", b"", "is empty"),
    ],
)
def test_unreadable_structure_files_are_named_with_the_fix(
    clean_env, tmp_path, name, content, message
):
    path = tmp_path / name
    path.write_bytes(content)
    result = run_fastmace(["md", str(path), *SHORT, "-o", str(tmp_path / "run")], clean_env)
    assert result.returncode == 1
    assert f"structure file {path}" in result.stderr and message in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()
    if "no atoms" not in message:
        assert "`ase info --formats` lists them" in result.stderr or "ase convert" in result.stderr


def test_binary_run_config_is_named(clean_env, tmp_path):
    config = tmp_path / "config.toml"
    config.write_bytes(bytes(range(128, 256)))
    result = run_fastmace(["run", str(config)], clean_env)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"{config} is not a run config: it holds bytes that are not UTF-8 text" in result.stderr


@contextlib.contextmanager
def _unwritable(directory: Path):
    """``directory`` made unwritable for this process (root needs the immutable attribute)."""
    directory.chmod(0o555)
    immutable = False
    if os.access(directory, os.W_OK):
        immutable = (
            subprocess.run(["chattr", "+i", str(directory)], capture_output=True).returncode == 0
        )
    try:
        if os.access(directory, os.W_OK):
            pytest.skip("cannot make a directory unwritable for this user here")
        yield
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(directory)], check=True)
        directory.chmod(0o755)


@pytest.mark.parametrize("inside", [False, True], ids=["the directory", "its parent"])
def test_unwritable_run_directory_says_which_directory_and_why(clean_env, tmp_path, inside):
    locked = tmp_path / "locked"
    locked.mkdir()
    run = locked / "run" if inside else locked
    with _unwritable(locked):
        result = run_fastmace(["md", str(EXAMPLE), *SHORT, "-o", str(run)], clean_env)
        assert list(locked.iterdir()) == []
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"cannot create run directory {run}: this process may not write in {locked}" in (
        result.stderr
    )
    assert ".tmp" not in result.stderr and "choose a directory you can write to" in result.stderr


def test_occupied_directory_tells_each_user_how_to_resume(clean_env, tmp_path):
    import fastmace as fm
    from fastmace.io import OccupiedRunDirectoryError

    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("mine\n")
    before = tree(run)
    md = run_fastmace(["md", str(EXAMPLE), *SHORT, "-o", str(run)], clean_env)
    assert md.returncode == 1
    assert "continue that run with --resume" in md.stderr and "RunDirectory" not in md.stderr
    config = _config(tmp_path, f'output = "{run}"')
    toml = run_fastmace(["run", str(config)], clean_env)
    assert toml.returncode == 1 and f"continue that run with resume = true in {config}" in (
        toml.stderr
    )
    with pytest.raises(OccupiedRunDirectoryError, match=r"with resume=True$"):
        fm.md(EXAMPLE, temperature_K=300.0, steps=2, output=run)
    assert tree(run) == before and (run / "notes.txt").read_text() == "mine\n"


@pytest.mark.parametrize(
    ("name", "value", "allowed"),
    [
        ("FASTMACE_SOFT_FILE_LOCKS", "yes", "leave it unset, or set it to 1 or 0"),
        ("CUDA_CACHE_PATH", "relative/cache", "give an absolute path"),
        ("MAX_JOBS", "many", "set it to a positive integer"),
    ],
)
def test_bad_variables_refuse_the_run_with_their_name(clean_env, tmp_path, name, value, allowed):
    clean_env[name] = value
    result = run_fastmace(["md", str(EXAMPLE), *SHORT, "-o", str(tmp_path / "run")], clean_env)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"fastmace: error: {name}={value!r} is not allowed: {allowed}" in result.stderr
    assert not (tmp_path / "run").exists()
    imported = run_python("import fastmace; print(fastmace.runtime_info().lock_mode)", clean_env)
    assert imported.returncode == 0 and "Traceback" not in imported.stderr


@pytest.mark.parametrize(
    "atoms",
    [
        ase.build.molecule("CH3CH2OH"),  # Hill order: C, then H, then the rest alphabetically
        ase.build.bulk("NaCl", "rocksalt", a=5.64, cubic=True).repeat(2),
        ase.build.bulk("Cu", "fcc", a=3.6).repeat((3, 1, 1)),
        ase.Atoms("BrCH3"),  # CH3Br in Hill order, BrCH3 alphabetically
        ase.Atoms("OH2ClNa"),  # no carbon: alphabetical, H among the others
    ],
    ids=["ethanol", "nacl", "copper", "bromomethane", "no-carbon"],
)
def test_the_formula_from_element_counts_is_ases(atoms):
    assert chemical_formula(atoms) == atoms.get_chemical_formula()
