"""What a warm start pays before FastMACE's own work: each import in a fresh process, twice.

Run on the GPU machine after ``. .gpu/setup.sh``. The model phase of a warm ``fastmace md``
reads the kept conversion, which imports mace-torch's model code, e3nn and cuEquivariance; its
request check imports torch and ASE's readers. mace-torch's model code is also timed with
``TORCHINDUCTOR_COMPILE_THREADS=1``, which stage 117 saw shorten the model phase.

    python3 tools/validation/import_floor.py [--once]
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

CASES = (
    ("python alone", "pass", {}),
    ("torch", "import torch", {}),
    ("torch + ase.io", "import torch, ase.io", {}),
    ("torch + a CUDA context", "import torch; torch.zeros(1, device='cuda')", {}),
    ("cuequivariance_ops_torch", "import cuequivariance_ops_torch", {}),
    ("cuequivariance_torch", "import cuequivariance_torch", {}),
    ("e3nn.o3", "import e3nn.o3", {}),
    ("mace.modules", "import mace.modules", {}),
    ("mace.modules, one compile thread", "import mace.modules",
     {"TORCHINDUCTOR_COMPILE_THREADS": "1"}),
    ("torch._inductor.compile_fx", "import torch._inductor.compile_fx", {}),
    ("fastmace.cli", "import fastmace.cli", {}),
)  # fmt: skip


def main() -> None:
    rounds = 1 if "--once" in sys.argv else 2
    for label, code, extra in CASES:
        for _ in range(rounds):
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-c", code], env={**os.environ, **extra},
                                  capture_output=True, text=True)  # fmt: skip
            seconds = time.perf_counter() - start
            failed = "" if done.returncode == 0 else f"  (failed: {done.stderr[-200:]!r})"
            print(f"{label:36s} {seconds:6.2f} s{failed}", flush=True)


if __name__ == "__main__":
    main()
