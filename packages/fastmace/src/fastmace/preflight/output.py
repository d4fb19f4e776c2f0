"""Checks of what a run writes and where: format, intervals, and the run directory itself.

The directory is looked at, never created: a new run's must be free and writable, a resumed
run's must hold a run with a restart (:meth:`fastmace.io.RunDirectory.check_can_create`,
:meth:`~fastmace.io.RunDirectory.check_can_resume`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fastmace.io.restart import restart_step
from fastmace.io.run_directory import RunDirectory
from fastmace.io.trajectory import FORMATS
from fastmace.preflight.values import RequestError, one_of, optional_path, switch, whole
from fastmace.resuming import too_few_steps

INTERVALS = ("trajectory_every", "thermo_every", "restart_every")


def check_output_settings(arguments: dict[str, Any]) -> None:
    """Kinds and values of the output settings among ``arguments`` (fm.md's keywords)."""
    if "trajectory_format" in arguments:
        one_of("trajectory_format", arguments["trajectory_format"], FORMATS)
    for name in INTERVALS:
        if name in arguments:
            whole(name, arguments[name], minimum=0)
    optional_path("output", arguments.get("output"), "the run directory")
    if "resume" in arguments:
        switch("resume", arguments["resume"])


def check_run_directory(
    output: str | os.PathLike[str] | None, resume: bool, steps: int | None = None
) -> None:
    """The run directory can be created (a new run) or continued (``resume``) to ``steps``
    (the whole run's length)."""
    if output is None:
        if resume:
            raise RequestError(
                "resume=True needs output=, the run directory of the run to continue", "resume"
            )
        return
    directory = RunDirectory(Path(output))
    if not resume:
        directory.check_can_create()
        return
    from fastmace.batching import batch_directories

    # A request that ran in batches resumes each batch it had started.
    for each in [RunDirectory(path) for path in batch_directories(output)] or [directory]:
        each.check_can_resume()
        if steps is not None:  # here: at the run's start the files are already cut back
            fewer = too_few_steps(steps, restart_step(each.restart_path), each.path)
            if fewer is not None:
                raise RequestError(fewer, "steps")
