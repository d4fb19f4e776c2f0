"""Device neighbour list with a Verlet skin and fixed capacities, safe to capture in a CUDA graph.

A `NeighbourList` is planned once for a `State` on the host (method, bin grid, stencil of
periodic images, buffer sizes with headroom); after that `build`, `update` and `cutoff_edges`
are device work only, with shapes fixed by the plan. More pairs or a fuller bin than planned set
``edges.overflow``: nothing is silently truncated (`fastmace.dynamics.overflow.regrow` grows the
list). The method, the skin test, measurements and the libraries evaluated:
docs/design/neighbour-list.md.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fastmace.dynamics.edges import Edges, edge_vectors, per_system_matmul, systems_of_atoms
from fastmace.dynamics.fusion import fusible
from fastmace.dynamics.state import POSITION_DTYPE, State
from fastmace.vocabulary import CUTOFF_HEADROOM, NEIGHBOUR_HEADROOM

METHODS = ("auto", "dense", "binned")
DEFAULT_CELL_MARGIN = 0.05  # bins are planned this much wider, so a cell may shrink by ~5 %
DEFAULT_CHUNK_CANDIDATES = 1 << 24  # candidate pairs examined at once (~2 GB of scratch)


@dataclass(frozen=True)
class _Grid:
    """The static plan: per-system bin grids and one stencil of bin offsets for all systems."""

    method: str
    periodic: torch.Tensor  # (S, 3) bool
    open_rows: torch.Tensor  # (S, 3, 3) basis rows used along open directions
    bins: torch.Tensor  # (S, 3) int64 bins per direction
    width: torch.Tensor  # (S, 3) float64 bin width in fractional units
    origin: torch.Tensor  # (S, 3) float64 grid start in fractional units (0 when periodic)
    first_bin: torch.Tensor  # (S,) int64 index of each system's first bin
    n_bins: int
    stencil: torch.Tensor  # (K, 3) int64 bin offsets every atom examines
    reach: torch.Tensor  # (S, 3) float64 fractional distance the stencil covers
    checked: torch.Tensor  # (S, 3) bool directions where the stencil must cover the radius
    max_image: torch.Tensor  # (S, 3) float64 largest |image| a stencil offset can produce


@dataclass(frozen=True)
class _Found:
    """The result of one search: new edge buffers plus what the skin test needs."""

    edge_index: torch.Tensor
    unit_shifts: torch.Tensor
    mask: torch.Tensor
    count: torch.Tensor
    overflow: torch.Tensor
    offsets: torch.Tensor  # (N, 3) lattice offsets that wrapped each atom into its cell
    max_occupancy: torch.Tensor  # () most atoms seen in one bin
    stencil_broken: torch.Tensor  # () the cell has outgrown the planned stencil


class NeighbourList:
    """Fixed-capacity neighbour list with a skin for one batched `State`.

    Args:
        state: the state to plan for (its cells, boundary conditions and atom layout).
        cutoff: the model's cutoff in Å.
        skin: Verlet buffer in Å; edges are stored out to ``cutoff + skin``.
        capacity: edge buffer size; by default the initial number of edges times ``headroom``.
        cutoff_capacity: size of the buffer of pairs within the cutoff (`cutoff_edges`, what
            the model sees); by default their initial number times ``cutoff_headroom``.
        bin_capacity: atoms per bin; by default the initial fullest bin times ``headroom``.
        method: "dense", "binned" or "auto" (fewer candidate pairs wins).
        headroom: factor applied to the initial needs when sizing buffers.
        cutoff_headroom: the same for the buffer of pairs within the cutoff.
        cell_margin: relative shrinkage of the cell the bin grid tolerates before overflowing.
        chunk_candidates: candidate pairs examined at once; bounds the scratch memory.

    Planning reads the state back to the host; do it outside the captured step.
    """

    def __init__(
        self,
        state: State,
        cutoff: float,
        skin: float = 0.5,
        capacity: int | None = None,
        *,
        cutoff_capacity: int | None = None,
        bin_capacity: int | None = None,
        method: str = "auto",
        headroom: float = NEIGHBOUR_HEADROOM,
        cutoff_headroom: float = CUTOFF_HEADROOM,
        cell_margin: float = DEFAULT_CELL_MARGIN,
        chunk_candidates: int = DEFAULT_CHUNK_CANDIDATES,
    ) -> None:
        if cutoff <= 0 or skin < 0:
            raise ValueError(f"need cutoff > 0 and skin >= 0, got cutoff={cutoff}, skin={skin}")
        if method not in METHODS:
            raise ValueError(f"unknown neighbour-list method {method!r}; choose from {METHODS}")
        if headroom < 1 or cutoff_headroom < 1:
            raise ValueError(
                f"headrooms must be at least 1, got headroom={headroom}, "
                f"cutoff_headroom={cutoff_headroom}"
            )
        self.cutoff = float(cutoff)
        self.skin = float(skin)
        self.headroom = float(headroom)
        self.cutoff_headroom = float(cutoff_headroom)
        self.cell_margin = float(cell_margin)
        self.chunk_candidates = int(chunk_candidates)
        self.grid, occupancy = _choose_grid(state, self.radius, method, cell_margin, headroom)
        self.method = self.grid.method
        self.bin_capacity = int(bin_capacity or _bin_capacity(self.method, occupancy, headroom))
        if capacity is None:
            capacity = math.ceil(self.required_capacity(state) * headroom) + 8
        self.capacity = int(capacity)
        if cutoff_capacity is None:
            cutoff_capacity = math.ceil(self.required_cutoff_capacity(state) * cutoff_headroom) + 8
        # Even: the model's edges come as pairs, one direction in each half (`cutoff_edges`).
        self.cutoff_capacity = int(cutoff_capacity) + int(cutoff_capacity) % 2
        device = state.device
        self._pair_slots = torch.arange(self.cutoff_capacity // 2, device=device)
        self._peak_cutoff_count = torch.zeros((), dtype=torch.int64, device=device)
        # What the skin test compares against (infinitely far until the first build, so an
        # update before any build rebuilds), and what `grown` reads after an overflow.
        self._ref_positions = torch.full_like(state.positions.detach(), math.inf)
        self._ref_cell = state.cell.detach().clone()
        self._ref_offsets = torch.zeros_like(self._ref_positions)
        self._peak_count = torch.zeros((), dtype=torch.int64, device=device)
        self._peak_occupancy = torch.zeros((), dtype=torch.int64, device=device)
        self._stencil_broken = torch.zeros((), dtype=torch.bool, device=device)
        # Set by `check` when a pair may be missing (no search ran when one was needed).
        self.stale = torch.zeros((), dtype=torch.bool, device=device)
        # (S,) the largest displacement since the last rebuild that a skin test has seen, per
        # system: the engine's guard reads it once per block and resets it (dynamics/guard.py).
        self.largest_move = torch.zeros(state.n_systems, dtype=POSITION_DTYPE, device=device)

    @property
    def peak_count(self) -> int:
        """The most edges a search found since this list was made (a host read)."""
        return int(self._peak_count)

    @property
    def radius(self) -> float:
        """The list radius, cutoff + skin."""
        return self.cutoff + self.skin

    def build(self, state: State) -> Edges:
        """Search from scratch and reset the skin reference; device work only."""
        with torch.no_grad():
            found = self._search(state, self.capacity, self.bin_capacity)
            always = torch.ones((), dtype=torch.bool, device=state.device)
            self._remember(always, state, found)
            return Edges(
                edge_index=found.edge_index,
                unit_shifts=found.unit_shifts,
                mask=found.mask,
                count=found.count,
                overflow=found.overflow,
            )

    def needs_rebuild(self, state: State) -> torch.Tensor:
        """() bool device tensor: could a pair within the cutoff be missing from the list?"""
        with torch.no_grad():
            return _skin_test(
                state, self._ref_cell, self._ref_positions, self._ref_offsets,
                self.grid.max_image, self.largest_move, self.skin,
            )  # fmt: skip

    def update(self, state: State, edges: Edges) -> Edges:
        """Rebuild ``edges`` in place when the skin test asks for it; device work only.

        The search runs every time and its result is selected with ``torch.where``, so the
        call has the same shapes and kernels whatever the data. ``overflow`` only ever grows.
        """
        with torch.no_grad():
            return self._replace(self.needs_rebuild(state), state, edges)

    def rebuild(self, state: State, edges: Edges) -> Edges:
        """Search now and replace ``edges`` in place, needed or not; device work only.

        With `check` on the steps in between, this lets a captured block search every few
        steps instead of every step (the search is most of the list's cost).
        """
        with torch.no_grad():
            return self._replace(
                torch.ones((), dtype=torch.bool, device=state.device), state, edges
            )

    def check(self, state: State) -> None:
        """The skin test without a search: sets `stale` if the list may now miss a pair.

        A block that used `check` and ended with `stale` set is wrong and must be redone with
        more frequent searches (the engine does this). Device work only.
        """
        with torch.no_grad():
            _mark_stale(
                state, self._ref_cell, self._ref_positions, self._ref_offsets,
                self.grid.max_image, self.largest_move, self.skin, self.stale,
            )  # fmt: skip

    def _replace(self, rebuild: torch.Tensor, state: State, edges: Edges) -> Edges:
        found = self._search(state, edges.capacity, self.bin_capacity)
        edges.edge_index.copy_(torch.where(rebuild, found.edge_index, edges.edge_index))
        edges.unit_shifts.copy_(torch.where(rebuild, found.unit_shifts, edges.unit_shifts))
        edges.mask.copy_(torch.where(rebuild, found.mask, edges.mask))
        edges.count.copy_(torch.where(rebuild, found.count, edges.count))
        edges.overflow.copy_(edges.overflow | (rebuild & found.overflow))
        self._remember(rebuild, state, found)
        return edges

    def cutoff_edges(self, state: State, edges: Edges) -> Edges:
        """The pairs of ``edges`` within the cutoff, compacted into `cutoff_capacity` slots.

        This is what the model is given: the skin's extra pairs and the list's headroom would
        otherwise pass through every layer as padding. The result is *mirrored*
        (`Edges.mirrored`): each pair once in the first half, in the direction
        `_first_of_pair` names, and reversed at the same place in the second half, so the
        potential can compute what a pair shares once. Device work only; when more pairs are
        within the cutoff than fit, ``edges.overflow`` is set (the block is redone with a
        larger list, as for any overflow). The result's ``overflow`` is that same tensor.
        """
        with torch.no_grad():
            return _compacted(state, edges, self.cutoff, self._pair_slots, self._peak_cutoff_count)

    def saved(self) -> dict[str, Any]:
        """What a restart keeps so that a resumed run has this very list (:meth:`restore`):
        the grid, the model's edge capacity, the cell margin and the peaks seen. Built again
        from the reference positions with these, the edges fill the same slots of buffers of
        the same sizes, so every sum over them (forces, and the virial over all edges) rounds
        as in the unbroken run."""
        grid = {
            name: (value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value)
            for name, value in vars(self.grid).items()
        }
        # The edge and bin capacities travel beside it, in the restart's "neighbours".
        return {
            "grid": grid,
            "cutoff_capacity": self.cutoff_capacity,
            "cell_margin": self.cell_margin,
            "peaks": {
                "count": int(self._peak_count),
                "cutoff_count": int(self._peak_cutoff_count),
                "occupancy": int(self._peak_occupancy),
                "stencil_broken": bool(self._stencil_broken),
            },
        }

    def restore(self, saved: dict[str, Any]) -> None:
        """Take the grid and peaks of :meth:`saved` (after the capacities were given to the
        constructor): the next build fills the buffers as the saved list did."""
        device = self._peak_count.device
        self.grid = _Grid(**{
            name: (torch.as_tensor(value, device=device) if isinstance(value, np.ndarray)
                   else value)
            for name, value in saved["grid"].items()
        })  # fmt: skip
        self.method = self.grid.method
        peaks = saved["peaks"]
        self._peak_count.fill_(int(peaks["count"]))
        self._peak_cutoff_count.fill_(int(peaks["cutoff_count"]))
        self._peak_occupancy.fill_(int(peaks["occupancy"]))
        self._stencil_broken.fill_(bool(peaks["stencil_broken"]))

    def reference(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions and cells of the last rebuild, from which the skin is measured.

        A restart stores them: building from them again gives exactly the same edge list, so
        a resumed run continues bit for bit.
        """
        return self._ref_positions, self._ref_cell

    def required_capacity(self, state: State) -> int:
        """Number of edges within cutoff + skin for ``state``; reads back to the host."""
        with torch.no_grad():
            occupancy = int(_locate(self.grid, state)[3].max())
            return int(self._search(state, 0, max(occupancy, 1)).count)

    def required_cutoff_capacity(self, state: State) -> int:
        """Number of pairs within the cutoff (the model's edges) for ``state``; reads back."""
        with torch.no_grad():
            occupancy = max(int(_locate(self.grid, state)[3].max()), 1)
            found = self._search(state, max(self.required_capacity(state), 1), occupancy)
            every = Edges(found.edge_index, found.unit_shifts, found.mask, found.count,
                          found.overflow)  # fmt: skip
            return int(_within_cutoff(state, every, self.cutoff).sum())

    def grown(self, state: State) -> NeighbourList:
        """A new list after an overflow, with the exceeded capacities enlarged.

        Reads the peaks seen since this list was made back to the host, so call it between
        blocks, never inside one. The grid is re-planned for ``state``'s cell, with a wider
        margin if the cell had outgrown the old one.
        """
        peak_count = int(self._peak_count)
        peak_cutoff_count = int(self._peak_cutoff_count)
        peak_occupancy = int(self._peak_occupancy)
        margin = self.cell_margin
        if bool(self._stencil_broken):
            margin = 2 * margin + 0.05
        fresh = NeighbourList(
            state,
            self.cutoff,
            self.skin,
            method=self.method,
            headroom=self.headroom,
            cutoff_headroom=self.cutoff_headroom,
            cell_margin=margin,
            chunk_candidates=self.chunk_candidates,
        )
        capacity = max(fresh.capacity, self.capacity)
        if peak_count > self.capacity:
            capacity = max(capacity, math.ceil(peak_count * self.headroom))
        cutoff_capacity = max(fresh.cutoff_capacity, self.cutoff_capacity)
        if peak_cutoff_count > self.cutoff_capacity:
            cutoff_capacity = max(
                cutoff_capacity, math.ceil(peak_cutoff_count * self.cutoff_headroom)
            )
        bin_capacity = max(fresh.bin_capacity, self.bin_capacity)
        if peak_occupancy > self.bin_capacity:
            bin_capacity = max(bin_capacity, math.ceil(peak_occupancy * self.headroom))
        return NeighbourList(
            state,
            self.cutoff,
            self.skin,
            capacity,
            cutoff_capacity=cutoff_capacity,
            bin_capacity=bin_capacity,
            method=self.method,
            headroom=self.headroom,
            cutoff_headroom=self.cutoff_headroom,
            cell_margin=margin,
            chunk_candidates=self.chunk_candidates,
        )

    def _remember(self, rebuilt: torch.Tensor, state: State, found: _Found) -> None:
        """Keep the skin reference and the overflow diagnostics of a (selected) rebuild."""
        self._ref_positions.copy_(torch.where(rebuilt, state.positions, self._ref_positions))
        self._ref_cell.copy_(torch.where(rebuilt, state.cell, self._ref_cell))
        self._ref_offsets.copy_(torch.where(rebuilt, found.offsets, self._ref_offsets))
        zero = torch.zeros_like(self._peak_count)
        self._peak_count.copy_(
            torch.maximum(self._peak_count, torch.where(rebuilt, found.count, zero))
        )
        self._peak_occupancy.copy_(
            torch.maximum(self._peak_occupancy, torch.where(rebuilt, found.max_occupancy, zero))
        )
        self._stencil_broken.copy_(self._stencil_broken | (rebuilt & found.stencil_broken))

    def _search(self, state: State, capacity: int, bin_capacity: int) -> _Found:
        """All pairs within cutoff + skin, compacted into buffers of ``capacity`` edges."""
        grid = self.grid
        positions, cell, system = state.positions, state.cell, state.system
        device = positions.device
        wrapped, offsets, coord, counts, atom_bin = _locate(grid, state)
        table = _bin_table(atom_bin, counts, bin_capacity)
        max_occupancy = counts.max()

        n_atoms = positions.shape[0]
        per_atom = grid.stencil.shape[0] * bin_capacity
        chunk = max(1, self.chunk_candidates // per_atom)
        slots = torch.arange(capacity, device=device)
        senders = torch.zeros(capacity, dtype=torch.int64, device=device)
        receivers = torch.zeros(capacity, dtype=torch.int64, device=device)
        shifts = torch.zeros(capacity, 3, dtype=POSITION_DTYPE, device=device)
        count = torch.zeros((), dtype=torch.int64, device=device)
        for start in range(0, n_atoms, chunk):
            stop = min(start + chunk, n_atoms)
            centre = torch.arange(start, stop, device=device)
            other, image = _candidates(grid, table, coord[start:stop], system[start:stop])
            chunk_systems = None if state.n_systems == 1 else system[start:stop]
            image_vector = per_system_matmul(image, cell, chunk_systems)
            vector = wrapped[other.clamp(min=0)] + image_vector[:, :, None, :]
            vector = vector - wrapped[start:stop, None, None, :]
            itself = (other == centre[:, None, None]) & (image == 0).all(dim=-1)[:, :, None]
            keep = (other >= 0) & ~itself & ((vector * vector).sum(dim=-1) < self.radius**2)

            take, pick, found = _fill_slots(keep.flatten(), slots, count)
            sender = start + pick // per_atom
            receiver = other.flatten()[pick].clamp(min=0)
            image_taken = image.flatten(0, 1)[pick // bin_capacity]
            shift = image_taken - offsets[receiver] + offsets[sender]
            senders = torch.where(take, sender, senders)
            receivers = torch.where(take, receiver, receivers)
            shifts = torch.where(take[:, None], shift, shifts)
            count = count + found

        broken = _stencil_broken(grid, cell, self.radius)
        overflow = (count > capacity) | (max_occupancy > bin_capacity) | broken
        return _Found(
            edge_index=torch.stack([senders, receivers]),
            unit_shifts=shifts,
            mask=slots < count,
            count=count,
            overflow=overflow,
            offsets=offsets,
            max_occupancy=max_occupancy,
            stencil_broken=broken,
        )


@fusible
def _skin_test(
    state: State,
    ref_cell: torch.Tensor,
    ref_positions: torch.Tensor,
    ref_offsets: torch.Tensor,
    max_image: torch.Tensor,
    largest_move: torch.Tensor,
    skin: float,
) -> torch.Tensor:
    """() bool: could a pair be missing, measured from the build's reference? Keeps each
    system's largest move since the build in ``largest_move`` (the guard reads it)."""
    cell_change = state.cell - ref_cell
    moved = state.positions - ref_positions
    # Displacement in the frame of the build's wrapped images, so cell changes count.
    moved = moved - per_system_matmul(ref_offsets, cell_change, systems_of_atoms(state))
    largest = torch.zeros(state.n_systems, dtype=moved.dtype, device=moved.device)
    largest = largest.scatter_reduce(0, state.system, moved.norm(dim=-1), "amax")
    largest_move.copy_(torch.maximum(largest_move, largest))
    image_change = (max_image * cell_change.norm(dim=-1)).sum(dim=-1)
    return (2 * largest + image_change >= skin).any()


@fusible
def _mark_stale(
    state: State,
    ref_cell: torch.Tensor,
    ref_positions: torch.Tensor,
    ref_offsets: torch.Tensor,
    max_image: torch.Tensor,
    largest_move: torch.Tensor,
    skin: float,
    stale: torch.Tensor,
) -> None:
    """`_skin_test` folded into the ``stale`` flag (one fused computation when compiled)."""
    needed = _skin_test(state, ref_cell, ref_positions, ref_offsets, max_image, largest_move, skin)
    stale.copy_(stale | needed)


@fusible
def _compacted(
    state: State, edges: Edges, cutoff: float, pair_slots: torch.Tensor, peak: torch.Tensor
) -> Edges:
    """`NeighbourList.cutoff_edges`' work: the mirrored pairs within ``cutoff`` in
    ``pair_slots``; raises ``edges.overflow`` when they do not fit and keeps the largest
    count in ``peak``."""
    keep = _within_cutoff(state, edges, cutoff) & _first_of_pair(edges)
    none = torch.zeros((), dtype=torch.int64, device=state.device)
    take, pick, pairs = _fill_slots(keep, pair_slots, none)
    edges.overflow.copy_(edges.overflow | (pairs > pair_slots.shape[0]))
    found = 2 * pairs
    peak.copy_(torch.maximum(peak, found))
    index = torch.where(take, edges.edge_index[:, pick], 0)
    shifts = torch.where(take[:, None], edges.unit_shifts[pick], 0.0)
    return Edges(
        edge_index=torch.cat([index, index.flip(0)], dim=1),
        unit_shifts=torch.cat([shifts, -shifts]),
        mask=torch.cat([take, take]),
        count=found,
        overflow=edges.overflow,
        mirrored=True,
    )


def _fill_slots(
    keep: torch.Tensor, slots: torch.Tensor, filled: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Compaction without data-dependent shapes.

    ``keep`` (M,) marks candidates; ``filled`` of the ``slots`` are taken already. Slot ``e``
    takes the kept candidate of overall rank ``e + 1``, so these candidates own the ranks
    ``filled + 1 .. filled + found``. Returns which slots take one here, the candidate index
    for each slot (valid where taken) and ``found``, the kept count (which may exceed the slots).
    """
    rank = torch.cumsum(keep, dim=0)
    wanted = slots - filled + 1
    take = (wanted >= 1) & (wanted <= rank[-1])
    pick = torch.searchsorted(rank, wanted.clamp(min=1)).clamp(max=rank.numel() - 1)
    return take, pick, rank[-1]


def _first_of_pair(edges: Edges) -> torch.Tensor:
    """(E,) bool: the direction of its pair that `cutoff_edges` keeps.

    A full list holds every pair twice, (i, j, s) and (j, i, -s); this picks i < j, and for an
    atom's own periodic image (i == i) the shift whose first non-zero component is positive.
    Shifts are whole numbers, so the comparisons are exact.
    """
    sender, receiver = edges.edge_index[0], edges.edge_index[1]
    x, y, z = edges.unit_shifts.unbind(dim=-1)
    positive = (x > 0) | ((x == 0) & ((y > 0) | ((y == 0) & (z > 0))))
    return (sender < receiver) | ((sender == receiver) & positive)


def _within_cutoff(state: State, edges: Edges, cutoff: float) -> torch.Tensor:
    """(E,) bool: real edges shorter than ``cutoff`` (float64, as the potential measures)."""
    vectors = edge_vectors(state, edges.edge_index, edges.unit_shifts)
    return edges.mask & ((vectors * vectors).sum(dim=-1) < cutoff * cutoff)


def _reciprocal(basis: torch.Tensor) -> torch.Tensor:
    """(S, 3, 3) inverse of row bases: column k is the k-th reciprocal vector.

    Written with cross products rather than ``linalg.inv``, whose error check synchronises.
    """
    a, b, c = basis.unbind(dim=-2)
    cross = torch.stack(
        [torch.linalg.cross(b, c), torch.linalg.cross(c, a), torch.linalg.cross(a, b)], dim=-1
    )
    volume = (a * cross[..., 0]).sum(dim=-1)
    return cross / volume[:, None, None]


def _current_basis(grid: _Grid, cell: torch.Tensor) -> torch.Tensor:
    """Lattice vectors along periodic directions, the planned fixed rows along open ones."""
    return torch.where(grid.periodic[..., None], cell, grid.open_rows)


def _stencil_broken(grid: _Grid, cell: torch.Tensor, radius: float) -> torch.Tensor:
    """() bool: does the cell now need more bins than the stencil reaches to cover ``radius``?"""
    needed = radius * _reciprocal(_current_basis(grid, cell)).norm(dim=-2)
    return (grid.checked & (grid.reach < needed)).any()


def _locate(grid: _Grid, state: State) -> tuple[torch.Tensor, ...]:
    """Wrap atoms into their cells and put them in bins.

    Returns wrapped positions (N, 3), the lattice offsets removed (N, 3, integer-valued
    float64), bin coordinates (N, 3), atoms per bin (n_bins,) and each atom's bin (N,).
    """
    positions, cell, system = state.positions, state.cell, state.system
    reciprocal = _reciprocal(_current_basis(grid, cell))
    atom_systems = systems_of_atoms(state)
    fractional = per_system_matmul(positions, reciprocal, atom_systems)
    periodic = grid.periodic[system]
    offsets = torch.where(periodic, torch.floor(fractional), torch.zeros_like(fractional))
    fractional = fractional - offsets
    wrapped = positions - per_system_matmul(offsets, cell, atom_systems)
    bins = grid.bins[system]
    coord = torch.floor((fractional - grid.origin[system]) / grid.width[system])
    # Clamp after the integer conversion too: rounding (and NaN) must never index outside.
    coord = torch.minimum(coord.clamp(min=0).long().clamp(min=0), bins - 1)
    atom_bin = grid.first_bin[system] + (coord[:, 0] * bins[:, 1] + coord[:, 1]) * bins[:, 2]
    atom_bin = atom_bin + coord[:, 2]
    counts = torch.zeros(grid.n_bins, dtype=torch.int64, device=positions.device)
    counts = counts.scatter_add(0, atom_bin, torch.ones_like(atom_bin))
    return wrapped, offsets, coord, counts, atom_bin


def _bin_table(atom_bin: torch.Tensor, counts: torch.Tensor, capacity: int) -> torch.Tensor:
    """(n_bins, capacity) atom indices per bin, -1 where empty; extra atoms go to a dump slot."""
    n_bins = counts.shape[0]
    order = torch.argsort(atom_bin, stable=True)
    sorted_bin = atom_bin[order]
    first = torch.cumsum(counts, dim=0) - counts
    rank = torch.arange(order.shape[0], device=order.device) - first[sorted_bin]
    slot = torch.where(rank < capacity, sorted_bin * capacity + rank, n_bins * capacity)
    table = torch.full((n_bins * capacity + 1,), -1, dtype=torch.int64, device=order.device)
    table = table.scatter(0, slot, order)
    return table[:-1].view(n_bins, capacity)


def _candidates(
    grid: _Grid, table: torch.Tensor, coord: torch.Tensor, system: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every atom's candidate partners in its stencil of bins.

    Returns partner indices (n, K, bin_capacity), -1 where there is none, and the lattice
    image (n, K, 3, float64) of the bin each stencil offset lands in.
    """
    bins = grid.bins[system][:, None, :]
    near = coord[:, None, :] + grid.stencil
    periodic = grid.periodic[system][:, None, :]
    image = torch.where(periodic, torch.div(near, bins, rounding_mode="floor"), 0)
    near = near - image * bins
    inside = ((near >= 0) & (near < bins)).all(dim=-1)
    bin_index = (near[..., 0] * bins[..., 1] + near[..., 1]) * bins[..., 2] + near[..., 2]
    bin_index = grid.first_bin[system][:, None] + bin_index
    other = table[torch.where(inside, bin_index, 0)]
    other = torch.where(inside[..., None], other, -1)
    return other, image.to(POSITION_DTYPE)


# Host-side planning: numpy on copies of the state, run once per list.


# Bins narrower than the radius (a half or a third of it, with a wider stencil of bins) hug
# the sphere of neighbours more closely: for a long radius in a box only a few radii wide
# (D3's 23 Å list in a 67 Å cell) they examine 3.7 times fewer candidates. They are taken only
# when they cut the candidates by this factor at least, so a short list keeps its coarse grid.
FINER_BIN_SCALES = (0.5, 1.0 / 3.0)
FINER_BINS_MIN_GAIN = 1.5


def _choose_grid(
    state: State, radius: float, method: str, margin: float, headroom: float
) -> tuple[_Grid, int]:
    """Plan the grid for ``method``, or for both and keep the cheaper one when "auto"; a binned
    grid of bins narrower than the radius replaces the plain one if it is much cheaper."""
    methods = ("dense", "binned") if method == "auto" else (method,)
    best = None
    for name in methods:
        scales = (1.0, *FINER_BIN_SCALES) if name == "binned" else (1.0,)
        for scale in scales:
            grid = _plan_grid(state, radius, name, margin, scale)
            occupancy = int(_locate(grid, state)[3].max())
            cost = grid.stencil.shape[0] * _bin_capacity(name, occupancy, headroom)
            needed = 1.0 if scale == 1.0 else FINER_BINS_MIN_GAIN
            if best is None or cost * needed < best[0]:
                best = (cost, grid, occupancy)
    return best[1], best[2]


def _bin_capacity(method: str, occupancy: int, headroom: float) -> int:
    """Atoms per bin: exact for dense (a system's atoms never change bin), else with headroom."""
    if method == "dense":
        return max(occupancy, 1)
    return max(math.ceil(occupancy * headroom), occupancy + 2)


def _plan_grid(
    state: State, radius: float, method: str, margin: float, scale: float = 1.0
) -> _Grid:
    """Bins (for "binned", at least ``scale`` times the radius wide) and stencil for every
    system of ``state``; reads the state back to the host."""
    cells = state.cell.detach().cpu().numpy()
    pbc = state.pbc.detach().cpu().numpy().astype(bool)
    positions = state.positions.detach().cpu().numpy()
    system = state.system.detach().cpu().numpy()
    reach = radius * (1 + margin)  # plan wider bins, so a shrinking cell stays covered
    n_systems = cells.shape[0]
    open_rows = np.zeros((n_systems, 3, 3))
    bins = np.ones((n_systems, 3), dtype=np.int64)
    width = np.ones((n_systems, 3))
    origin = np.zeros((n_systems, 3))
    half_width = np.zeros((n_systems, 3), dtype=np.int64)
    for index in range(n_systems):
        basis, open_rows[index] = _basis(cells[index], pbc[index], index)
        reciprocal = np.linalg.inv(basis)
        fractional = positions[system == index] @ reciprocal
        plan = _SystemGrid(pbc[index], np.linalg.norm(reciprocal, axis=0), fractional, reach)
        if method == "binned":
            plan.split(scale)
        bins[index], width[index], origin[index], half_width[index] = plan.arrays()

    reach_bins = half_width.max(axis=0)  # one stencil for all systems: the widest one
    stencil = np.array(list(itertools.product(*(range(-m, m + 1) for m in reach_bins))))
    checked = pbc | (bins > 1)
    max_image = np.where(pbc, np.ceil(reach_bins / bins), 0)
    first_bin = np.concatenate([[0], np.cumsum(bins.prod(axis=1))[:-1]])
    device = state.device

    def tensor(array: np.ndarray, dtype: torch.dtype = POSITION_DTYPE) -> torch.Tensor:
        return torch.as_tensor(np.ascontiguousarray(array), dtype=dtype, device=device)

    return _Grid(
        method=method,
        periodic=tensor(pbc, torch.bool),
        open_rows=tensor(open_rows),
        bins=tensor(bins, torch.int64),
        width=tensor(width),
        origin=tensor(origin),
        first_bin=tensor(first_bin, torch.int64),
        n_bins=int(bins.prod(axis=1).sum()),
        stencil=tensor(stencil, torch.int64),
        reach=tensor(width * reach_bins),
        checked=tensor(checked, torch.bool),
        max_image=tensor(max_image),
    )


class _SystemGrid:
    """One system's bins, planned in fractional coordinates of its basis."""

    def __init__(
        self, pbc: np.ndarray, reciprocal_norms: np.ndarray, fractional: np.ndarray, reach: float
    ) -> None:
        self.pbc = pbc
        # Fractional distance that ``reach`` Å can span along each direction.
        self.span = reach * reciprocal_norms
        self.n_atoms = fractional.shape[0]
        low = fractional.min(axis=0) if self.n_atoms else np.zeros(3)
        high = fractional.max(axis=0) if self.n_atoms else np.zeros(3)
        self.origin = np.where(pbc, 0.0, low)
        self.extent = np.where(pbc, 1.0, high - low)
        self.bins = np.ones(3, dtype=np.int64)
        self.width = np.ones(3)

    def split(self, scale: float = 1.0) -> None:
        """Bins at least ``reach * scale`` wide; coarser until there are not far more bins than
        atoms (a sparse gas or an open system with a large extent)."""
        limit = 2 * self.n_atoms + 8
        while True:
            along = np.maximum(self.span * scale, 1e-300)
            self.bins = np.where(
                self.pbc,
                np.maximum(1, np.floor(1.0 / along)),
                np.maximum(1, np.ceil(self.extent / along)),
            ).astype(np.int64)
            self.width = np.where(self.pbc, 1.0 / self.bins, along)
            if self.bins.prod() <= limit:
                return
            scale *= max(1.1, (self.bins.prod() / limit) ** (1 / 3))

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Bins, width, origin and the stencil half-width each direction needs."""
        half_width = np.ceil(self.span / self.width - 1e-12).astype(np.int64)
        # An open direction with one bin needs no neighbours: everything shares that bin.
        half_width = np.where(~self.pbc & (self.bins == 1), 0, np.maximum(half_width, 1))
        return self.bins, self.width, self.origin, half_width


def _basis(cell: np.ndarray, pbc: np.ndarray, index: int) -> tuple[np.ndarray, np.ndarray]:
    """A system's basis rows and the fixed rows used along its open directions.

    Open directions use unit vectors perpendicular to the periodic lattice vectors, so an
    open direction's cell vector (possibly zero, as for molecules) never matters.
    """
    lengths = np.linalg.norm(cell, axis=1)
    for axis in range(3):
        if pbc[axis] and lengths[axis] < 1e-9:
            raise ValueError(
                f"system {index} is periodic along axis {axis} but its lattice vector is "
                f"{cell[axis].tolist()}; give it a cell or set pbc False along that axis"
            )
    lattice = [cell[axis] for axis in range(3) if pbc[axis]]
    if len(lattice) == 2:
        normals = [_unit(np.cross(*lattice))]
    elif len(lattice) == 1:
        (vector,) = lattice
        helper = np.eye(3)[np.argmin(np.abs(vector))]
        first = _unit(np.cross(vector, helper))
        normals = [first, _unit(np.cross(vector, first))]
    else:
        normals = list(np.eye(3))
    open_rows = np.eye(3)
    for axis in range(3):
        if not pbc[axis]:
            open_rows[axis] = normals.pop(0)
    basis = np.where(pbc[:, None], cell, open_rows)
    scale = np.prod(np.linalg.norm(basis, axis=1))
    if not abs(np.linalg.det(basis)) > 1e-9 * scale:
        raise ValueError(
            f"system {index} has a degenerate periodic cell {cell.tolist()} (pbc "
            f"{pbc.tolist()}): its periodic lattice vectors are not independent"
        )
    return basis, open_rows


def _unit(vector: np.ndarray) -> np.ndarray:
    """``vector`` scaled to length one (left alone if zero)."""
    norm = np.linalg.norm(vector)
    return vector / norm if norm > 0 else vector
