"""The toolchain path of OpenEquivariance's host extension on a GPU machine.

With FASTMACE_OEQ_PREBUILT=0 and a fresh cache: a first process builds the extension
(``built``), a second reuses it (``reused``), two more started together on another fresh cache
race (one ``built``, one ``raced``); every process then converts the demo model to the hybrid
backend, which fastmace checks against mace-torch's e3nn model, and the nvcc stand-in's log
stays empty. Prints one JSON line per process and a verdict.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import json, fastmace as fm
from fastmace.oeq import host_extension
model = fm.load("demo-emt-cu", backend="hybrid", device="cuda", dtype="float32")
check = model.conversion_check
record = host_extension.record()
print(json.dumps({"how": record.how, "path": record.path, "key": record.key,
                  "skipped": record.prebuilt_skipped, "backend": model.backend,
                  "force_error": check.force_error_ev_per_a,
                  "force_tolerance": check.force_tolerance_ev_per_a, "passed": check.passed}))
"""


def start(cache: Path) -> subprocess.Popen:
    env = {**os.environ, "FASTMACE_OEQ_PREBUILT": "0", "FASTMACE_CACHE": str(cache)}
    return subprocess.Popen(
        [sys.executable, "-c", CHILD], env=env, stdout=subprocess.PIPE, text=True
    )


def finish(process: subprocess.Popen) -> dict:
    out, _ = process.communicate(timeout=900)
    if process.returncode != 0:
        raise SystemExit(f"a child failed with {process.returncode}")
    result = json.loads(out.strip().splitlines()[-1])
    print(json.dumps(result))
    return result


def main() -> None:
    scratch = Path(tempfile.mkdtemp())
    first = finish(start(scratch / "cache-a"))
    second = finish(start(scratch / "cache-a"))
    pair = [finish(p) for p in [start(scratch / "cache-b"), start(scratch / "cache-b")]]
    hows = [first["how"], second["how"], sorted(r["how"] for r in pair)]
    logs = [scratch / c / "oeq" / "nvcc-attempts.log" for c in ("cache-a", "cache-b")]
    nvcc_calls = sum(len(p.read_text().splitlines()) for p in logs if p.exists())
    passed = all(r["passed"] for r in [first, second, *pair])
    ok = hows == ["built", "reused", ["built", "raced"]] and nvcc_calls == 0 and passed
    print(f"toolchain path: {hows}; nvcc calls {nvcc_calls}; hybrid checks passed: {passed}")
    print("VERDICT", "ok" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
