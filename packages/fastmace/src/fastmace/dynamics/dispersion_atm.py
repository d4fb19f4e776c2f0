"""The three-body (Axilrod-Teller-Muto) term of D3 on the two-body term's sender-sorted list.

The conventions are torch-dftd's (``abc=True``; checked against it in
tests/test_dispersion_atm.py): triples whose three sides are all within the
coordination-number cutoff, C9 = sqrt(C6_ij C6_ik C6_jk) from the same CN-dependent C6 as the
two-body term, zero damping 1 / (1 + 6 (4/3 (R0_ij R0_ik R0_jk / r_ij r_ik r_jk)^(1/3))^(alp+2))
with the pairwise R0 of D3's table, s9 = 1, and the energy (3 cos a cos b cos c + 1) C9 damp /
(r_ij r_ik r_jk)^3, positive (repulsive for most triangles).

Triples are enumerated per centre atom as the unordered pairs of its own edges, in a dense
(atoms, slots) table of each atom's run of edges: each triangle is then met once from each of
its vertices (periodic images included), so its energy is shared a third to each, and every
derivative a vertex needs (its force, its coordination-number slope) is found among its own
triples: per-atom sums, no atomics. ``slots`` bounds the run length; it is set on the host when
the list is built (:func:`slots_for`), and an atom with a longer run sets the list's overflow
flag (the caller, D3BJ, does; the engine then regrows the list and sizes the slots again).
Design, checks and cost: docs/validation/dispersion.md, "Three-body (ATM) term".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Zero damping of the three-body term (D3's): sr9 = 4/3, exponent alp + 2 (16 for alp = 14).
RADIUS_SCALE = 4.0 / 3.0
# Triples evaluated per chunk (elements of each (atoms, slots, offsets) temporary): bounds
# the memory of one evaluation whatever the system, at fixed shapes.
TRIPLES_PER_CHUNK = 1 << 20
# Slots per atom: the longest run of the list when it is built, times this, plus 8.
SLOTS_HEADROOM = 1.25


def slots_for(edges_sender: torch.Tensor, mask: torch.Tensor) -> int:
    """Slots per atom for ``edges``: the longest run of one sender, with headroom; host-side
    (reads the count back), to be called when the list is built, never inside a capture."""
    senders = edges_sender[mask]
    longest = int(torch.bincount(senders).max()) if senders.numel() else 0
    return int(longest * SLOTS_HEADROOM) + 8


@dataclass
class SlotTable:
    """Per atom, its run of edges laid out in ``slots`` columns (index ``capacity``: empty)."""

    edge: torch.Tensor  # (N, S) edge index, or the edge capacity for an empty slot
    length: torch.Tensor  # (N,) edges in the atom's run
    fits: torch.Tensor  # () every run fits in the slots


def slot_table(
    bounds: torch.Tensor, sender: torch.Tensor, mask: torch.Tensor, slots: int
) -> SlotTable:
    """Each atom's run of the sender-sorted edges as one row of ``slots`` columns."""
    n_atoms, capacity = bounds.shape[0] - 1, sender.shape[0]
    edge = torch.arange(capacity, device=sender.device)
    column = edge - bounds.index_select(0, sender)
    placed = mask & (column < slots)
    dump = n_atoms * slots  # every edge that is not placed lands in one extra cell
    cell = torch.where(placed, sender * slots + column, dump)
    table = torch.full((dump + 1,), capacity, dtype=edge.dtype, device=edge.device)
    table = table.scatter(0, cell, torch.where(placed, edge, capacity))
    length = bounds[1:] - bounds[:-1]
    return SlotTable(table[:dump].view(n_atoms, slots), length, (length <= slots).all())


@dataclass
class PairC6:
    """The C6 (hartree bohr^6) and D3's R0 (bohr) of any two atoms a, b of the batch from
    per-atom rows towards each of the run's species: a's reference C6 weighted by its
    Gaussian weights (dotted with b's weights: D3's weighted mean, factored as in the
    two-body term), and R0 of a's element with each species."""

    towards: torch.Tensor  # (N * k, 5): w_a . C6ref towards each of the run's k species
    r0: torch.Tensor  # (N * k,)
    weights: torch.Tensor  # (N, 5)
    slot: torch.Tensor  # (95,) index of an element among the run's species
    numbers: torch.Tensor  # (N,) atomic numbers

    def __call__(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """C6 and R0 of every pair (a, b), a and b atom indices of one shape."""
        species = self.r0.shape[0] // self.numbers.shape[0]
        rows = (a * species + self.slot[self.numbers[b]]).reshape(-1)
        partner = self.weights.index_select(0, b.reshape(-1))
        c6 = (self.towards.index_select(0, rows) * partner).sum(dim=-1)
        return c6.view(a.shape), self.r0.index_select(0, rows).view(a.shape)


@dataclass
class EdgeTerms:
    """What the triples read of each edge (sender = the triple's centre), in D3's units."""

    vectors: torch.Tensor  # (E, 3) bohr
    inside: torch.Tensor  # (E,) a real pair within the three-body cutoff
    receiver: torch.Tensor  # (E,)
    c6: torch.Tensor  # (E,) hartree bohr^6
    c6_slope: torch.Tensor  # (E,) dC6/dCN of the sender
    r0: torch.Tensor  # (E,) D3's pairwise R0, bohr


@dataclass
class AtomTerms:
    """The three-body term's share per atom: energy (hartree), dE/dCN (hartree), force
    (hartree/bohr) and dE/dstrain (hartree, flattened 3 x 3)."""

    energy: torch.Tensor
    cn_slope: torch.Tensor
    forces: torch.Tensor
    strain: torch.Tensor


def three_body(
    table: SlotTable,
    edge: EdgeTerms,
    pair: PairC6,
    cutoff2: float,
    exponent: float,
) -> AtomTerms:
    """The ATM energy per atom and its derivatives, in chunks of offsets between slots.

    Args:
        table: each atom's run of edges (:func:`slot_table`).
        edge: per-edge quantities; index ``capacity`` (an appended row) is an empty slot.
        pair: the C6 and R0 of two atoms (for the triple's third side, j-k).
        cutoff2: squared three-body cutoff, bohr^2.
        exponent: the damping's exponent (alp + 2).
    """
    n_atoms, slots = table.edge.shape
    device = table.edge.device
    padded = {name: _append_empty(getattr(edge, name)) for name in vars(edge)}
    flat = table.edge.reshape(-1)
    row = {name: value.index_select(0, flat).view(n_atoms, slots, *value.shape[1:])
           for name, value in padded.items()}  # fmt: skip
    length = table.length.clamp(max=slots)  # a longer run has set the overflow flag
    modulus = length.clamp(min=1)
    first = torch.arange(slots, device=device)
    out = [torch.zeros(n_atoms, dtype=edge.c6.dtype, device=device) for _ in range(2)]
    out += [torch.zeros(n_atoms, k, dtype=edge.c6.dtype, device=device) for k in (3, 9)]
    width = max(1, TRIPLES_PER_CHUNK // max(1, n_atoms * slots))
    for start in range(1, slots // 2 + 1, width):
        offsets = torch.arange(start, min(start + width, slots // 2 + 1), device=device)
        partner = (first[None, :, None] + offsets[None, None, :]) % modulus[:, None, None]
        # Each unordered pair of a run is one offset apart going round it; a run of even
        # length meets the pairs half-way round from both ends: half weight each.
        weight = torch.where(2 * offsets[None, None, :] == length[:, None, None], 0.5, 1.0)
        live = (first[None, :, None] < length[:, None, None]) & (
            offsets[None, None, :] <= length[:, None, None] // 2
        )
        chunk = _triples(row, partner, weight * live, pair, cutoff2, exponent)
        out = [total + part for total, part in zip(out, chunk, strict=True)]
    return AtomTerms(*out)


def _append_empty(values: torch.Tensor) -> torch.Tensor:
    """``values`` with one more row for empty slots: harmless numbers, never counted."""
    fill = (
        torch.ones_like(values[:1])
        if values.dtype.is_floating_point
        else torch.zeros_like(values[:1])
    )
    return torch.cat([values, fill])


def _take(values: torch.Tensor, partner: torch.Tensor) -> torch.Tensor:
    """(N, S, ...) per-slot values at the partner slots (N, S, B)."""
    n_atoms, slots, width = partner.shape
    index = partner.reshape(n_atoms, slots * width)
    if values.dim() == 2:
        return values.gather(1, index).view(n_atoms, slots, width)
    index = index[:, :, None].expand(-1, -1, values.shape[-1])
    return values.gather(1, index).view(n_atoms, slots, width, values.shape[-1])


def _triples(
    row: dict[str, torch.Tensor],
    partner: torch.Tensor,
    weight: torch.Tensor,
    pair: PairC6,
    cutoff2: float,
    exponent: float,
) -> list[torch.Tensor]:
    """One chunk of triples (centre, slot j, slot k = partner): per-centre sums of the
    energy (a third of each triple's), dE/dCN of the centre, force on it and dE/dstrain.

    Slot j's quantities stay (N, S, 1) and broadcast; only slot k's are gathered."""
    n_atoms = partner.shape[0]
    v1, v2 = row["vectors"], _take(row["vectors"], partner)
    v3 = v2 - v1[:, :, None, :]
    x1 = (v1 * v1).sum(dim=-1)[:, :, None]
    x2, x3 = (v2 * v2).sum(dim=-1), (v3 * v3).sum(dim=-1)
    inside = row["inside"][:, :, None] & _take(row["inside"], partner) & (x3 <= cutoff2) & (x3 > 0)
    weight = torch.where(inside, weight, 0.0)
    x3 = torch.where(inside, x3, 1.0)  # empty slots and coincident points: harmless values
    c6_jk, r0_jk = pair(
        row["receiver"][:, :, None].expand_as(partner), _take(row["receiver"], partner)
    )
    c6_j, c6_k = row["c6"][:, :, None], _take(row["c6"], partner)
    c9 = (c6_j * c6_k * c6_jk).sqrt()
    r0 = row["r0"][:, :, None] * _take(row["r0"], partner) * r0_jk
    damp, damp_slope, ang, ang_slopes = _shape(x1, x2, x3, r0, exponent)
    scale = c9 * weight
    energy = scale * damp * ang
    # d(energy)/d(x_m), x_m the squared sides (centre-j, centre-k, j-k).
    s1, s2, s3 = (scale * (damp_slope / x * ang + damp * a)
                  for x, a in zip((x1, x2, x3), ang_slopes, strict=True))  # fmt: skip
    c6_share = row["c6_slope"][:, :, None] / c6_j + _take(row["c6_slope"], partner) / c6_k
    cn_slope = 0.5 * energy * c6_share
    # x1 = |r_j - r_i|^2: moving the centre by dr changes it by -2 v1 . dr.
    s1_slot = s1.sum(dim=2)
    flat2, flat3 = v2.reshape(n_atoms, -1, 3), v3.reshape(n_atoms, -1, 3)
    s2_flat, s3_flat = s2.reshape(n_atoms, 1, -1), s3.reshape(n_atoms, 1, -1)
    force = (s1_slot[..., None] * v1).sum(dim=1) + torch.bmm(s2_flat, flat2)[:, 0]
    strain = (
        torch.bmm((s1_slot[..., None] * v1).transpose(1, 2), v1)
        + torch.bmm((s2_flat.transpose(1, 2) * flat2).transpose(1, 2), flat2)
        + torch.bmm((s3_flat.transpose(1, 2) * flat3).transpose(1, 2), flat3)
    )
    return [
        energy.sum(dim=(1, 2)) / 3.0,
        cn_slope.sum(dim=(1, 2)),
        2.0 * force,
        (2.0 / 3.0) * strain.reshape(n_atoms, 9),
    ]


def _shape(
    x1: torch.Tensor, x2: torch.Tensor, x3: torch.Tensor, r0: torch.Tensor, exponent: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """The damping and angular factor of triangles with squared sides x1, x2, x3, and their
    slopes: damp, x_m d(damp)/d(x_m) (the same for every side), ang, d(ang)/d(x_m)."""
    product = x1 * x2 * x3
    mean = RADIUS_SCALE / (product.sqrt() / r0) ** (1.0 / 3.0)
    h = 6.0 * mean**exponent
    damp = 1.0 / (1.0 + h)
    damp_slope = exponent / 6.0 * damp * damp * h  # h goes as product^(-exponent/6)
    t1, t2, t3 = x3 + x1 - x2, x1 + x2 - x3, x2 + x3 - x1
    angular = t1 * t2 * t3
    root = product.sqrt() * product  # product^(3/2)
    ang = (0.375 * angular / product + 1.0) / root
    tail = 2.5 * 0.375 * angular / product + 1.5
    angular_slopes = (t2 * t3 + t1 * t3 - t1 * t2, t1 * t3 + t1 * t2 - t2 * t3,
                      t1 * t2 + t2 * t3 - t1 * t3)  # fmt: skip
    ang_slopes = [(0.375 * a / product - tail / x) / root
                  for a, x in zip(angular_slopes, (x1, x2, x3), strict=True)]  # fmt: skip
    return damp, damp_slope, ang, ang_slopes
