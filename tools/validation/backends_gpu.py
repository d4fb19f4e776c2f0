"""Check every backend conversion against mace-torch's e3nn model on the GPU; print a table.

Run on the GPU test machine (see docs/validation/backends.md for the exact command):

    python tools/validation/backends_gpu.py --out report.md

For each template, backend (cueq, oeq, hybrid) and dtype it converts the e3nn model with
mace-torch's own converter, evaluates both on the same small periodic structure and reports
the largest energy and force differences next to the tolerances of
``fastmace.models.backends.rounding_tolerances``.
"""

from __future__ import annotations

import argparse
import time
import traceback

import fastmace  # isort: skip  (before torch: it makes PyTorch's file locks NFS-safe)
import torch

from fastmace.models.backends import availability, check_conversion, convert
from fastmace.models.templates import template


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="where to write the markdown table")
    parser.add_argument(
        "--templates", default="tiny,mp0-small,mp0-medium,mp0-large,off23-medium,mh-1"
    )
    args = parser.parse_args()
    device = "cuda"
    rows = [
        "| template | backend | dtype | energy error (eV) | tolerance | max force error (eV/Å)"
        " | tolerance | passed | convert+check (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    failures = 0
    for name in args.templates.split(","):
        started = time.perf_counter()
        model = template(name, seed=0)
        print(f"{name}: built in {time.perf_counter() - started:.1f} s", flush=True)
        for backend in ("cueq", "oeq", "hybrid"):
            found = availability(backend, device)
            if not found.available:
                rows.append(f"| {name} | {backend} | - | unavailable: {found.reason} |||||")
                continue
            for dtype in (torch.float32, torch.float64):
                started = time.perf_counter()
                try:
                    converted = convert(model, backend, device, dtype)
                    check = check_conversion(model, converted, backend)
                except Exception as error:  # report and go on: one table for every case
                    traceback.print_exc()
                    rows.append(f"| {name} | {backend} | {dtype} | error: {error!r:.120} |||||")
                    failures += 1
                    continue
                seconds = time.perf_counter() - started
                failures += not check.passed
                rows.append(
                    f"| {name} | {backend} | {check.dtype} | {check.energy_error_ev:.3g} | "
                    f"{check.energy_tolerance_ev:.3g} | {check.force_error_ev_per_a:.3g} | "
                    f"{check.force_tolerance_ev_per_a:.3g} | {'yes' if check.passed else 'NO'} | "
                    f"{seconds:.1f} |"
                )
                print(rows[-1], flush=True)
                del converted
                torch.cuda.empty_cache()
    header = (
        f"GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}; "
        f"fastmace {fastmace.__version__}\n\n"
    )
    with open(args.out, "w", encoding="utf-8") as report:
        report.write(header + "\n".join(rows) + "\n")
    print(header + "\n".join(rows))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
