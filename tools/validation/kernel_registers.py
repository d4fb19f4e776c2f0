"""Registers and spills of the convolution's generated kernels for sm_90, without a GPU.

Each interaction block of a template (converted to cuEquivariance in float64 on the CPU, as
the tests do) has its forward and backward kernels generated (dynamics/conv_codegen.py,
float32), compiled by Triton for sm_90 at the default launch (one warp of 64 channels, two a
thread; two edges per iteration in a first block, one elsewhere; ``--prefetch``: loading the
next edge's indices ahead; ``--channels 32``: one channel a thread, as before 2026-12-07's
third session) under each register cap,
and assembled by Triton's own ptxas with ``-v``; the lines it prints give registers per
thread and spilled bytes:

    python tools/validation/kernel_registers.py [--model mp0-medium] [--caps none,128,96,80,64]
        [--prefetch] [--channels 32]

A one-warp program's registers decide how many of them an SM holds (65,536 registers, at most
32 programs): 246 registers a thread, 8; 128, 16; 64, 32. ptxas fills what a cap allows, so
the cap is the count wherever nothing spills (docs/design/convolution.md).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from fastmace.dynamics import conv_codegen, conv_triton
from fastmace.dynamics.fused_conv import coupling_of
from fastmace.models import backends
from fastmace.models.templates import template

_ARGUMENT_KINDS = {torch.float32: "*fp32", torch.int64: "*i64"}
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


def kernel_arguments(coefficients: torch.Tensor, paths: int, channels: int) -> dict[str, tuple]:
    """Arguments of the right dtypes for each generated kernel (their values are not read)."""
    d1, d2, d3 = coefficients.shape
    atoms, edges = 5, 8
    x, y = torch.zeros(atoms, d1, channels), torch.zeros(edges, d2)
    w, t = torch.zeros(edges, paths, channels), coefficients.float()
    index, grad = torch.zeros(edges, dtype=torch.int64), torch.zeros(atoms, d3, channels)
    lengths, table = torch.zeros(edges), torch.zeros(8, 4, paths * channels)
    spacing = torch.tensor(1.0)
    runs = (index, index, index)  # sender, order, starts
    table_reads = (lengths, table, spacing, index)
    return {
        "_forward": (x, y, w, t, *runs, grad, channels, edges),
        "_backward": (grad, x, y, w, t, *runs, w, y, x, channels, edges),
        "_forward_table": (x, y, *table_reads, t, *runs, grad, channels, edges, 8),
        "_backward_table": (grad, x, y, *table_reads, t, *runs, lengths, y, x, channels, edges, 8),
    }


def registers_and_spills(kernel, arguments: tuple, constexprs: dict, cap: int | None) -> tuple:
    """(registers per thread, spilled bytes) of ``kernel`` for sm_90 within ``cap``."""
    signature = {
        name: _ARGUMENT_KINDS[value.dtype] if isinstance(value, torch.Tensor) else "i64"
        for name, value in zip(kernel.arg_names, arguments, strict=False)
    }
    signature.update(dict.fromkeys(constexprs, "constexpr"))
    options = {"num_warps": 1} if cap is None else {"num_warps": 1, "maxnreg": cap}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    with tempfile.TemporaryDirectory() as directory:
        ptx = Path(directory, "kernel.ptx")
        ptx.write_text(compiled.asm["ptx"])
        # Triton writes sm_90a PTX; ptxas -v says what the cubin uses.
        report = subprocess.run(
            [str(PTXAS), "-arch=sm_90a", "-v", str(ptx), "-o", str(Path(directory, "k.cubin"))],
            capture_output=True, text=True, check=True,
        ).stderr  # fmt: skip
    registers = int(re.search(r"Used (\d+) registers", report).group(1))
    spilled = int(re.search(r"(\d+) bytes spill stores", report).group(1))
    return registers, spilled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mp0-medium")
    parser.add_argument("--caps", default="none,128,96,80,64")
    parser.add_argument("--prefetch", action="store_true", help="load next edges' indices ahead")
    parser.add_argument("--channels", type=int, default=conv_triton.THREADS,
                        help="channels per one-warp program (32: one a thread)")  # fmt: skip
    args = parser.parse_args()
    caps = [None if text == "none" else int(text) for text in args.caps.split(",")]
    model = backends.convert(template(args.model, dtype=torch.float64), "cueq", "cpu")
    print(f"{args.model}: registers/spilled bytes per thread at caps {args.caps}")
    for index, block in enumerate(model.interactions):
        coupling = coupling_of(block)
        key = conv_codegen.register(coupling.coefficients, coupling.path_of)
        module = conv_codegen.kernels(key, literal=True)
        d1, d2, d3 = coupling.coefficients.shape
        print(f"block {index}: D1 {d1}, D2 {d2}, D3 {d3}, {coupling.paths} paths")
        arguments = kernel_arguments(coupling.coefficients, coupling.paths, coupling.channels)
        for name, values in arguments.items():
            step = conv_triton.Launch().edges_per_step(d1)
            constexprs = {"CHANNELS": args.channels, "STEP": step, "PREFETCH": args.prefetch}
            if name.endswith("_table"):
                constexprs["HAS_START"] = False
            found = [registers_and_spills(getattr(module, name), values, constexprs, cap)
                     for cap in caps]  # fmt: skip
            cells = "  ".join(f"{registers:>3}/{spilled:<3}" for registers, spilled in found)
            print(f"  {name:<16} {cells}", flush=True)


if __name__ == "__main__":
    main()
