"""Every example in the documentation runs: each page's Python blocks in order in one
namespace, its TOML block as the config file its command names, then its ``fastmace`` command
lines as real child processes, in a scratch directory.

The examples name foundation models, GPUs and runs of 100,000 steps; CI has a CPU, no network
and minutes. So each runs with the stand-ins of :data:`STAND_INS` (the shipped demo model for
every model label, 32 copper atoms for every structure file, the CPU for CUDA), at most
:data:`MAX_STEPS` steps, :data:`MAX_REPLICAS` replicas and supercells of :data:`MAX_REPEAT`;
everything else (functions, arguments, options, file names, the order of the blocks) is as
written. The files a page reads from an earlier run (``run/``, ``batch/``, a model file of
your own) are made first by real runs and copies.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import ase.build
import ase.io
import pytest
from helpers.docs_pages import PAGES, ROOT, command_lines

import fastmace as fm

MAX_STEPS = 20
MAX_INTERVAL = 10  # output intervals: at least one row and frame within MAX_STEPS
# Replicas: md.md's 64 copies of the stand-in's 32 atoms took 70 s of the page's 90 on CI's CPU,
# and 4 copies take the same code path (the ladder example has 4, one temperature each).
MAX_REPLICAS = 4
MAX_REPEAT = 2  # supercells: a 4x4x4 copper example is 2,048 atoms, 80 s on a CPU
DEMO = "demo-emt-cu"
STAND_INS = {
    # Model labels (with a head) and the model fetched or loaded by its label.
    "mh-1": DEMO,
    "mh-1:matpes_r2scan": DEMO,
    "mp0-medium": DEMO,
    # MACE-POLAR-1: the polar template, which knows the examples' H, C and O.
    "polar-1": "template:polar-tiny",
    # Structure files: the demo's copper.
    "NaCl.cif": "structure.cif",
    "KCl.cif": "structure.cif",
    "ions.extxyz": "structure.cif",
    "cation.extxyz": "molecule.extxyz",  # a molecule, as the page's: methanol
    "cuda": "cpu",
}
STEP_KEYWORDS = {"steps"}
INTERVAL_KEYWORDS = {"thermo_every", "trajectory_every", "restart_every"}
REPLICA_KEYWORDS = {"replicas"}
# Keyword arguments dropped: the demo model is shipped, so there is nothing to download; the
# CPU stands in for GPUs, so nothing to spread over several.
DROPPED_KEYWORDS = {"download", "gpus"}
# Names a block uses that an earlier part of its page defines in prose ("atoms" is the user's
# structure), given here.
PREAMBLE = "import ase.io\natoms = ase.io.read('structure.cif')\n"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


class _StandIns(ast.NodeTransformer):
    """Rewrites a Python block's constants and keywords as the module docstring says."""

    def visit_Constant(self, node: ast.Constant) -> ast.Constant:
        if isinstance(node.value, str) and node.value in STAND_INS:
            return ast.copy_location(ast.Constant(STAND_INS[node.value]), node)
        return node

    def visit_Call(self, node: ast.Call) -> ast.Call:
        self.generic_visit(node)
        kept = []
        for keyword in node.keywords:
            if keyword.arg in DROPPED_KEYWORDS:
                continue
            cap = _cap_for(keyword.arg)
            if cap is not None and isinstance(keyword.value, ast.Constant):
                keyword.value = ast.copy_location(
                    ast.Constant(min(keyword.value.value, cap)), keyword.value
                )
            kept.append(keyword)
        node.keywords = kept
        return node


def _cap_for(name: str | None) -> int | None:
    if name in STEP_KEYWORDS:
        return MAX_STEPS
    if name in INTERVAL_KEYWORDS:
        return MAX_INTERVAL
    if name in REPLICA_KEYWORDS:
        return MAX_REPLICAS
    return None


def stand_in_python(code: str) -> str:
    """The block with the stand-ins applied."""
    tree = _StandIns().visit(ast.parse(code))
    return ast.unparse(ast.fix_missing_locations(tree))


def stand_in_toml(text: str) -> str:
    """A TOML block with the same stand-ins: string values replaced, counts capped."""
    lines = []
    for line in text.splitlines():
        key, _, value = (part.strip() for part in line.partition("="))
        cap = _cap_for(key)
        if cap is not None:
            value = str(min(int(value), cap))
        elif key == "repeat":
            value = re.sub(r"\d+", lambda n: str(min(int(n.group()), MAX_REPEAT)), value)
        elif value.startswith('"') and value.strip('"') in STAND_INS:
            value = f'"{STAND_INS[value.strip(chr(34))]}"'
        lines.append(f"{key} = {value}" if _ else line)
    return "\n".join(lines) + "\n"


def stand_in_command(line: str) -> list[str]:
    """A ``fastmace`` command line's arguments with the stand-ins applied."""
    words = shlex.split(line)
    for index, word in enumerate(words):
        if word in STAND_INS:
            words[index] = STAND_INS[word]
        elif index and words[index - 1] == "--steps":
            words[index] = str(min(int(word), MAX_STEPS))
        elif index and words[index - 1] == "--replicas":
            words[index] = str(min(int(word), MAX_REPLICAS))
        elif index and words[index - 1] == "--repeat":
            words[index] = re.sub(r"\d+", lambda n: str(min(int(n.group()), MAX_REPEAT)), word)
    if words[1:2] == ["md"] and "--steps" not in words:  # 1000 by default
        words += ["--steps", str(MAX_STEPS)]
    if "template:polar-tiny" in words and "--guard" not in words:
        # Random weights are no physics: the stand-in heats a molecule past the guard's bound.
        words += ["--guard", "off"]
    return words


def _blocks(page: Path, language: str) -> list[str]:
    text = page.read_text(encoding="utf-8")
    return [body for lang, body in BLOCK.findall(text) if lang == language]


def _commands(page: Path) -> list[str]:
    found = []
    for language in ("bash", "sh", "console"):
        for body in _blocks(page, language):
            found += command_lines(body)
    return found


RUNNABLE = [
    page for page in PAGES if _blocks(page, "python") or _blocks(page, "toml") or _commands(page)
]


def _makes_runs(page: Path) -> bool:
    """Whether the page runs MD itself (then it reads its own runs, and none is made for it)."""
    text = page.read_text(encoding="utf-8")
    return any(call in text for call in ("fm.md(", "fastmace md ", "fastmace run "))


def _prepare(directory: Path, earlier_runs: Path | None) -> None:
    """What the examples read: a structure, a model file of one's own, and copies of the
    earlier runs in ``earlier_runs`` (when given)."""
    ase.io.write(directory / "structure.cif", ase.io.read(ROOT / "examples" / "cu-fcc-32.extxyz"))
    ase.io.write(directory / "molecule.extxyz", ase.build.molecule("CH3OH"))
    demo = fm.load(DEMO)
    shutil.copy(demo.origin["checkpoint"], directory / "my-finetuned.model")
    if earlier_runs is not None:
        shutil.copytree(earlier_runs, directory, dirs_exist_ok=True)


def _make_runs(directory: Path) -> None:
    """The earlier runs the examples read: run/, one system, and batch/, two systems, each with
    both trajectory formats (and run-h5md/, run-extxyz/... with one each)."""
    copper = ase.io.read(ROOT / "examples" / "cu-fcc-32.extxyz")
    common = {"model": DEMO, "temperature_K": 300, "steps": MAX_STEPS, "seed": 1}
    intervals = {"thermo_every": 5, "trajectory_every": 5}
    for name, structures in (("run", copper), ("batch", [copper, copper.copy()])):
        for fmt in ("h5md", "extxyz"):
            out = directory / f"{name}-{fmt}"
            fm.md(structures, output=str(out), trajectory_format=fmt, **common, **intervals)
        shutil.copytree(directory / f"{name}-h5md", directory / name)
        shutil.copy(directory / f"{name}-extxyz" / "trajectory.extxyz", directory / name)


@pytest.fixture(scope="module")
def earlier_runs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[], Path]:
    """The earlier runs, made once for the module when a page first needs them (9 s of runs
    for each of four pages before); every page gets its own copy, to read or change."""
    directory = tmp_path_factory.mktemp("earlier-runs")

    @functools.cache
    def made() -> Path:
        _make_runs(directory)
        return directory

    return made


@pytest.mark.parametrize("page", RUNNABLE, ids=[str(p.relative_to(ROOT)) for p in RUNNABLE])
def test_every_example_of_the_page_runs(page, tmp_path, monkeypatch, earlier_runs):
    monkeypatch.chdir(tmp_path)
    _prepare(tmp_path, None if _makes_runs(page) else earlier_runs())
    namespace: dict[str, object] = {"__name__": "__docs__"}
    exec(PREAMBLE, namespace)
    for index, code in enumerate(_blocks(page, "python")):
        try:
            exec(compile(stand_in_python(code), f"{page.name}:block{index}", "exec"), namespace)
        except Exception as error:
            pytest.fail(f"{page.relative_to(ROOT)}, Python block {index}: {error!r}\n{code}")
    environment = {**os.environ, "PYTHONPATH": str(Path(fm.__file__).parents[1])}
    configs = _blocks(page, "toml")
    # A page shows one run both as fm.md and as a command: a reader runs one of them. The
    # command's run directory, made already by the Python block, is taken as a new one (and
    # so in the lines after it), as it would be for a reader who ran only the command.
    renamed: dict[str, str] = {}
    for line in _commands(page):
        # `fastmace run config.toml` runs once per TOML example of the page, each as config.toml.
        for config in configs if "config.toml" in line else [None]:
            if config is not None:
                (tmp_path / "config.toml").write_text(stand_in_toml(config), encoding="utf-8")
                for old in tmp_path.glob("screen*"):  # each example's output directory is new
                    shutil.rmtree(old)
            _run_command(page, line, tmp_path, environment, renamed)


def _run_command(page: Path, line: str, directory: Path, environment: dict[str, str],
                 renamed: dict[str, str]) -> None:  # fmt: skip
    """One command line of ``page``, with the stand-ins, as a child process."""
    words = stand_in_command(line)
    words[2:] = [renamed.get(word, word) for word in words[2:]]  # not the command itself
    for index, word in enumerate(words[:-1]):
        if word in ("-o", "--output") and (directory / words[index + 1]).exists():
            renamed[words[index + 1]] = words[index + 1] + "-command"
            words[index + 1] = renamed[words[index + 1]]
    done = subprocess.run(
        [sys.executable, "-m", "fastmace", *words[1:]],
        cwd=directory, env=environment, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    # doctor exits 1 on a machine that lacks what a GPU run needs: still an answer.
    allowed = (0, 1) if words[1] == "doctor" else (0,)
    assert done.returncode in allowed, (
        f"{page.relative_to(ROOT)}: `{line}` (run as `{shlex.join(words)}`) exited "
        f"{done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    )
