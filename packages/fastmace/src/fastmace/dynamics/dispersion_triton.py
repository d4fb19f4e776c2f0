"""D3(BJ)'s pair sums as three fused Triton kernels, one program per atom.

:meth:`D3BJ._evaluate` (dispersion.py) runs each step of D3 as a separate pass over the
pair list in torch: about 32 million pairs at 13,824 atoms, each pass reading and writing
float64 arrays of that length, 37 ms per evaluation on the H200. Here each atom's program walks
its own run of the sender-sorted list once per kernel and keeps its sums in registers:

1. ``_coordination``: the atom's coordination number;
2. ``_energy``: its energy (half of each pair's) and dE/dCN (needs every CN: a second kernel);
3. ``_forces``: its force and its 3x3 share of the strain derivative (needs every dE/dCN).

Between them, per-atom work in torch (N rows, not E): the Gaussian weights of the reference
coordination numbers and their rows of C6 towards each species. The formulas are those of the
torch version, term for term; ``tests/test_dispersion_triton.py`` checks the two against each
other (in Triton's interpreter on the CPU). Units: bohr and hartree inside, as there.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 128  # edges an atom's program handles at once
# The kernels' real-valued constants travel in one float64 tensor, in this order: Triton
# passes a Python float as a float32 scalar, and a cutoff rounded to float32 moves pairs
# across it (5e-5 relative in the energy at 13,824 atoms on the H200).
CONSTANTS = ("bohr", "hartree", "steepness", "cutoff2", "cn_cutoff2", "a1", "a2", "s6", "s8")
REFERENCE_LANES = 8  # five reference coordination numbers per element, padded to a power of two


@triton.jit
def _pair(positions, cell, unit_shifts, receiver, edge, valid, x, y, z, row, bohr):
    """Receiver index, the edge vector (bohr) and its squared length for a block of edges."""
    j = tl.load(receiver + edge, mask=valid, other=0)
    sx = tl.load(unit_shifts + 3 * edge, mask=valid, other=0.0)
    sy = tl.load(unit_shifts + 3 * edge + 1, mask=valid, other=0.0)
    sz = tl.load(unit_shifts + 3 * edge + 2, mask=valid, other=0.0)
    # shift = unit_shifts @ cell of the sender's system (rows are lattice vectors).
    dx = sx * tl.load(cell + row) + sy * tl.load(cell + row + 3) + sz * tl.load(cell + row + 6)
    dy = sx * tl.load(cell + row + 1) + sy * tl.load(cell + row + 4) + sz * tl.load(cell + row + 7)
    dz = sx * tl.load(cell + row + 2) + sy * tl.load(cell + row + 5) + sz * tl.load(cell + row + 8)
    vx = (tl.load(positions + 3 * j, mask=valid, other=0.0) - x + dx) / bohr
    vy = (tl.load(positions + 3 * j + 1, mask=valid, other=0.0) - y + dy) / bohr
    vz = (tl.load(positions + 3 * j + 2, mask=valid, other=0.0) - z + dz) / bohr
    return j, vx, vy, vz, vx * vx + vy * vy + vz * vz


@triton.jit
def _atom(positions, system, bounds, atom):
    """The atom's run of edges, its position and the offset of its system's cell."""
    begin = tl.load(bounds + atom)
    end = tl.load(bounds + atom + 1)
    x = tl.load(positions + 3 * atom)
    y = tl.load(positions + 3 * atom + 1)
    z = tl.load(positions + 3 * atom + 2)
    return begin, end, x, y, z, 9 * tl.load(system + atom)


@triton.jit
def _coordination(
    positions, cell, system, numbers, unit_shifts, receiver, bounds, rcov, cn, constants,
    BLOCK: tl.constexpr,
):  # fmt: skip
    atom = tl.program_id(0)
    bohr, steepness = tl.load(constants), tl.load(constants + 2)
    cn_cutoff2 = tl.load(constants + 4)
    begin, end, x, y, z, row = _atom(positions, system, bounds, atom)
    rcov_i = tl.load(rcov + tl.load(numbers + atom))
    total = tl.zeros([BLOCK], dtype=tl.float64)
    for start in range(begin, end, BLOCK):
        edge = start + tl.arange(0, BLOCK)
        valid = edge < end
        j, _, _, _, r2 = _pair(positions, cell, unit_shifts, receiver, edge, valid,
                               x, y, z, row, bohr)  # fmt: skip
        counted = valid & (r2 > 0) & (r2 <= cn_cutoff2)
        r = tl.sqrt(tl.where(counted, r2, 1.0))
        covalent = rcov_i + tl.load(rcov + tl.load(numbers + j, mask=valid, other=0))
        count = 1.0 / (1.0 + tl.exp(-steepness * (covalent / r - 1.0)))
        total += tl.where(counted, count, 0.0)
    tl.store(cn + atom, tl.sum(total, axis=0))


@triton.jit
def _c6_of(towards, weights, numbers, slot, j, valid, atom_row, species, LANES: tl.constexpr):
    """sum_b towards[atom, slot(Z_j), b] * weights[j, b] for a block of receivers j."""
    lane = tl.arange(0, LANES)[None, :]
    use = valid[:, None] & (lane < 5)
    kind = tl.load(slot + tl.load(numbers + j, mask=valid, other=0), mask=valid, other=0)
    rows = tl.load(towards + (atom_row * species + kind)[:, None] * 5 + lane, mask=use, other=0.0)
    partner = tl.load(weights + j[:, None] * 5 + lane, mask=use, other=0.0)
    return tl.sum(rows * partner, axis=1)


@triton.jit
def _damping(r2, ratio, a1, a2, s6, s8):
    """BJ-damped 1/r^6 and 1/r^8 terms (per C6) and their derivative in r."""
    radius2 = a1 * tl.sqrt(ratio) + a2
    radius2 = radius2 * radius2
    r6 = r2 * r2 * r2
    six = r6 + radius2 * radius2 * radius2
    eight = r6 * r2 + radius2 * radius2 * radius2 * radius2
    damped = s6 / six + s8 * ratio / eight
    slope = 6.0 * s6 * r6 / (six * six) + 8.0 * s8 * ratio * r6 * r2 / (eight * eight)
    return damped, -slope / tl.sqrt(r2)


@triton.jit
def _energy(
    positions, cell, system, numbers, unit_shifts, receiver, bounds, r2r4, slot,
    towards, towards_slope, weights, atom_energy, cn_slope, constants, species,
    BLOCK: tl.constexpr, LANES: tl.constexpr,
):  # fmt: skip
    atom = tl.program_id(0)
    bohr, hartree, cutoff2 = tl.load(constants), tl.load(constants + 1), tl.load(constants + 3)
    a1, a2 = tl.load(constants + 5), tl.load(constants + 6)
    s6, s8 = tl.load(constants + 7), tl.load(constants + 8)
    begin, end, x, y, z, row = _atom(positions, system, bounds, atom)
    r2r4_i = tl.load(r2r4 + tl.load(numbers + atom))
    energy = tl.zeros([BLOCK], dtype=tl.float64)
    slope = tl.zeros([BLOCK], dtype=tl.float64)
    for start in range(begin, end, BLOCK):
        edge = start + tl.arange(0, BLOCK)
        valid = edge < end
        j, _, _, _, r2 = _pair(positions, cell, unit_shifts, receiver, edge, valid,
                               x, y, z, row, bohr)  # fmt: skip
        pair = valid & (r2 > 0) & (r2 < cutoff2)
        r2 = tl.where(pair, r2, 1.0)
        ratio = 3.0 * r2r4_i * tl.load(r2r4 + tl.load(numbers + j, mask=valid, other=0))
        damped, _ = _damping(r2, ratio, a1, a2, s6, s8)
        damped = tl.where(pair, damped, 0.0)
        c6 = _c6_of(towards, weights, numbers, slot, j, pair, atom, species, LANES)
        c6_slope = _c6_of(towards_slope, weights, numbers, slot, j, pair, atom, species, LANES)
        energy += -0.5 * hartree * c6 * damped
        slope += -hartree * damped * c6_slope
    tl.store(atom_energy + atom, tl.sum(energy, axis=0))
    tl.store(cn_slope + atom, tl.sum(slope, axis=0))


@triton.jit
def _forces(
    positions, cell, system, numbers, unit_shifts, receiver, bounds, rcov, r2r4, slot,
    towards, weights, cn_slope, forces, strain, constants, species,
    BLOCK: tl.constexpr, LANES: tl.constexpr,
):  # fmt: skip
    atom = tl.program_id(0)
    bohr, hartree, steepness = tl.load(constants), tl.load(constants + 1), tl.load(constants + 2)
    cutoff2, cn_cutoff2 = tl.load(constants + 3), tl.load(constants + 4)
    a1, a2 = tl.load(constants + 5), tl.load(constants + 6)
    s6, s8 = tl.load(constants + 7), tl.load(constants + 8)
    begin, end, x, y, z, row = _atom(positions, system, bounds, atom)
    z_i = tl.load(numbers + atom)
    rcov_i = tl.load(rcov + z_i)
    r2r4_i = tl.load(r2r4 + z_i)
    slope_i = tl.load(cn_slope + atom)
    fx = tl.zeros([BLOCK], dtype=tl.float64)
    fy = tl.zeros([BLOCK], dtype=tl.float64)
    fz = tl.zeros([BLOCK], dtype=tl.float64)
    sxx = tl.zeros([BLOCK], dtype=tl.float64)
    sxy = tl.zeros([BLOCK], dtype=tl.float64)
    sxz = tl.zeros([BLOCK], dtype=tl.float64)
    syy = tl.zeros([BLOCK], dtype=tl.float64)
    syz = tl.zeros([BLOCK], dtype=tl.float64)
    szz = tl.zeros([BLOCK], dtype=tl.float64)
    for start in range(begin, end, BLOCK):
        edge = start + tl.arange(0, BLOCK)
        valid = edge < end
        j, vx, vy, vz, r2 = _pair(positions, cell, unit_shifts, receiver, edge, valid,
                                  x, y, z, row, bohr)  # fmt: skip
        real = valid & (r2 > 0)
        pair = real & (r2 < cutoff2)
        counted = real & (r2 <= cn_cutoff2)
        r2 = tl.where(real, r2, 1.0)
        r = tl.sqrt(r2)
        z_j = tl.load(numbers + j, mask=valid, other=0)
        covalent = rcov_i + tl.load(rcov + z_j, mask=valid, other=0.0)
        count = 1.0 / (1.0 + tl.exp(-steepness * (covalent / r - 1.0)))
        count_slope = tl.where(counted, -steepness * count * (1.0 - count) * covalent / r2, 0.0)
        ratio = 3.0 * r2r4_i * tl.load(r2r4 + z_j, mask=valid, other=0.0)
        _, damped_slope = _damping(r2, ratio, a1, a2, s6, s8)
        damped_slope = tl.where(pair, damped_slope, 0.0)
        c6 = _c6_of(towards, weights, numbers, slot, j, pair, atom, species, LANES)
        slope_j = tl.load(cn_slope + j, mask=valid, other=0.0)
        pair_slope = -hartree * c6 * damped_slope + (slope_i + slope_j) * count_slope
        along = pair_slope / r
        fx += along * vx
        fy += along * vy
        fz += along * vz
        half = 0.5 * along
        sxx += half * vx * vx
        sxy += half * vx * vy
        sxz += half * vx * vz
        syy += half * vy * vy
        syz += half * vy * vz
        szz += half * vz * vz
    tl.store(forces + 3 * atom, tl.sum(fx, axis=0) / bohr)
    tl.store(forces + 3 * atom + 1, tl.sum(fy, axis=0) / bohr)
    tl.store(forces + 3 * atom + 2, tl.sum(fz, axis=0) / bohr)
    xy = tl.sum(sxy, axis=0)
    xz = tl.sum(sxz, axis=0)
    yz = tl.sum(syz, axis=0)
    tl.store(strain + 9 * atom, tl.sum(sxx, axis=0))
    tl.store(strain + 9 * atom + 1, xy)
    tl.store(strain + 9 * atom + 2, xz)
    tl.store(strain + 9 * atom + 3, xy)
    tl.store(strain + 9 * atom + 4, tl.sum(syy, axis=0))
    tl.store(strain + 9 * atom + 5, yz)
    tl.store(strain + 9 * atom + 6, xz)
    tl.store(strain + 9 * atom + 7, yz)
    tl.store(strain + 9 * atom + 8, tl.sum(szz, axis=0))


def constants(d3, units, device: torch.device) -> torch.Tensor:
    """The kernels' float64 constants (:data:`CONSTANTS`) on ``device``: made once per D3BJ
    and device, outside any graph capture (the run's kernel check makes them first)."""
    kept = getattr(d3, "_fused_constants", None)
    if kept is None or kept.device != device:
        bohr, hartree, steepness = units
        p = d3.parameters
        values = (bohr, hartree, steepness, (d3.cutoff / bohr) ** 2, (d3.cn_cutoff / bohr) ** 2,
                  p.a1, p.a2, p.s6, p.s8)  # fmt: skip
        kept = torch.tensor(values, dtype=torch.float64, device=device)
        d3._fused_constants = kept
    return kept


def coordination_numbers(d3, state, receiver, unit_shifts, bounds, units) -> torch.Tensor:
    """(N,) coordination numbers (the first kernel). ``units``: bohr (Å), hartree (eV) and
    the counting function's steepness, as dispersion.py has them."""
    device = state.positions.device
    cn = torch.empty(state.n_atoms, dtype=torch.float64, device=device)
    _coordination[(state.n_atoms,)](
        state.positions, state.cell, state.system, state.atomic_numbers, unit_shifts, receiver,
        bounds, d3.rcov, cn, constants(d3, units, device), BLOCK=BLOCK,
    )  # fmt: skip
    return cn


def energies_and_cn_slopes(
    d3, state, receiver, unit_shifts, bounds, towards, towards_slope, weights, units
) -> tuple[torch.Tensor, torch.Tensor]:
    """(N,) atom energies (eV) and dE/dCN (the second kernel)."""
    device = state.positions.device
    atom_energy = torch.empty(state.n_atoms, dtype=torch.float64, device=device)
    cn_slope = torch.empty(state.n_atoms, dtype=torch.float64, device=device)
    _energy[(state.n_atoms,)](
        state.positions, state.cell, state.system, state.atomic_numbers, unit_shifts, receiver,
        bounds, d3.r2r4, d3.slot, towards, towards_slope, weights, atom_energy, cn_slope,
        constants(d3, units, device), towards.shape[1], BLOCK=BLOCK, LANES=REFERENCE_LANES,
    )  # fmt: skip
    return atom_energy, cn_slope


def forces_and_strain(
    d3, state, receiver, unit_shifts, bounds, towards, weights, cn_slope, units
) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, 3) forces (eV/Å) and (N, 9) each atom's share of dE/dε (eV; the third kernel)."""
    device = state.positions.device
    forces = torch.empty(state.n_atoms, 3, dtype=torch.float64, device=device)
    strain = torch.empty(state.n_atoms, 9, dtype=torch.float64, device=device)
    _forces[(state.n_atoms,)](
        state.positions, state.cell, state.system, state.atomic_numbers, unit_shifts, receiver,
        bounds, d3.rcov, d3.r2r4, d3.slot, towards, weights, cn_slope, forces, strain,
        constants(d3, units, device), towards.shape[1], BLOCK=BLOCK, LANES=REFERENCE_LANES,
    )  # fmt: skip
    return forces, strain
