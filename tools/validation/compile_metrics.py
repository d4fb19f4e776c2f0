"""Where a torch.compile start-up spends its time, from a TORCH_TRACE directory.

Run a command with ``TORCH_TRACE=DIR`` set (torch's structured trace, the input of tlparse),
then ``python tools/validation/compile_metrics.py DIR``: one JSON line per compiled frame with
its timings (Dynamo, AOTAutograd, Inductor, code generation), the caches it hit or missed, and
the frame's name. The trace holds whole graphs; only these lines are worth keeping.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# The fields of torch's CompilationMetrics worth a line: times and cache outcomes.
KEPT_SUFFIXES = ("_s", "_us", "_count", "_cache_hit", "_cache_miss", "_cache_bypass")
KEPT_FIELDS = ("co_name", "co_filename", "frame_key", "fail_reason", "restart_reasons")


def metrics_of(line: str) -> dict | None:
    """The compilation metrics in one trace line, or None for any other line."""
    if '"compilation_metrics"' not in line:
        return None
    try:
        record = json.loads(line[line.index("{") :])
    except ValueError:
        return None
    metrics = record.get("compilation_metrics")
    if not isinstance(metrics, dict):
        return None
    return {
        name: value
        for name, value in metrics.items()
        if value not in (None, "", [], {})
        and (name in KEPT_FIELDS or name.endswith(KEPT_SUFFIXES) or "cache" in name)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path, help="the TORCH_TRACE directory")
    args = parser.parse_args()
    for path in sorted(args.trace.glob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            metrics = metrics_of(line)
            if metrics is not None:
                print(json.dumps(metrics, sort_keys=True))


if __name__ == "__main__":
    main()
