"""The interaction convolution's Triton kernels, written out for one block's coupling (CUDA).

conv_triton.py says what the convolution computes. Its first kernels held the whole coupling
T (D1, D2, D3) as a register tensor and reduced three-dimensional tiles per edge, mostly over
zeros of T, and the backward needed 215 registers a thread (docs/design/convolution.md).
Here T's nonzero entries are written into the kernels' source as straight-line code, as the
product basis' are (product_codegen.py): a program holds one receiving atom and a tile of
channels, one channel per thread, and per incoming edge

    m_ik = sum_j T[i, j, k] * Y[e, j]           (scalars: the same for every channel)
    u_k  = sum_i m_ik * x[s, i]                 (only the (i, k) that T couples)
    out_k += w[e, path(k)] * u_k

so each thread does the nonzero work of its channel and nothing is reduced in the forward.
The backward (receiver order, as the forward) writes per edge dL/dw (P, C), the sender's
share h_i = sum_k m_ik g_k w_k (D1, C) and dL/dY_j (D2 sums over the tile's channels); the
shares are summed by sender and the skipped atoms' rows zeroed by conv_triton.py's kernels.

In float32 kernels the coefficients are literals (exact float32 numbers); in float64 ones
they are read once per program from ``coefficients`` (D1, D2, D3), as Triton would round a
literal to float32. ``tests/test_fused_conv.py`` runs the kernels in Triton's interpreter
against fused_conv.py's torch formulas and compiles them for sm_90.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass
from types import ModuleType

import torch

from fastmace.dynamics import kernel_sources

_COUPLINGS: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}


@dataclass(frozen=True)
class Entry:
    """``T[i, j, k] = value``, a nonzero coupling coefficient."""

    i: int
    j: int
    k: int
    value: float


def coupling_entries(coefficients: torch.Tensor) -> list[Entry]:
    """The nonzero entries of ``coefficients`` (D1, D2, D3), in (i, j, k) order."""
    found = torch.nonzero(coefficients).tolist()
    return [Entry(i, j, k, float(coefficients[i, j, k])) for i, j, k in found]


def register(coefficients: torch.Tensor, path_of: torch.Tensor) -> str:
    """A key for this coupling, by which :func:`kernels` finds it (the custom op passes it)."""
    coefficients = coefficients.detach().double().cpu().contiguous()
    path_of = path_of.detach().cpu().to(torch.int64).contiguous()
    digest = hashlib.sha256()
    for tensor in (coefficients, path_of):
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.numpy().tobytes())
    key = digest.hexdigest()[:24]
    _COUPLINGS[key] = (coefficients, path_of)
    return key


def coupling_of_key(key: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The coefficients (float64) and path of each output component registered under ``key``."""
    return _COUPLINGS[key]


def module_name(key: str, literal: bool) -> str:
    return f"conv_{key}_{'literal' if literal else 'loaded'}"


def kernels(key: str, literal: bool = False) -> ModuleType:
    """The module holding ``_forward`` and ``_backward`` for the coupling under ``key``
    (``literal``: float32 kernels), generated and imported once per process."""
    name = module_name(key, literal)
    return kernel_sources.load(name, lambda: kernel_source(*_COUPLINGS[key], literal=literal))


class _Writer:
    """The pieces both kernels share, as lines of source."""

    def __init__(self, coefficients: torch.Tensor, path_of: torch.Tensor, literal: bool) -> None:
        self.d1, self.d2, self.d3 = coefficients.shape
        self.path_of = [int(p) for p in path_of.tolist()]
        self.paths = max(self.path_of) + 1
        self.entries = coupling_entries(coefficients)
        self.literal = literal
        self.by_pair: dict[tuple[int, int], list[Entry]] = defaultdict(list)
        for entry in self.entries:
            self.by_pair[entry.i, entry.k].append(entry)
        self.pairs = sorted(self.by_pair)
        self.inputs = sorted({i for i, _ in self.pairs})
        self.outputs = sorted({k for _, k in self.pairs})
        self.harmonics = sorted({entry.j for entry in self.entries})

    def coefficient(self, entry: Entry) -> str:
        if self.literal:
            return kernel_sources.float32_literal(entry.value)
        return f"t{entry.i}_{entry.j}_{entry.k}"

    def prologue(self) -> list[str]:
        lines = [
            "    atom = tl.program_id(0).to(tl.int64)",
            "    c = tl.program_id(1) * CHANNELS + tl.arange(0, CHANNELS)",
            "    ok = c < channels",
        ]
        if not self.literal:  # read once per program, not once per edge
            d2, d3 = self.d2, self.d3
            lines += [
                f"    t{e.i}_{e.j}_{e.k} = tl.load(coefficients + {(e.i * d2 + e.j) * d3 + e.k})"
                for e in self.entries
            ]
        return lines

    def used_paths(self) -> list[int]:
        return sorted({self.path_of[k] for k in self.outputs})

    @staticmethod
    def indices(table: bool, at: str, mask: str, suffix: str, pad: str) -> list[str]:
        """Loads of the edges at positions ``at`` (lanes in ``mask``) of the atom's run: each
        one's slot, its sender and (from a table) its length, named with ``suffix``."""
        found = [
            f"{pad}edge{suffix} = tl.load(order + {at}, mask={mask}, other=0).to(tl.int64)",
            f"{pad}source{suffix} = tl.load(sender + edge{suffix}, mask={mask}, "
            "other=0).to(tl.int64)",
        ]
        if table:
            found.append(
                f"{pad}length{suffix} = tl.load(lengths + edge{suffix} % weight_rows, "
                f"mask={mask}, other=0.0)"
            )
        return found

    def edge(self, table: bool, slopes: bool = False) -> list[str]:
        """The loop over the atom's incoming edges, STEP at a time, and per step its inputs
        and the m_ik: per-edge values are (STEP,) vectors, per-edge-and-channel ones (STEP,
        CHANNELS) tiles, and lanes past the atom's last edge are masked (their loads give
        zeros). ``table``: the weights (and with ``slopes`` their h dw/dr) interpolated from
        the radial table at the edge's length, as radial_table._evaluate does. With the
        kernel's ``PREFETCH``, each step's slots, senders and lengths were loaded by the step
        before (values carried by the loop), so its own loads wait on one level of memory
        instead of three (slot, then sender and length, then features and table rows)."""
        indent = " " * 12
        carried = ["edge", "source", *(["length"] if table else [])]
        lines = [
            "    lane = tl.arange(0, STEP)",
            "    begin = tl.load(starts + atom)",
            "    end = tl.load(starts + atom + 1)",
            "    if PREFETCH:  # the first step's indices before the loop",
            "        ahead = begin + lane",
            *self.indices(table, "ahead", "ahead < end", "_ahead", " " * 8),
            "    for first in range(begin, end, STEP):",
            "        pos = first + lane",
            "        live = pos < end",
            "        both = live[:, None] & ok[None, :]",
            "        if PREFETCH:  # this step's came with the last; the next step's load now",
            *[f"            {name} = {name}_ahead" for name in carried],
            "            ahead = pos + STEP",
            *self.indices(table, "ahead", "ahead < end", "_ahead", indent),
            "        else:",
            *self.indices(table, "pos", "live", "", indent),
            *[
                f"        y{j} = tl.load(harmonics + edge * {self.d2} + {j}, mask=live, other=0.0)"
                for j in self.harmonics
            ],
            *[
                f"        x{i} = tl.load(features + (source[:, None] * {self.d1} + {i}) * channels "
                "+ c[None, :], mask=both, other=0.0)"
                for i in self.inputs
            ],
        ]
        if not table:
            lines.append(f"        row = (edge % weight_rows) * {self.paths}")
            lines += [
                f"        w{p} = tl.load(weights + (row[:, None] + {p}) * channels + c[None, :], "
                "mask=both, other=0.0)"
                for p in self.used_paths()
            ]
        else:
            width = f"{self.paths} * channels"
            lines += [
                "        x = length * inverse_spacing",
                "        inside = (x < intervals)[:, None]",
                "        k = tl.minimum(tl.maximum(tl.floor(x), 0.0), last)",
                "        t = tl.minimum(tl.maximum(x - k, 0.0), 1.0)[:, None]",
                "        interval = k.to(tl.int64)",
                "        if HAS_START:  # the table of the edge's pair of elements (pair_table.py)",
                "            interval += tl.load(start + edge % weight_rows, mask=live, other=0)",
                f"        cubic = table + interval[:, None] * 4 * {width} + c[None, :]",
            ]
            for p in self.used_paths():
                lines += [
                    f"        a{q}_{p} = tl.load(cubic + {q} * {width} + {p} * channels, "
                    "mask=both, other=0.0)"
                    for q in range(4)
                ]
                lines.append(
                    f"        w{p} = tl.where(inside, a0_{p} + t * (a1_{p} + t * (a2_{p} + t * "
                    f"a3_{p})), 0.0)"
                )
                if slopes:
                    lines.append(
                        f"        s{p} = tl.where(inside, a1_{p} + t * (2.0 * a2_{p} + 3.0 * t * "
                        f"a3_{p}), 0.0)"
                    )
        for i, k in self.pairs:
            parts = [f"{self.coefficient(e)} * y{e.j}" for e in self.by_pair[i, k]]
            value = kernel_sources.joined_sum(parts, indent)
            lines.append(f"        m{i}_{k} = ({value})[:, None]")
        return lines

    def u(self, k: int) -> str:
        parts = [f"m{i}_{k} * x{i}" for i in self.inputs if (i, k) in self.by_pair]
        return kernel_sources.joined_sum(parts, " " * 12)


# What each kernel reads besides the coupling's inputs: the weights, or the radial table.
_WEIGHTS = "weights"
_TABLE = "lengths, table, inverse_spacing, start"
_TABLE_PROLOGUE = [
    "    inverse_spacing = tl.load(inverse_spacing)",
    "    last = (intervals - 1).to(inverse_spacing.dtype)",
]


def kernel_source(coefficients: torch.Tensor, path_of: torch.Tensor, literal: bool = False) -> str:
    """The Triton source of the kernels for this coupling: ``_forward`` and ``_backward``
    read the radial weights (rows, P, C); ``_forward_table`` and ``_backward_table`` read
    each edge's length instead and interpolate the weights from the block's radial table
    (N, 4, P*C), so that the per-edge weights and their gradient never reach memory. With
    ``HAS_START`` the table holds one table of ``intervals`` rows per pair of elements, and
    row e of ``start`` says where edge e's begins."""
    write = _Writer(coefficients, path_of, literal)
    head = ["import triton", "import triton.language as tl", "", ""]
    parts = [
        *_forward(write, table=False), "", "",
        *_backward(write, table=False), "", "",
        *_forward(write, table=True), "", "",
        *_backward(write, table=True), "",
    ]  # fmt: skip
    return "\n".join([*head, *parts])


def _zeros(shape: str, like: str) -> str:
    """Source for a tensor of zeros of ``shape`` (e.g. "STEP, CHANNELS") in ``like``'s dtype."""
    return f"tl.zeros([{shape}], dtype={like}.dtype.element_ty)"


def _forward(write: _Writer, table: bool) -> list[str]:
    d3 = write.d3
    name, reads = ("_forward_table", _TABLE) if table else ("_forward", _WEIGHTS)
    extra = ", intervals, HAS_START: tl.constexpr" if table else ""
    return [
        "@triton.jit",
        f"def {name}(features, harmonics, {reads}, coefficients, sender, order, starts, out,",
        f"        channels, weight_rows{extra}, CHANNELS: tl.constexpr, STEP: tl.constexpr,",
        "        PREFETCH: tl.constexpr):",
        *write.prologue(),
        *(_TABLE_PROLOGUE if table else []),
        *[f"    o{k} = {_zeros('CHANNELS', 'out')}" for k in write.outputs],
        *write.edge(table),
        *[
            f"        o{k} += tl.sum(w{write.path_of[k]} * {write.u(k)}, axis=0)"
            for k in write.outputs
        ],
        *[
            f"    tl.store(out + (atom * {d3} + {k}) * channels + c, "
            f"{f'o{k}' if k in write.outputs else _zeros('CHANNELS', 'out')}, mask=ok)"
            for k in range(d3)
        ],
    ]


def _backward(write: _Writer, table: bool) -> list[str]:
    """Receiver order, per edge: dL/dw (or, from the table, dL/dr), the sender's share and
    dL/dY (partial sums over the program's channels)."""
    d1, d2, d3, paths = write.d1, write.d2, write.d3, write.paths
    name, reads = ("_backward_table", _TABLE) if table else ("_backward", _WEIGHTS)
    gradient = "grad_lengths" if table else "grad_weights"
    extra = ", intervals, HAS_START: tl.constexpr" if table else ""
    indent = " " * 12
    lines = [
        "@triton.jit",
        f"def {name}(grad, features, harmonics, {reads}, coefficients, sender, order, starts,",
        f"        {gradient}, grad_harmonics, shares, channels, weight_rows{extra},",
        "        CHANNELS: tl.constexpr, STEP: tl.constexpr, PREFETCH: tl.constexpr):",
        *write.prologue(),
        *(_TABLE_PROLOGUE if table else []),
        "    tile = tl.program_id(1)",
        "    tiles = tl.num_programs(1)",
        *[
            f"    g{k} = tl.load(grad + (atom * {d3} + {k}) * channels + c, mask=ok, "
            "other=0.0)[None, :]"
            for k in write.outputs
        ],
        *write.edge(table, slopes=True),
        *[f"        u{k} = {write.u(k)}" for k in write.outputs],
    ]
    # dL/dw: each path's components of g * u. From a table they only meet its slopes:
    # dL/dr = sum_{p,c} dL/dw[p, c] s[p, c] / h, one number per edge and channel tile.
    slope_terms = []
    for p in range(paths):
        terms = [f"g{k} * u{k}" for k in write.outputs if write.path_of[k] == p]
        value = kernel_sources.joined_sum(terms, indent)
        if table:
            if value:
                slope_terms.append(f"({value}) * s{p}")
            continue
        lines.append(
            f"        tl.store(grad_weights + (edge[:, None] * {paths} + {p}) * channels "
            f"+ c[None, :], {value or _zeros('STEP, CHANNELS', 'grad')}, mask=both)"
        )
    if table:
        total = kernel_sources.joined_sum(slope_terms, indent)
        value = f"tl.sum({total}, axis=1) * inverse_spacing" if total else _zeros("STEP", "grad")
        lines.append(f"        tl.store(grad_lengths + edge * tiles + tile, {value}, mask=live)")
    lines += [f"        gw{k} = g{k} * w{write.path_of[k]}" for k in write.outputs]
    for i in range(d1):  # the sender's share: h_i = sum_k m_ik g_k w_k
        terms = [f"m{i}_{k} * gw{k}" for k in write.outputs if (i, k) in write.by_pair]
        value = kernel_sources.joined_sum(terms, indent) or _zeros("STEP, CHANNELS", "grad")
        lines.append(
            f"        tl.store(shares + (edge[:, None] * {d1} + {i}) * channels + c[None, :], "
            f"{value}, mask=both)"
        )
    lines += [f"        p{i}_{k} = x{i} * gw{k}" for i, k in write.pairs]
    by_harmonic: dict[int, list[str]] = defaultdict(list)
    for entry in write.entries:  # dL/dY_j = sum_{i,k} T[i, j, k] sum_c x_i g_k w_k
        by_harmonic[entry.j].append(f"{write.coefficient(entry)} * p{entry.i}_{entry.k}")
    for j in range(d2):
        value = (
            f"tl.sum({kernel_sources.joined_sum(by_harmonic[j], indent)}, axis=1)"
            if by_harmonic[j]
            else _zeros("STEP", "grad")
        )
        lines.append(
            f"        tl.store(grad_harmonics + (edge * tiles + tile) * {d2} + {j}, {value}, "
            "mask=live)"
        )
    return lines
