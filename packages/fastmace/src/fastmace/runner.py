"""The subprocess runner: ``fm.md(..., runner=fm.RunnerConfig(subprocess=True))`` in a child.

A run in a child process is isolated from the caller's process state: whatever the run loads,
captures, compiles or sets stays in the child. The parent reads the structures (a bad path
fails at once), then hands the run over through a private directory
``<cache>/handoff/<run>/``:

- ``structures.traj``: the structures (ASE's binary format: float64, velocities and masses
  kept exactly);
- ``request.json``: ``fm.md``'s keyword arguments, and the names of the extra variables;
- ``final.traj`` and ``result.json``, written back by the child: ``MDResult``'s final
  structures and its other fields; or ``error.json``, the child's error.

``python -m fastmace.runner_child REQUEST.json`` is the child: it calls :func:`fastmace.api.md`
in its own process with the same arguments. A run with an ``output`` directory writes it there,
as in process; a run without one writes nothing but the hand-off. The parent removes the hand-off
directory when it has read the result, and on every failure.

The child gets this process's environment plus ``RunnerConfig.environment``, with the directory
holding this FastMACE first on PYTHONPATH (:func:`fastmace.runtime.environment.child_environment`).
Its output (progress lines, warnings, a traceback) is passed on, line by line, to ``progress``
(``sys.stderr`` by default); progress arrives as plain lines, since the child writes to a pipe.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TextIO

import ase
import ase.io

from fastmace.runs import MDResult
from fastmace.runtime.cache import handoff_dir
from fastmace.runtime.environment import child_environment

REQUEST = "request.json"
STRUCTURES = "structures.traj"
RESULT = "result.json"
FINAL = "final.traj"
ERROR = "error.json"
# Lines of the child's output kept for the error message of a failed run.
TAIL_LINES = 40
# How long to wait for the rest of the child's output once it has ended: a process the child
# started may still hold the pipe open, and must not hold up the caller.
DRAIN_S = 10.0
# How often a child's wait looks at its ``stop`` event, in seconds.
STOP_POLL_S = 0.5


class RunnerError(RuntimeError):
    """The run's child process failed or did not finish in time."""

    def __init__(self, message: str, returncode: int | None, child_error: str | None, tail: str):
        super().__init__(message)
        self.returncode = returncode
        """The child's exit code (None: stopped after ``timeout_s``)."""
        self.child_error = child_error
        """The child's exception as ``Type: message``, when it got as far as raising one."""
        self.tail = tail
        """The last lines of the child's output (stderr and stdout)."""


class ChildStopped(RunnerError):
    """The child was stopped from outside (``run_in_subprocess``'s ``stop``), not failed."""


@dataclass(frozen=True, kw_only=True)
class RunnerConfig:
    """How ``fm.md`` runs: in this process or a child one, and what child processes get."""

    subprocess: bool = False
    """Run the MD in a child process (``fastmace md --subprocess``)."""
    environment: Mapping[str, str] = field(default_factory=dict, hash=False)
    """Extra variables for every child process FastMACE starts for this run: the run's own
    child and the gate's reference child. This process's environment is never changed."""
    timeout_s: float | None = None
    """Stop the run's child process after this many seconds (None: no limit)."""

    def __post_init__(self) -> None:
        if not isinstance(self.subprocess, bool):
            raise ValueError(
                f"RunnerConfig(subprocess={self.subprocess!r}) is not allowed: use True or False"
            )
        if not isinstance(self.environment, Mapping):
            raise ValueError(
                f"RunnerConfig(environment={self.environment!r}) is not allowed: use a mapping "
                "of variable names to values, e.g. {'OMP_NUM_THREADS': '4'}"
            )
        for name, value in self.environment.items():
            if not isinstance(name, str) or not name or "=" in name or "\0" in name:
                raise ValueError(
                    f"RunnerConfig.environment: {name!r} is not a variable name: use a non-empty "
                    "string without '=' or NUL"
                )
            if not isinstance(value, str) or "\0" in value:
                raise ValueError(
                    f"RunnerConfig.environment[{name!r}] = {value!r} is not allowed: values are "
                    "strings (without NUL), as in the shell; write numbers as text, e.g. '4'"
                )
        # A private copy: the config stays as it was made, whatever happens to the caller's dict.
        object.__setattr__(self, "environment", MappingProxyType(dict(self.environment)))
        timeout = self.timeout_s
        if timeout is not None and not (
            isinstance(timeout, int | float)
            and not isinstance(timeout, bool)
            and math.isfinite(timeout)
            and timeout > 0
        ):
            raise ValueError(
                f"RunnerConfig(timeout_s={timeout!r}) is not allowed: use a positive number of "
                "seconds, or None (no limit)"
            )

    def to_dict(self) -> dict[str, Any]:
        """Every field: JSON-serialisable."""
        return {
            "subprocess": self.subprocess,
            "environment": dict(self.environment),
            "timeout_s": self.timeout_s,
        }


def runner_record(runner: RunnerConfig, in_child: bool) -> dict[str, Any]:
    """``metadata.json``'s ``runner``: where the run ran, and the names (not the values) of the
    extra variables, which may hold secrets."""
    return {"subprocess": in_child, "environment": sorted(runner.environment)}


# -- the parent ----------------------------------------------------------------------------


def plain(value: Any) -> Any:
    """JSON for the few non-JSON types fm.md's arguments commonly hold."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if hasattr(value, "tolist"):  # NumPy arrays and scalars
        return value.tolist()
    raise TypeError(f"a {type(value).__name__} is not JSON")


def encode_arguments(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """``fm.md``'s keyword arguments as JSON values; a value that is not JSON is refused."""
    encoded = {}
    for name, value in arguments.items():
        if name in ("config", "guard") and hasattr(value, "to_dict"):
            value = value.to_dict()  # an fm.EngineConfig or fm.GuardConfig
        try:
            encoded[name] = json.loads(json.dumps(value, default=plain))
        except (TypeError, ValueError) as error:
            raise TypeError(
                f"fm.md(..., runner=RunnerConfig(subprocess=True)) sends its arguments to the "
                f"child process as JSON, and {name}={value!r} cannot be sent ({error}); use "
                "numbers, strings, paths and lists"
            ) from None
    return encoded


def _run_child(
    request: Path, runner: RunnerConfig, stream: TextIO, stop: threading.Event | None = None
) -> tuple[int | None, str]:
    """Run the child on ``request``, passing its output on to ``stream``; (exit code, tail).

    The exit code is None when the child was stopped: after ``runner.timeout_s``, or once
    ``stop`` is set.
    """
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    child = subprocess.Popen(
        [sys.executable, "-m", "fastmace.runner_child", str(request)],
        env=child_environment(runner.environment),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
    )  # fmt: skip

    def relay() -> None:
        forward = True
        for line in child.stdout:
            tail.append(line)
            if forward:
                try:
                    stream.write(line)
                    stream.flush()
                except (OSError, ValueError):  # a closed stream: keep draining, or the child blocks
                    forward = False

    relaying = threading.Thread(target=relay, daemon=True)
    relaying.start()
    try:
        returncode = _wait(child, runner.timeout_s, stop)
    finally:  # a timeout or an interrupt in this process: the child must not outlive the call
        if child.poll() is None:
            child.kill()
            child.wait()
        relaying.join(DRAIN_S)
    return returncode, "".join(tail)


def _wait(
    child: subprocess.Popen[str], timeout_s: float | None, stop: threading.Event | None
) -> int | None:
    """The child's exit code, or None after ``timeout_s`` or once ``stop`` is set."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while stop is None or not stop.is_set():
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return None
        # Without ``stop`` one wait does; with it, short waits, so a stop is seen promptly.
        wait = left if stop is None else min(STOP_POLL_S, left if left is not None else math.inf)
        try:
            return child.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    return None


def _failure(
    handoff: Path, returncode: int | None, tail: str, timeout_s: float | None
) -> RunnerError:
    error_file = handoff / ERROR
    child_error = None
    if error_file.is_file():
        document = json.loads(error_file.read_text(encoding="utf-8"))
        child_error = f"{document['type']}: {document['message']}"
    if returncode is None:
        what = f"did not finish within {timeout_s} s (RunnerConfig.timeout_s) and was stopped"
    else:
        what = f"failed with exit code {returncode}"
    message = f"the run's child process {what}"
    if child_error:
        message += f": {child_error}"
    message += "\nthe child's last output:\n" + (tail.strip()[-2000:] or "(none)")
    return RunnerError(message, returncode, child_error, tail)


def _read_result(handoff: Path) -> MDResult:
    fields = json.loads((handoff / RESULT).read_text(encoding="utf-8"))
    output = fields.pop("output")
    structures = ase.io.read(handoff / FINAL, index=":", format="traj")
    return MDResult(structures=structures, output=Path(output) if output else None, **fields)


def run_in_subprocess(
    arguments: Mapping[str, Any],
    structures: list[ase.Atoms],
    runner: RunnerConfig,
    progress: TextIO | None = None,
    stop: threading.Event | None = None,
) -> MDResult:
    """Run ``fm.md(structures, **arguments)`` in a child process and return its result.

    ``arguments`` are ``fm.md``'s keyword arguments but ``progress`` and ``runner``. The
    child's output goes to ``progress`` (default ``sys.stderr``). Raises :class:`RunnerError`
    when the child fails or runs past ``runner.timeout_s``, and :class:`ChildStopped` when
    another thread sets ``stop`` first (the child is then stopped); the hand-off directory is
    removed in every case.
    """
    request = {
        "arguments": encode_arguments(arguments),  # before anything is written: may refuse
        "environment": sorted(runner.environment),  # names only: the child has the values
    }
    handoff = handoff_dir()
    try:
        ase.io.write(handoff / STRUCTURES, structures, format="traj")
        (handoff / REQUEST).write_text(json.dumps(request), encoding="utf-8")
        stream = sys.stderr if progress is None else progress
        returncode, tail = _run_child(handoff / REQUEST, runner, stream, stop)
        if returncode is None and stop is not None and stop.is_set():
            raise ChildStopped("the run's child process was stopped", None, None, tail)
        if returncode != 0:
            raise _failure(handoff, returncode, tail, runner.timeout_s)
        return _read_result(handoff)
    finally:
        shutil.rmtree(handoff, ignore_errors=True)
