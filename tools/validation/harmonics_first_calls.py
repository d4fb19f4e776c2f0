"""What e3nn's spherical harmonics cost at their first eager calls in a process, on the GPU.

A warm ``fastmace md`` profile (stage 116) spent 1.65 s inside e3nn's ``SphericalHarmonics``
forward. Its polynomial is a TorchScript function, which TorchScript optimises again in every
process at its first calls; this times the first calls (forward and the backward forces need)
at the edge count of 13,824 NaCl atoms, through the TorchScript function and through the Python
function it was compiled from, each in a fresh process.

    python3 tools/validation/harmonics_first_calls.py [--edges 540000]
"""

from __future__ import annotations

import argparse
import subprocess
import sys

CHILD = """
import sys, time, torch
from fastmace.models.checkpoint import import_mace
import_mace()
from e3nn import o3
import e3nn.o3._spherical_harmonics as harmonics
if sys.argv[1] == "python":
    harmonics._spherical_harmonics = harmonics._spherical_harmonics._torchdynamo_inline
sh = o3.SphericalHarmonics(o3.Irreps.spherical_harmonics(3), normalize=True,
                           normalization="component").to("cuda")
for call in range(5):
    vectors = torch.randn(int(sys.argv[2]), 3, device="cuda", requires_grad=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    (gradient,) = torch.autograd.grad(sh(vectors).square().sum(), vectors)
    torch.cuda.synchronize()
    print(f"{sys.argv[1]:7s} call {call}: {time.perf_counter() - start:7.4f} s", flush=True)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edges", type=int, default=540_000)
    args = parser.parse_args()
    for kind in ("script", "python"):
        done = subprocess.run([sys.executable, "-c", CHILD, kind, str(args.edges)],
                              capture_output=True, text=True)  # fmt: skip
        print(done.stdout.rstrip() or done.stderr[-400:], flush=True)


if __name__ == "__main__":
    main()
