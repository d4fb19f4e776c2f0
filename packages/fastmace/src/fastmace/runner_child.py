"""The runner's child process: ``python -m fastmace.runner_child REQUEST.json``.

It reads what :func:`fastmace.runner.run_in_subprocess` handed over, runs :func:`fastmace.api.md`
here, and writes the result (or the error) beside the request. It is the only module that
imports both the runner and the API, so neither imports the other.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import ase.io

from fastmace.api import md
from fastmace.child_run import as_child
from fastmace.planner import EngineConfig
from fastmace.runner import ERROR, FINAL, RESULT, STRUCTURES, RunnerConfig, plain
from fastmace.runs import MDResult


def _write_result(result: MDResult, handoff: Path) -> None:
    fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
    structures = fields.pop("structures")
    fields["output"] = str(fields["output"]) if fields["output"] is not None else None
    ase.io.write(handoff / FINAL, structures, format="traj")
    # Written last: its presence means the result is complete.
    (handoff / RESULT).write_text(json.dumps(fields, default=plain), encoding="utf-8")


def main(request_path: str) -> None:
    """Run ``fm.md`` as the request says and write the result beside it."""
    handoff = Path(request_path).parent
    try:
        request = json.loads(Path(request_path).read_text(encoding="utf-8"))
        arguments = dict(request["arguments"])
        if arguments.get("config") is not None:
            arguments["config"] = EngineConfig(**arguments["config"])
        structures = ase.io.read(handoff / STRUCTURES, index=":", format="traj")
        # The values came with this process's environment; the gate's child gets them again.
        environment = {name: os.environ[name] for name in request["environment"]}
        runner = RunnerConfig(environment=environment)
        # A spread ladder's part comes in the request (fastmace.spread), not as an argument.
        group = arguments.pop("_exchange_group", None)
        with as_child(exchange_group=group):
            result = md(structures, **arguments, runner=runner)
        _write_result(result, handoff)
    except BaseException as error:
        document = {"type": type(error).__name__, "message": str(error)}
        (handoff / ERROR).write_text(json.dumps(document), encoding="utf-8")
        raise  # the traceback goes to stderr, which the parent passes on and keeps the tail of


if __name__ == "__main__":
    main(sys.argv[1])
